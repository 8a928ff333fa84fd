"""DeepSpeed with pccl.

DeepSpeed's launcher has no ``--comm_backend`` flag: training scripts declare their flags. With

    parser = argparse.ArgumentParser()
    pccl_torch.integrations.deepspeed.add_comm_arguments(parser)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend=args.comm_backend)

``--comm_backend pccl`` makes pccl torch.distributed's default backend, so every collective of ZeRO-1/2/3
(on every group DeepSpeed creates, with every op) goes through pccl's process group. Launch with DeepSpeed's
own launcher (``deepspeed --num_gpus 4 train.py --comm_backend pccl``) or torchrun, where pccl's levels are
torch groups (``pccl_torch.launcher``), or under MPI (``mpiexec -n 4 python train.py --comm_backend pccl``:
DeepSpeed discovers rank, world size and the rendezvous address from MPI). For an unchanged script,
``python -m pccl_torch.run train.py ...`` makes ``pccl`` the backend of every ``deepspeed.init_distributed`` /
``deepspeed.initialize`` call.

``import pccl_torch`` registers ``pccl_torch.gloo_exit.drain_gloo_workers`` at exit: the teardown abort of DeepSpeed's
gloo groups that its module docstring explains.
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path

BACKENDS = ("nccl", "gloo", "mpi", "pccl")
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "deepspeed_allreduce_buffer"  # DeepSpeed's ops/csrc/cpu/comm/shm.cpp, SHM_BUFFER_NAME


def add_comm_arguments(parser: argparse.ArgumentParser, default: str = "pccl") -> argparse.ArgumentParser:
    """Add ``--comm_backend {nccl,gloo,mpi,pccl}`` to a training script's parser, and ``--local_rank`` (which
    DeepSpeed's launcher passes to every script) when the parser has none."""
    parser.add_argument("--comm_backend", choices=BACKENDS, default=default,
                        help=f"torch.distributed backend for deepspeed.init_distributed (default {default})")
    if not any("--local_rank" in action.option_strings for action in parser._actions):
        parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)),
                            help="set by DeepSpeed's launcher (default: $LOCAL_RANK)")
    return parser


def force_backend(backend: str = "pccl") -> None:
    """Make ``deepspeed.init_distributed`` use ``backend`` whatever its caller passes (zero-code route)."""
    import deepspeed
    import deepspeed.comm.comm as ds_comm

    original = ds_comm.init_distributed
    if getattr(original, "__pccl_forced__", None) == backend:
        return

    @functools.wraps(original)
    def init_distributed(*args, **kwargs):
        kwargs.pop("dist_backend", None)
        if args:
            args = args[1:]
        result = original(backend, *args, **kwargs)
        release_shared_memory()
        return result

    init_distributed.__pccl_forced__ = backend  # type: ignore[attr-defined]
    ds_comm.init_distributed = init_distributed
    deepspeed.comm.init_distributed = init_distributed
    deepspeed.init_distributed = init_distributed


def shared_memory_name(rank: int, env: dict[str, str] | None = None) -> str:
    """The name DeepSpeed's CPU backend gives ``rank``'s shared-memory segment: ``<prefix>_<uid>_<addr>_<port>_<rank>``
    from ``MASTER_ADDR`` and ``MASTER_PORT`` as it reads them."""
    env = os.environ if env is None else env
    return f"{SHM_PREFIX}_{os.getuid()}_{env.get('MASTER_ADDR', '')}_{env.get('MASTER_PORT', '')}_{rank}"


def release_shared_memory() -> bool:
    """Unlink this rank's DeepSpeed shared-memory segment once every rank has mapped it; call after
    ``deepspeed.init_distributed``. Returns whether there was one to unlink.

    On the CPU accelerator with every rank on one machine (``LOCAL_SIZE`` equal to the world size), DeepSpeed
    creates a segment of about 66 MB a rank in ``/dev/shm`` for its inference all-reduce, maps every other rank's,
    and never unlinks them: each run leaves its segments behind until the machine runs out of memory. A rank's
    ``init_distributed`` returns only after it mapped all the others, so after a barrier the names are no longer
    needed; the mappings stay valid until the processes exit.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        return False
    dist.barrier()
    try:
        (SHM_DIR / shared_memory_name(dist.get_rank())).unlink()
    except FileNotFoundError:
        return False
    return True

