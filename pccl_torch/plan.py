"""Algorithm names as users write them, and how each one runs on a communicator.

- a family name (``ring``, ``bruck``, ``rabenseifner``, ...): flat, over the world MPI communicator;
- ``mpi``: the MPI library's own collective over all ranks; ``vendor``: torch.distributed's
  (NCCL on GPUs, gloo on CPU) over all ranks;
- ``hier:<name>``: hierarchical (vendor inside the node, ``<name>`` between nodes), where ``<name>``
  is a family name or ``mpi``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pccl_torch import algorithms
from pccl_torch.algorithms import Algorithm, Blocks, Collective, hierarchical
from pccl_torch.ops import ReduceOp

if TYPE_CHECKING:
    from pccl_torch.communicator import Communicator

HIER_PREFIX = "hier:"
_NATIVE_ON = {"mpi": "world", "vendor": "vendor"}


def family(collective: Collective) -> list[str]:
    """The hand-written schedules of ``collective`` (everything registered but the native wrapper)."""
    return [name for name in algorithms.names(collective) if name != "native"]


def valid_names(collective: Collective) -> list[str]:
    """Every name ``algorithm=`` accepts for ``collective``."""
    flat = family(collective) + list(_NATIVE_ON)
    return flat + [HIER_PREFIX + name for name in family(collective) + ["mpi"]]


@dataclass(frozen=True, slots=True)
class Plan:
    """A resolved algorithm name: the schedule and where it runs."""

    collective: Collective
    name: str
    schedule: Algorithm
    hierarchical: bool
    transport: str  # "world" or "vendor" for flat plans; the inter level is always MPI

    def run_all_gather(self, comm: "Communicator", out: torch.Tensor, inp: torch.Tensor) -> None:
        if self.hierarchical:
            hierarchical.all_gather(comm.intra, comm.inter, self.schedule.fn, out, inp)
        else:
            t = getattr(comm, self.transport)
            self.schedule.fn(t, out, inp, Blocks.even(t.size, inp.numel()))

    def run_reduce_scatter(self, comm: "Communicator", inp: torch.Tensor, out: torch.Tensor, op: ReduceOp) -> None:
        if self.hierarchical:
            hierarchical.reduce_scatter(comm.intra, comm.inter, self.schedule.fn, inp, out, op)
        else:
            t = getattr(comm, self.transport)
            self.schedule.fn(t, inp, out, Blocks.even(t.size, out.numel()), op)

    def run_all_reduce(self, comm: "Communicator", buf: torch.Tensor, op: ReduceOp) -> None:
        if self.hierarchical:
            hierarchical.all_reduce(comm.intra, comm.inter, self.schedule.fn, buf, op)
        else:
            self.schedule.fn(getattr(comm, self.transport), buf, op)


def resolve(collective: Collective, name: str) -> Plan:
    """The :class:`Plan` of ``name``; ``ValueError`` listing the valid names if it is unknown."""
    if not isinstance(name, str):
        raise TypeError(f"algorithm must be a string, got {type(name).__name__}")
    return _resolve(collective, name)


@functools.lru_cache(maxsize=512)
def _resolve(collective: Collective, name: str) -> Plan:
    """Cached: every call resolves its algorithm's name (plans are immutable; unknown names raise)."""
    hier = name.startswith(HIER_PREFIX)
    inner = name[len(HIER_PREFIX):] if hier else name
    if inner in _NATIVE_ON and not (hier and inner == "vendor"):
        return Plan(collective, name, algorithms.get(collective, "native"), hier, _NATIVE_ON[inner])
    if inner in family(collective):
        return Plan(collective, name, algorithms.get(collective, inner), hier, "world")
    raise ValueError(f"unknown {collective} algorithm {name!r}; valid: {', '.join(valid_names(collective))}")


ALGO_ENV = "PCCL_ALGO"


def env_overrides() -> dict[str, str]:
    """``PCCL_ALGO=all_reduce:ring,all_gather:bruck`` as a dict; malformed entries raise, naming the valid
    collectives or algorithms. Read when a communicator is created (see ``Communicator.algo_overrides``)."""
    raw = os.environ.get(ALGO_ENV, "").strip()
    if not raw:
        return {}
    overrides = {}
    for entry in raw.split(","):
        collective, sep, name = entry.strip().partition(":")
        if not sep or not name:
            raise ValueError(f"{ALGO_ENV} entry {entry!r} must look like 'all_reduce:ring'")
        if collective not in algorithms.COLLECTIVES:
            raise ValueError(f"{ALGO_ENV} entry {entry!r}: unknown collective {collective!r}; "
                             f"expected one of {', '.join(algorithms.COLLECTIVES)}")
        resolve(collective, name)  # an unknown name fails here, listing the valid ones
        overrides[collective] = name
    return overrides
