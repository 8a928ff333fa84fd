"""Framework adapters, installed as ``pccl_torch.integrations``: each translates one framework's call
(torch.distributed backend, DeepSpeed comm, FSDP custom all-gather/reduce-scatter, DDP comm hook) into
one call of :mod:`pccl_torch.api`.

Each adapter is an attribute after ``import pccl_torch`` (``pccl_torch.integrations.ddp.allreduce_hook``),
imported at its first use: none imports its framework before it is used (``deepspeed`` only in
``deepspeed.force_backend``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

SUBMODULES = ("ddp", "deepspeed", "fsdp", "torch_backend")


def __getattr__(name: str) -> ModuleType:
    """Import an adapter at its first access as an attribute (PEP 562)."""
    if name in SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *SUBMODULES})
