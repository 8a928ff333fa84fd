"""Algorithm names as users write them, and how each one runs on a communicator.

- a family name (``ring``, ``bruck``, ``rabenseifner``, ...): flat, over the world MPI communicator;
- ``mpi``: the MPI library's own collective over all ranks; ``vendor``: torch.distributed's
  (NCCL on GPUs, gloo on CPU) over all ranks;
- ``hier:<name>``: hierarchical, the device's intra-node library inside each node (MPI's shared-memory
  communicator for CPU tensors, NCCL for CUDA tensors) and ``<name>`` between nodes, where ``<name>`` is a
  family name, ``mpi``, or ``pipelined`` (non-blocking collectives on both levels, the call cut into chunks whose
  intra- and inter-node phases overlap; inside the node the device's library, as for every ``hier:`` name);
- ``hier-<library>:<name>``: the same with the intra-node library forced: ``mpi``, ``gloo`` (CPU tensors)
  or ``nccl`` (CUDA tensors).

With a wire format (``compression=``, ``PCCL_COMPRESSION``) a plan is named ``<name>+<format>``, for
example ``hier:mpi+int8``: the compressed schedules carry what crosses nodes (see :attr:`Plan.compression`).

Plans never look at communicators: they run on anything with the :class:`Levels` attributes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from pccl_torch import algorithms, compression, environment, workspace
from pccl_torch.algorithms import Algorithm, Blocks, Collective, hierarchical, pipelined
from pccl_torch.compression import pipelined as compressed_pipelined
from pccl_torch.compression import schedules as compressed
from pccl_torch.ops import ReduceOp
from pccl_torch.transport.base import Transport
from pccl_torch.transport.torch_group import LIBRARY_BY_DEVICE

HIER_PREFIX = "hier:"
PIPELINED = "pipelined"
INTRA_LIBRARIES = ("mpi", "gloo", "nccl")
"""Intra-node libraries a hierarchical name may force (``hier-gloo:ring``)."""
DEFAULT_INTRA = {"cpu": "mpi", "cuda": "nccl"}
"""The intra-node library of ``hier:<name>`` per device type."""
_NATIVE_ON = {"mpi": "world", "vendor": "vendor"}


class Levels(Protocol):
    """What a plan runs on (a :class:`~pccl_torch.communicator.Communicator`): the flat transports, the
    inter-node MPI communicator of this local rank, and the intra-node transport of each library."""

    world: Transport
    vendor: Transport
    inter: Transport

    def intra_level(self, library: str | None) -> Transport: ...


def family(collective: Collective) -> list[str]:
    """The hand-written schedules of ``collective`` (everything registered but the native wrapper)."""
    return [name for name in algorithms.names(collective) if name != "native"]


PIPELINED_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
"""The collectives with a pipelined hierarchical schedule (``hier:pipelined``)."""


def hierarchical_inner(collective: Collective) -> list[str]:
    """What may follow ``hier:``: the family, the MPI library's own collective, and the pipelined schedule
    where the collective has one."""
    return family(collective) + ["mpi"] + ([PIPELINED] if collective in PIPELINED_COLLECTIVES else [])


def hier_prefix(library: str | None) -> str:
    """``hier:`` (the device's intra-node library) or ``hier-<library>:``."""
    return HIER_PREFIX if library is None else f"hier-{library}:"


def valid_names(collective: Collective) -> list[str]:
    """Every name ``algorithm=`` accepts for ``collective`` (on some device)."""
    flat = family(collective) + list(_NATIVE_ON)
    return flat + [hier_prefix(lib) + name for lib in (None, *INTRA_LIBRARIES) for name in hierarchical_inner(collective)
                   if not (name == PIPELINED and lib not in (None, "mpi"))]


def names_for(collective: Collective, device: str = "cpu", *, hierarchical: bool = True) -> list[str]:
    """The distinct names that run on ``device`` tensors: no explicit intra-node library that is the
    device's default anyway, none of another device. What ``pccl-bench pccl:all`` and the tests loop over.
    ``hierarchical=False``: the flat names only, for a layout whose nodes hold one rank each (or one node), where a
    hierarchy's inner (or outer) level would be empty."""
    return [name for name in runnable_names(collective, device)
            if not _synonym(name, DEFAULT_INTRA[device]) and (hierarchical or ":" not in name)]


def _synonym(name: str, default: str) -> bool:
    """Whether ``name`` runs as another name does where ``default`` is the intra-node library: ``hier-<default>:x``
    is ``hier:x`` (``hier:pipelined`` included: it runs the device's library inside the node too)."""
    library = intra_library(name)
    return library is not None and library == default


def runnable_names(collective: Collective, device: str) -> list[str]:
    """Every name ``algorithm=`` accepts on ``device`` tensors: all but those forcing another device's intra-node
    library (``hier-nccl:*`` on CPU, ``hier-gloo:*`` on CUDA). Unlike :func:`names_for`, synonyms stay
    (``hier:ring`` and ``hier-mpi:ring`` on CPU)."""
    usable = (None, "mpi", LIBRARY_BY_DEVICE[device])
    return [name for name in valid_names(collective) if intra_library(name) in usable]


def check_collective(collective: object) -> Collective:
    """``collective`` when it names one; ``TypeError`` or ``ValueError`` naming the valid ones otherwise."""
    valid = ", ".join(algorithms.COLLECTIVES)
    if not isinstance(collective, str):
        raise TypeError(f"collective must be a string, got {type(collective).__name__}; expected one of {valid}")
    if collective not in algorithms.COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; expected one of {valid}")
    return collective


def check_device(device: object) -> str:
    """``device`` when it is a device type pccl serves; ``ValueError`` naming them otherwise."""
    if device not in DEFAULT_INTRA:
        raise ValueError(f"unknown device {device!r}; expected None or one of {', '.join(map(repr, DEFAULT_INTRA))}")
    return device


def algorithm_names(collective: Collective, device: str | None = None) -> list[str]:
    """``pccl_torch.algorithms``: every name ``algorithm=`` accepts for ``collective`` (``device`` None), or the
    distinct ones that run on ``device`` (``"cpu"``, ``"cuda"``) tensors. An unknown collective or device raises,
    naming the valid ones."""
    collective = check_collective(collective)
    return valid_names(collective) if device is None else names_for(collective, check_device(device))


def intra_library(name: str) -> str | None:
    """The intra-node library a hierarchical ``name`` forces (``hier-gloo:ring`` -> ``gloo``), else None."""
    head, sep, _ = name.partition(":")
    return head[len("hier-"):] if sep and head.startswith("hier-") else None


@dataclass(frozen=True, slots=True)
class Plan:
    """A resolved algorithm name: the schedule and where it runs."""

    collective: Collective
    name: str
    schedule: Algorithm | None
    """The inter-node (hierarchical) or only (flat) schedule; None for ``hier:pipelined``."""
    hierarchical: bool
    transport: str  # "world" or "vendor" for flat plans; the inter level is always MPI
    intra: str | None = None
    """The intra-node library a hierarchical plan forces (None: the device's default)."""
    chunks: int = 1
    """Chunks of a pipelined plan, pieces of a compressed flat all-to-all (set per call shape by the API layer)."""

    compression: str | None = None
    """The wire format of what crosses nodes (``pccl_torch.compression``; set per call by the API layer):
    the inter-node phase of a hierarchical plan, every message of a flat one; the compressed schedules
    (``compression.schedules``) replace the named one there. None: exact."""

    probe: Callable[[float], None] | None = dataclasses.field(default=None, compare=False, repr=False)
    """Called with the call's seconds after it ran (online tuning's trial calls, ``pccl_torch.selection.tuning``)."""

    @property
    def pipelined(self) -> bool:
        return self.schedule is None

    def _between(self, collective: Collective) -> Callable[..., None]:
        """The schedule between nodes (hierarchical) or over all ranks (flat)."""
        if self.compression is not None:
            return functools.partial(getattr(compressed, collective), compression.get(self.compression))
        return self.schedule.fn

    def _pipeline_intra(self, levels: Levels, data: torch.Tensor) -> Transport:
        """The intra-node level of a pipelined plan: the plan's library (``hier:``: the device's, NCCL for CUDA
        tensors). The pipelined schedules stage a call once for both levels (``pipelined.staged``), so where the
        inter-node level needs host memory (MPI without CUDA support) and the intra-node one cannot take it
        (NCCL), the call runs MPI inside the node as well, as ``hier-mpi:pipelined`` does; pccl's own choice never
        picks a pipeline there (``cuda_rule.cuda_keeps_intra_on_device``)."""
        intra = levels.intra_level(self.intra)
        if data.is_cuda and levels.inter.host_memory_only and not intra.host_capable:
            return levels.intra_level("mpi")
        return intra

    def _forwarding(self, dtype: torch.dtype) -> compression.WireFormat | None:
        """The format of a compressed hierarchical plan whose encoded bytes can be forwarded inside the
        node (fixed-size formats), else None."""
        if self.compression is None or not self.hierarchical:
            return None
        fmt = compression.get(self.compression)
        return fmt if fmt.fixed_size else None

    def run_all_gather(self, levels: Levels, out: torch.Tensor, inp: torch.Tensor) -> None:
        if (fmt := self._forwarding(inp.dtype)) is not None and self.pipelined:
            compressed_pipelined.all_gather(fmt, self._pipeline_intra(levels, inp), levels.inter, out, inp,
                                            self.chunks)
        elif fmt is not None:
            compressed.hierarchical_all_gather(fmt, levels.intra_level(self.intra), levels.inter, out, inp)
        elif self.pipelined:
            pipelined.all_gather(self._pipeline_intra(levels, inp), levels.inter, out, inp, self.chunks)
        elif self.hierarchical:
            hierarchical.all_gather(levels.intra_level(self.intra), levels.inter, self._between("all_gather"), out, inp)
        else:
            t = getattr(levels, self.transport)
            self._between("all_gather")(t, out, inp, Blocks.even(t.size, inp.numel()))

    def run_reduce_scatter(self, levels: Levels, inp: torch.Tensor, out: torch.Tensor, op: ReduceOp) -> None:
        if (fmt := self._forwarding(inp.dtype)) is not None and self.pipelined:
            compressed_pipelined.reduce_scatter(fmt, self._pipeline_intra(levels, inp), levels.inter, inp, out, op,
                                                self.chunks)
        elif self.pipelined:
            pipelined.reduce_scatter(self._pipeline_intra(levels, inp), levels.inter, inp, out, op, self.chunks)
        elif self.hierarchical:
            hierarchical.reduce_scatter(levels.intra_level(self.intra), levels.inter, self._between("reduce_scatter"),
                                        inp, out, op)
        else:
            t = getattr(levels, self.transport)
            self._between("reduce_scatter")(t, inp, out, Blocks.even(t.size, out.numel()), op)

    def run_all_reduce(self, levels: Levels, buf: torch.Tensor, op: ReduceOp) -> None:
        if (fmt := self._forwarding(buf.dtype)) is not None and self.pipelined:
            compressed_pipelined.all_reduce(fmt, self._pipeline_intra(levels, buf), levels.inter, buf, op,
                                            self.chunks)
        elif fmt is not None:
            compressed.hierarchical_all_reduce(fmt, levels.intra_level(self.intra), levels.inter, buf, op)
        elif self.pipelined:
            pipelined.all_reduce(self._pipeline_intra(levels, buf), levels.inter, buf, op, self.chunks)
        elif self.hierarchical:
            hierarchical.all_reduce(levels.intra_level(self.intra), levels.inter, self._between("all_reduce"), buf, op)
        else:
            self._between("all_reduce")(getattr(levels, self.transport), buf, op)

    def run_all_to_all(self, levels: Levels, out: torch.Tensor, inp: torch.Tensor, send: Blocks, recv: Blocks, *,
                       even: bool = False) -> None:
        """``even``: every rank of the call passed equal blocks (the hierarchy skips its count exchange). With a
        wire format, the blocks that cross nodes are encoded at their source and the plan moves the bytes."""
        if self.compression is not None:
            exact, fmt = dataclasses.replace(self, compression=None), compression.get(self.compression)
            world, local = levels.world, levels.world.size // levels.inter.size
            flat_mpi = self.name == f"mpi+{self.compression}"
            if even and flat_mpi and send.total * inp.element_size() >= \
                    PAIRWISE_BYTES_FROM * len(send.counts):  # every rank's blocks: the same size, the same choice
                exact, flat_mpi = resolve("all_to_all", "pairwise"), False
            even = even and fmt.fixed_size  # a lossless block's bytes depend on its values, not its length
            if flat_mpi and fmt.fixed_size and self.chunks > 1 and inp.device.type == "cpu":
                compressed.chunked_all_to_all(fmt, levels.world, out, inp, send, recv, world.rank, local,
                                              self.chunks)
                return
            compressed.all_to_all(fmt, lambda o, i, s, r: exact.run_all_to_all(levels, o, i, s, r, even=even),
                                  functools.partial(_announce, world, inp.device), out, inp, send, recv, world.rank,
                                  local)
        elif self.hierarchical:
            hierarchical.all_to_all(levels.intra_level(self.intra), levels.inter, self._between("all_to_all"), out,
                                    inp, send, recv, even=even)
        else:
            self._between("all_to_all")(getattr(levels, self.transport), out, inp, send, recv)

    def workspace(self, levels: Levels, numel: int, dtype: torch.dtype, *, even: bool = True) -> workspace.Need:
        """The device memory a call of this plan takes on a worker, which its issuing thread reserves before the
        gate closes (``pccl_torch.workspace``): its schedules' temporaries, and the lanes of its copies between
        the device and pinned host memory. ``numel``: elements of the full buffer (all-gather output,
        reduce-scatter input, all-reduce buffer, all-to-all input); ``even`` False: an all-to-all with split sizes.
        The one place a call's device memory is sized: a pipelined plan runs on pinned host memory (its scratch is
        the host's), and a compressed plan that is not pipelined reserves its lanes only: its schedules and codecs
        allocate where they run (named in ``pccl_torch.workspace``)."""
        lanes = workspace.lane_bytes(numel, dtype)
        if self.pipelined:
            return workspace.Need((), lanes)
        if self.compression is not None:
            return workspace.Need((), lanes, complete=False)
        if self.hierarchical:
            takes = hierarchical.scratch_bytes(self.collective, levels.inter.size,
                                               levels.intra_level(self.intra).size, numel, dtype.itemsize,
                                               self.schedule.scratch, even=even)
        else:
            p = getattr(levels, self.transport).size
            takes = tuple(e * dtype.itemsize for e in self.schedule.scratch(p, numel))
        return workspace.Need(takes, lanes)

    def compressed(self, fmt: str, *, pipeline: bool = True) -> "Plan":
        """This plan with ``fmt`` on the wire, named ``<name>+<fmt>`` (in counters and signatures). A
        pipelined plan stays pipelined with the fixed-size formats (``compression.pipelined``) when ``pipeline``,
        and otherwise becomes ``hier:mpi`` (always with ``lossless``, whose variable-size messages the pipelined
        exchanges cannot carry)."""
        base = self
        if self.pipelined and not (pipeline and compression.get(fmt).fixed_size):
            base = dataclasses.replace(resolve(self.collective, HIER_PREFIX + "mpi"), chunks=1)
        return dataclasses.replace(base, name=f"{base.name}+{fmt}", compression=fmt)


def _announce(world: Transport, data_device: torch.device, sizes: list[int]) -> list[int]:
    """Tell each rank what this one sends it (``sizes[j]`` to rank ``j``); what each sends this rank."""
    device = world.control_device(data_device)
    told = torch.empty(world.size, dtype=torch.int64, device=device)
    world.native_all_to_all(told, torch.tensor(sizes, dtype=torch.int64, device=device), [1] * world.size,
                            [1] * world.size)
    return told.tolist()


def resolve(collective: Collective, name: str) -> Plan:
    """The :class:`Plan` of ``name``; ``ValueError`` listing the valid names if it is unknown."""
    if not isinstance(name, str):
        raise TypeError(f"algorithm must be a string, got {type(name).__name__}")
    return _resolve(collective, name)


@functools.lru_cache(maxsize=512)
def _resolve(collective: Collective, name: str) -> Plan:
    """Cached: every call resolves its algorithm's name (plans are immutable; unknown names raise)."""
    if name not in valid_names(collective):
        raise ValueError(f"unknown {collective} algorithm {name!r}; valid: {', '.join(valid_names(collective))}")
    _, sep, inner = name.partition(":")
    hier = bool(sep)
    inner = inner if hier else name
    library = intra_library(name)
    if inner == PIPELINED:
        return Plan(collective, name, None, True, "world", library)
    if inner in _NATIVE_ON:
        return Plan(collective, name, algorithms.get(collective, "native"), hier, _NATIVE_ON[inner], library)
    return Plan(collective, name, algorithms.get(collective, inner), hier, "world", library)


PAIRWISE_BYTES_FROM = 8 << 20
"""Blocks (of the caller's buffer) from which a compressed flat ``mpi`` all-to-all moves its bytes by pairwise
exchange: the bytes of a compressed call differ by block (encoded between nodes, as they are inside), so MPI
moves them with ``Alltoallv``, and MPICH's ``Alltoallv`` of 16 MiB blocks took 2.4x the pairwise exchange's time
(testbed 2 x 2, 1 Gbit/s, int8, 64 MiB a rank: 781 against 319 ms; at 4 MiB blocks the two were even)."""

ALGO_ENV = "PCCL_ALGO"


def env_overrides() -> dict[str, str]:
    """``PCCL_ALGO=all_reduce:ring,all_gather:hier:bruck`` as a dict; a malformed value raises ``ValueError``
    naming the variable and the valid collectives or algorithms. Read when a communicator is created (see
    ``Communicator.algo_overrides``)."""
    return environment.per_collective(ALGO_ENV, algorithms.COLLECTIVES, resolve, "all_reduce:ring")
