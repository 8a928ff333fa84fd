"""DDP communication hook: gradient all-reduce through pccl.

    model = DDP(model)
    model.register_comm_hook(None, pccl_torch.integrations.ddp.allreduce_hook)

``state`` may be a :class:`pccl_torch.Communicator` (or None for the default one from
``pccl_torch.init()``). DDP over a ``pccl`` process group (``process_group=``) needs no hook.

``compressed_allreduce_hook("bf16")`` (or ``"int8"``, ``"fp8"``, ``"lossless"``) sends the gradients
between nodes in that wire format. Unlike torch's ``bf16_compress_hook``, which casts the whole bucket
to bfloat16 and sums in bfloat16 on every hop, only what crosses nodes is encoded, each contribution
once, and sums run in float32; the result is bitwise identical on every rank.
"""

import functools

import torch
import torch.distributed as dist

from pccl_torch import api, compression as wire_formats
from pccl_torch.communicator import Communicator, default_communicator
from pccl_torch.ops import ReduceOp


def allreduce_hook(state: object, bucket: dist.GradBucket, compression: str | None = None
                   ) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's gradients over every rank with pccl (what DDP's default hook computes)."""
    comm = state if isinstance(state, Communicator) else default_communicator()
    work = api.all_reduce(bucket.buffer(), ReduceOp.AVG, async_op=True, comm=comm, compression=compression)
    return work.get_future()


def compressed_allreduce_hook(compression: str):
    """:func:`allreduce_hook` with ``compression`` on the wire between nodes (the format is checked now)."""
    wire_formats.get(compression)
    return functools.partial(allreduce_hook, compression=compression)
