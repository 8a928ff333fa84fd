"""DDP communication hook: gradient all-reduce through pccl.

    model = DDP(model)
    model.register_comm_hook(None, pccl_torch.integrations.ddp.allreduce_hook)

``state`` may be a :class:`pccl_torch.Communicator` (or None for the default one from
``pccl_torch.init()``). DDP over a ``pccl`` process group (``process_group=``) needs no hook.
"""

import torch
import torch.distributed as dist

from pccl_torch import api
from pccl_torch.communicator import Communicator, default_communicator
from pccl_torch.ops import ReduceOp


def allreduce_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's gradients over every rank with pccl (what DDP's default hook computes)."""
    comm = state if isinstance(state, Communicator) else default_communicator()
    work = api.all_reduce(bucket.buffer(), ReduceOp.AVG, async_op=True, comm=comm)
    return work.get_future()
