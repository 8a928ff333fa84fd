"""The communicator: topology plus the transports of each level, created from an ``mpiexec`` launch (without
one, under torchrun or DeepSpeed's launcher, the levels are torch groups: see ``pccl_torch.launcher``).

``init()`` is collective over the MPI communicator (``COMM_WORLD`` by default):
1. duplicate it (pccl's traffic never mixes with the user's);
2. detect the topology (``PCCL_LOCAL_SIZE`` emulates nodes of k consecutive ranks);
3. initialise torch.distributed if nobody has (rank and world size from MPI; rank 0 picks a free TCP
   port and broadcasts its address over MPI, or ``MASTER_ADDR``/``MASTER_PORT`` are used when set);
4. build the intra-node levels of this node: its MPI communicator (``Split(color=node)``, on shared memory:
   the default inside a node for CPU tensors) and its torch group (gloo for CPU tensors, NCCL for CUDA:
   the default for CUDA tensors), and the inter-node MPI communicator of this local rank
   (``Split(color=local_rank)``: one per local rank, so the local ranks of a node drive their NICs in parallel).

The communicator holds transports and topology only; choosing algorithms is the API layer's job
(``pccl_torch.selection.choice``), which keeps its state for each communicator in :attr:`Communicator.choice`.

Every wait is bounded by ``timeout`` (default 5 minutes). With ``PCCL_WAIT=bounded`` every wait is polled and
a collective that cannot finish raises :class:`~pccl_torch.errors.PcclTimeoutError` on every live rank and
breaks the communicator; with ``PCCL_WAIT=blocking`` MPI's native collectives are its faster blocking calls
and :mod:`pccl_torch.watchdog` aborts the job when one outlives the timeout. ``auto`` (the default) is
``blocking`` where every rank of the machine has a core of its own and ``bounded`` where they share cores:
there MPI's blocking calls spin, and the spinning ranks take the CPU from the late rank they wait for
(DeepSpeed ZeRO-3 steps of 1-37 s on 4 ranks sharing 2 cores), while a polled wait sleeps after a short spin.

Asynchronous calls (``async_op=True``) run on a worker thread per communicator (``PCCL_ASYNC=thread``), or
at once in the caller's thread (``inline``: the Work is complete when returned). ``auto`` (the default) takes
the thread for CUDA tensors, where the CPU is free while the GPU computes, and for CPU tensors where every rank
has a spare core; otherwise the thread would only take CPU from the rank's own computation.
``check=True`` (or ``PCCL_DEBUG=check``) makes the ranks agree on each call's signature first.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import gc
import logging
import operator
import os
import sys
import socket
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from pccl_torch import failure_notice, flight_recorder, hotpath, launcher, trace_dump
from pccl_torch.errors import CommunicatorBrokenError, PcclError
from pccl_torch.topology import Topology, detect
from pccl_torch.triton_kernels._backend import wants_triton
from pccl_torch.transport.base import Transport
from pccl_torch.transport.mpi import SHARED_CORES_SPIN_S, SPIN_S, MPITransport
from pccl_torch.transport.torch_group import LIBRARY_BY_DEVICE, TorchGroupTransport
from pccl_torch.work import Queue

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = datetime.timedelta(minutes=5)
DEBUG_ENV = "PCCL_DEBUG"
DEBUG_MODES = ("off", "check")
WAIT_ENV = "PCCL_WAIT"
WAIT_MODES = ("auto", "blocking", "bounded")
ASYNC_ENV = "PCCL_ASYNC"
ASYNC_MODES = ("auto", "thread", "inline")


def _mode_from_env(name: str, modes: tuple[str, ...]) -> str:
    """``name``'s value, one of ``modes`` (unset: the first); anything else raises ``ValueError``."""
    mode = os.environ.get(name, "").strip().lower() or modes[0]
    if mode not in modes:
        raise ValueError(f"{name}={mode!r} is not a valid mode; expected one of {', '.join(modes)}")
    return mode


def blocking_waits_from_env(topology: Topology) -> bool:
    """``PCCL_WAIT=blocking``: MPI's native collectives are its blocking calls, a watchdog aborts the job
    when one outlives the timeout (as NCCL's does); ``bounded``: every wait is polled, and a collective that
    cannot finish raises ``PcclTimeoutError`` on every live rank; ``auto`` (unset): ``blocking`` where every
    rank of the machine has a core, else ``bounded``. Anything else raises."""
    mode = _mode_from_env(WAIT_ENV, WAIT_MODES)
    return mode == "blocking" or (mode == "auto" and not topology.ranks_share_cores)


def threaded_async_from_env(topology: Topology, device: torch.device) -> bool:
    """``PCCL_ASYNC=thread``: ``async_op=True`` calls run on the communicator's worker thread; ``inline``:
    at once, in the caller's thread; ``auto`` (unset): the thread for CUDA tensors and where every rank of
    the machine has a spare core, inline otherwise. Anything else raises."""
    mode = _mode_from_env(ASYNC_ENV, ASYNC_MODES)
    return mode == "thread" or (mode == "auto" and (device.type == "cuda" or topology.cores_per_rank >= 2))


def checking_from_env() -> bool:
    """``PCCL_DEBUG=check`` turns on signature checks; unset/``off`` leaves them off; anything else raises."""
    mode = os.environ.get(DEBUG_ENV, "").strip().lower() or "off"
    if mode not in DEBUG_MODES:
        raise ValueError(f"{DEBUG_ENV}={mode!r} is not a valid mode; expected one of {', '.join(DEBUG_MODES)}")
    return mode == "check"


def mpi_serves_threads(transports: tuple[Transport, ...]) -> bool:
    """Whether MPI may be called from the worker thread while the caller's thread calls it too (a group created, a
    blocking call): true without MPI among ``transports``, or where MPI runs at ``MPI_THREAD_MULTIPLE`` (mpi4py asks
    for it; an MPI library that gives less makes async calls run inline, with one warning)."""
    if not any(isinstance(t, MPITransport) for t in transports):
        return True
    from mpi4py import MPI

    if MPI.Query_thread() >= MPI.THREAD_MULTIPLE:
        return True
    if not _THREAD_WARNED:
        _THREAD_WARNED.append(True)
        log.warning("pccl: this MPI runs at thread level %d, not MPI_THREAD_MULTIPLE: async calls run in the "
                    "caller's thread (set mpi4py.rc.thread_level = 'multiple' before importing MPI)", MPI.Query_thread())
    return False


_THREAD_WARNED: list[bool] = []


class NotInitializedError(RuntimeError):
    """A collective was called before ``pccl_torch.init()`` or after ``pccl_torch.shutdown()``."""


class CollectiveStats:
    """Per-collective counters: calls, bytes moved by the caller's buffers, seconds, algorithm use.

    One entry per (collective, algorithm) (``[calls, bytes, seconds]``), held by the bound calls of that plan and
    updated in place (``pccl_torch.calls``: no lookup a call); the per-collective views are summed when read."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], list] = {}

    def entry(self, plan) -> list:
        """The ``[calls, bytes, seconds]`` of ``plan`` (anything with ``collective`` and ``name``), updated in
        place by its bound calls (``pccl_torch.calls``)."""
        entry = self._entries.get((plan.collective, plan.name))
        if entry is None:
            entry = self._entries[(plan.collective, plan.name)] = [0, 0, 0.0]
        return entry

    def _by_collective(self, index: int) -> Counter[str]:
        out: Counter[str] = Counter()
        for (collective, _), entry in self._entries.items():
            if entry[0]:
                out[collective] += entry[index]
        return out

    @property
    def calls(self) -> Counter[str]:
        return self._by_collective(0)

    @property
    def bytes(self) -> Counter[str]:
        return self._by_collective(1)

    @property
    def seconds(self) -> Counter[str]:
        return self._by_collective(2)

    @property
    def algorithms(self) -> Counter[tuple[str, str]]:
        return Counter({key: entry[0] for key, entry in self._entries.items() if entry[0]})

    def reset(self) -> None:
        """Zero every counter (in place: bound calls keep their entries)."""
        for entry in self._entries.values():
            entry[:] = [0, 0, 0.0]


@dataclass(eq=False)
class Communicator:
    """Everything one rank needs to run the collectives; build it with :func:`pccl_torch.init`."""

    topology: Topology
    device: torch.device
    world: Transport
    """All ranks over MPI (over a torch group without an MPI launch, ``pccl_torch.launcher``): the flat
    algorithms and the flat ``mpi`` native collective."""
    vendor: Transport
    """All ranks over the torch.distributed world group: the flat ``vendor`` native collective."""
    intra_mpi: Transport
    """This node's ranks over MPI (shared memory): the intra-node phase of CPU tensors by default (without an
    MPI launch, the same torch group as :attr:`intra_torch`)."""
    intra_torch: Transport
    """This node's ranks over a torch.distributed group (gloo on CPU, NCCL on CUDA: CUDA's default)."""
    inter: Transport
    """This local rank's peers on every node over MPI (or a torch group): the inter-node phase."""
    control: Transport | None = None
    """All ranks over a host-capable level: every set-up and control exchange (the selector profile, link
    measurements' agreement, tuning, signatures) goes here, never through a device library's level (NCCL refuses
    host tensors). None: :attr:`world`, which is host-capable (MPI, or gloo for CPU tensors); a CUDA communicator
    over torch groups gets a gloo group of its own (``over_torch``)."""
    owns_process_group: bool = False
    choice: object | None = None
    """The API layer's algorithm-choice state for this communicator (``pccl_torch.selection.choice``); opaque here."""
    timeout_s: float = DEFAULT_TIMEOUT.total_seconds()
    """How long any wait on a peer may take before the collective raises ``PcclTimeoutError``."""
    check: bool = False
    """Agree on each call's signature before running it (``PCCL_DEBUG=check``)."""
    blocking_waits: bool | None = None
    """MPI's native collectives as blocking calls under the watchdog (None: ``PCCL_WAIT``, read at creation)."""
    threaded_async: bool | None = None
    """``async_op=True`` calls on a worker thread, else in the caller's thread (None: ``PCCL_ASYNC``)."""
    executor: Queue = field(init=False)
    """The communicator's FIFO (``pccl_torch.work``): every call on it, pccl's own and delegated, in issue order."""
    stats: CollectiveStats = field(default_factory=CollectiveStats)
    sequence: int = 0
    """Collectives issued so far; the number of the next one (the same on every rank of a sound program)."""
    broken: PcclError | None = None
    """The failure that broke the communicator, if one did."""
    closed: bool = False
    calls: dict = field(default_factory=dict, repr=False)
    """The call-shape cache: a bound call per call shape (``pccl_torch.calls``), dropped with the communicator."""
    bound_shapes: int = 0
    """Shapes bound into :attr:`calls` since it last started over."""
    hot: object | None = field(default=None, repr=False)
    """The bound shapes the compiled hot path runs (``pccl_torch.hotpath``; None without it)."""
    recorder: flight_recorder.Recorder | None = field(default=None, init=False, repr=False)
    """The flight recorder's ring of recent calls (``PCCL_TRACE_BUFFER``; None when it is 0)."""
    on_device: Callable[[torch.Tensor], bool] = field(init=False, repr=False)
    """Whether a tensor lives on this communicator's device (a C-level getter for CPU: the call-shape cache asks
    on every call)."""

    def __post_init__(self) -> None:
        index = self.device.index
        self.on_device = operator.attrgetter("is_cpu") if self.device.type == "cpu" else \
            (lambda tensor: tensor.get_device() == index)
        wants_triton(torch.empty(0, device=self.device))  # a bad PCCL_KERNELS fails here, not mid-collective
        slots = flight_recorder.buffer_size()
        self.hot = hotpath.table(slots)
        if slots:
            self.recorder = flight_recorder.Recorder(slots, self.topology.rank, _launch_ranks(self.world),
                                                     self.timeout_s, flight_recorder.stacks_wanted())
            self.recorder.hot = self.hot
            trace_dump.install()
        _LIVE.add(self)
        if self.control is None:
            self.control = self.world
        if not self.control.host_capable:
            raise ValueError(f"the control level {self.control.name} cannot carry host tensors; give a gloo or MPI one")
        topo = self.topology
        everyone = range(topo.world_size)
        node = topo.node_ranks(topo.node)
        for transport, ranks in ((self.world, everyone), (self.vendor, everyone), (self.intra_mpi, node),
                                 (self.intra_torch, node), (self.inter, topo.peer_ranks(topo.local_rank)),
                                 (self.control, everyone)):
            transport.attach(ranks, self.timeout_s)
        if self.blocking_waits is None:
            self.blocking_waits = blocking_waits_from_env(topo)
        if self.threaded_async is None:
            self.threaded_async = threaded_async_from_env(topo, self.device)
        if self.threaded_async and not mpi_serves_threads(self.transports()):
            self.threaded_async = False  # every MPI call then comes from the calling thread
        self.executor = Queue("pccl", inline=not self.threaded_async, device=self.device)
        if topo.rank == 0:
            log.info("pccl over %s: %d ranks on %d cores here: %s waits, async calls %s", self.transport,
                     topo.cpu_ranks, topo.cores,
                     "blocking" if self.blocking_waits else "polled",
                     "on a worker thread" if self.threaded_async else "inline")
        for transport in (self.world, self.intra_mpi, self.inter):
            if isinstance(transport, MPITransport):
                transport.blocking = self.blocking_waits
                transport.spin_s = SHARED_CORES_SPIN_S if topo.ranks_share_cores else SPIN_S

    @property
    def transport(self) -> str:
        """What carries the point-to-point levels: ``mpi`` (an MPI launch) or ``torch:<library>`` (torch groups,
        without one; ``pccl_torch.launcher``)."""
        return "mpi" if isinstance(self.inter, MPITransport) else f"torch:{LIBRARY_BY_DEVICE[self.device.type]}"

    @property
    def intra(self) -> Transport:
        """The device's default intra-node level: MPI for CPU tensors, the torch group (NCCL) for CUDA."""
        return self.intra_torch if self.device.type == "cuda" else self.intra_mpi

    def intra_level(self, library: str | None) -> Transport:
        """The intra-node transport of ``library`` (``mpi``, ``gloo``, ``nccl``; None: the device's default).

        ``ValueError`` when this communicator's device has no such level (``gloo`` for CUDA tensors)."""
        if library is None:
            return self.intra
        if library == "mpi":
            return self.intra_mpi
        torch_library = LIBRARY_BY_DEVICE[self.device.type]
        if library == torch_library:
            return self.intra_torch
        raise ValueError(f"intra-node library {library!r} does not serve {self.device.type} tensors; use "
                         f"hier-mpi:... or hier-{torch_library}:..., or hier:...")

    def transports(self) -> tuple[Transport, ...]:
        """Every level's transport (one object may serve two levels: close and abort are idempotent)."""
        return (self.inter, self.intra_mpi, self.intra_torch, self.world, self.vendor, self.control)

    def mark_broken(self, error: PcclError) -> None:
        """Record the failure; later calls raise at once, and the process will exit without finalizing MPI."""
        if self.broken is None:
            self.broken = error
            trace_dump.dump_on_failure(f"broken communicator: {error}")  # before abort: nothing it does can hang
            for transport in self.transports():
                transport.abort()
            _exit_without_finalize_at_exit()

    def next_sequence(self) -> int:
        """Number the next collective; raises at once when an earlier one broke the communicator."""
        if self.broken is not None:
            raise CommunicatorBrokenError(
                f"this pccl communicator is broken by an earlier failure and cannot run collectives: {self.broken}"
            )
        self.sequence += 1
        return self.sequence

    def forget_calls(self) -> None:
        """Drop every bound call shape, in Python and in the hot path (before their persistent collectives go)."""
        if self.hot is not None:
            self.hot.clear()
        self.calls.clear()

    def close(self) -> None:
        """Finish queued work and free the communicators (collective: every rank must call it).

        On a broken communicator nothing collective is attempted (a dead peer would never answer): the
        transports are dropped, not freed."""
        if self.closed:
            return
        self.forget_calls()
        self.executor.shutdown()
        if self.broken is None:
            for transport in self.transports():
                transport.close()
        if self.owns_process_group and dist.is_initialized() and self.broken is None:
            dist.destroy_process_group()
        self.closed = True


_LIVE: weakref.WeakSet[Communicator] = weakref.WeakSet()


def live_communicators() -> list[Communicator]:
    """Every communicator of this process not yet garbage-collected: ``init()``'s and each pccl group's."""
    return list(_LIVE)


@atexit.register
def _release_bound_calls() -> None:
    """At exit, drop every communicator's bound calls: each holds its communicator (a reference cycle), so a
    communicator nobody else holds any more (a pccl group after ``destroy_process_group``) is freed now, while
    the interpreter is whole, and not in its final teardown, where freeing its torch groups' threads aborted
    the process ("terminate called without an active exception")."""
    for comm in live_communicators():
        comm.forget_calls()
    gc.collect()


@functools.cache
def _launch_ranks(world: Transport) -> list[int]:
    """The ranks of ``world`` in the launch's numbering (MPI's world; else the group's own), for the recorder's
    dumps. Local: MPI translates ranks without a message."""
    comm = getattr(world, "comm", None)
    size = world.size
    if comm is not None:
        try:
            from mpi4py import MPI

            return list(MPI.Group.Translate_ranks(comm.Get_group(), list(range(size)), MPI.COMM_WORLD.Get_group()))
        except Exception:  # noqa: BLE001 - a transport without MPI groups: its own numbering
            pass
    return list(range(size))


def _exit_without_finalize_at_exit() -> None:
    """After a failed collective, MPI_Finalize (and gloo's teardown) could wait forever for the dead or
    stuck peer. At interpreter exit, flush and leave with status 1 before they run (as NCCL's async error
    handling tears the process down)."""

    def leave() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(1)

    atexit.register(leave)


def _device_for(device: str | torch.device | None, topology: Topology) -> torch.device:
    if device is None:
        return torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", topology.local_rank % max(torch.cuda.device_count(), 1))
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device}: pccl_torch runs on 'cpu' or 'cuda' tensors")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device}: torch {torch.__version__} sees no CUDA device here; use device='cpu' "
                         "(or a CUDA build of torch on a machine with a GPU)")
    return device


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _rendezvous(comm, topology: Topology, backend: str, timeout: datetime.timedelta) -> None:
    """Initialise the default torch.distributed group with rank and world size taken from MPI."""
    if topology.rank == 0:
        addr = os.environ.get("MASTER_ADDR") or ("127.0.0.1" if topology.num_nodes == 1 else socket.gethostname())
        port = int(os.environ.get("MASTER_PORT") or _free_port())
        endpoint = (addr, port)
    else:
        endpoint = None
    addr, port = comm.bcast(endpoint, root=0)
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=topology.rank,
                            world_size=topology.world_size, timeout=timeout)


def init_process_group(backend: str = "pccl", *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> None:
    """``torch.distributed.init_process_group(backend)`` under an ``mpiexec`` launch: rank and world size
    from MPI, the rendezvous address broadcast over MPI (``MASTER_ADDR``/``MASTER_PORT`` when set)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    topology = Topology(world.Get_rank(), world.Get_size(), 1)
    _rendezvous(world, topology, backend, timeout)


def create(comm=None, *, local_size: int | None = None, device: str | torch.device | None = None,
           timeout: datetime.timedelta = DEFAULT_TIMEOUT, check: bool | None = None) -> Communicator:
    """Build a :class:`Communicator` (collective over ``comm``, default ``MPI.COMM_WORLD``; without an MPI
    launch, over torch.distributed's world: see ``pccl_torch.launcher``).

    ``timeout`` bounds every wait on a peer; ``check`` (default: ``PCCL_DEBUG=check``) turns on the
    per-call signature agreement that reports mismatched collectives instead of hanging or corrupting."""
    check = checking_from_env() if check is None else check
    failure_notice.install()
    if comm is None and launcher.transport_for(*_torch_rank_and_size()) == "torch":
        return _create_over_torch(local_size, device, timeout, check)
    return _create_over_mpi(comm, local_size, device, timeout, check)


def _torch_rank_and_size() -> tuple[int, int]:
    """This process's torch rank and world size: torch.distributed's, else the launcher's (``RANK``,
    ``WORLD_SIZE``), else MPI's."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if os.environ.get("WORLD_SIZE", "").strip().isdigit() and os.environ.get("RANK", "").strip().isdigit():
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return launcher.mpi_world()


def _torch_backend(device: str | torch.device | None) -> str:
    return "cpu:gloo,cuda:nccl" if device is not None and torch.device(device).type == "cuda" else "gloo"


def _create_over_mpi(comm, local_size: int | None, device: str | torch.device | None,
                     timeout: datetime.timedelta, check: bool) -> Communicator:
    from mpi4py import MPI

    world_comm = (comm if comm is not None else MPI.COMM_WORLD).Dup()
    try:
        topology = detect(world_comm, local_size)
    except Exception:
        world_comm.Free()
        raise
    dev = _device_for(device, topology)
    group_backend = "nccl" if dev.type == "cuda" else "gloo"

    owns = False
    if dist.is_initialized():
        if dist.get_rank() != topology.rank or dist.get_world_size() != topology.world_size:
            world_comm.Free()
            raise RuntimeError(
                f"torch.distributed is initialised as rank {dist.get_rank()} of {dist.get_world_size()}, but MPI "
                f"says rank {topology.rank} of {topology.world_size}: launch both from the same job, in the same order"
            )
    else:
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        _rendezvous(world_comm, topology, _torch_backend(dev), timeout)
        owns = True

    node_groups = [topology.node_ranks(k) for k in range(topology.num_nodes)]
    intra_group, _ = dist.new_subgroups_by_enumeration(node_groups, timeout=timeout, backend=group_backend)
    inter_comm = world_comm.Split(color=topology.local_rank, key=topology.node)
    node_comm = world_comm.Split(color=topology.node, key=topology.local_rank)
    log.debug("pccl communicator: %s on %s", topology, dev)
    return Communicator(
        topology=topology,
        device=dev,
        world=MPITransport(world_comm, owned=True),
        vendor=_world_vendor(),
        intra_mpi=MPITransport(node_comm, owned=True),
        intra_torch=TorchGroupTransport(intra_group, owned=True),
        inter=MPITransport(inter_comm, owned=True),
        owns_process_group=owns,
        timeout_s=timeout.total_seconds(),
        check=check,
    )


def _world_vendor() -> TorchGroupTransport:
    """The vendor library over torch.distributed's world: with the pccl backend as the default group, its
    private gloo group; else the default group itself."""
    return TorchGroupTransport(getattr(dist.group.WORLD, "vendor", dist.group.WORLD))


_TORCH_CREATIONS = 0
"""Communicators ``create`` built over torch groups so far (the same count on every rank): their store prefix."""


def _create_over_torch(local_size: int | None, device: str | torch.device | None, timeout: datetime.timedelta,
                       check: bool) -> Communicator:
    """``create`` without an MPI launch: torch.distributed's world (initialised from the launcher's variables
    when nobody has) and pccl's levels as torch groups over its store."""
    global _TORCH_CREATIONS
    owns = False
    if not dist.is_initialized():
        rank, size = launcher.mpi_world()
        if size > 1:  # PCCL_TRANSPORT=torch under mpiexec: the rendezvous address still comes over MPI
            from mpi4py import MPI

            _rendezvous(MPI.COMM_WORLD, Topology(rank, size, 1), _torch_backend(device), timeout)
        else:
            launcher.init_world_from_env(_torch_backend(device), timeout)  # keys of its own: init() again works
        owns = True
    _TORCH_CREATIONS += 1
    store = dist.PrefixStore(f"pccl/init/{_TORCH_CREATIONS}", dist.distributed_c10d._get_default_store())
    topology = launcher.topology_from_store(store, dist.get_rank(), dist.get_world_size(), local_size)
    dev = _device_for(device, topology)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return over_torch(store, topology, dev, timeout, _world_vendor().group, check=check, owns=owns)


def over_torch(store: dist.Store, topology: Topology, device: torch.device, timeout: datetime.timedelta,
               vendor: dist.ProcessGroup, *, check: bool, owns: bool = False) -> Communicator:
    """A communicator whose levels are torch groups of ``device``'s library over ``store`` (the ``torch``
    transport of ``pccl_torch.launcher``); ``vendor`` is the flat ``vendor`` level. Collective over the group."""
    world, intra, inter = (TorchGroupTransport(group, owned=True)
                           for group in launcher.torch_levels(store, topology, device, timeout))
    control = None  # the world level itself where it takes host tensors (gloo)
    if not world.host_capable:  # NCCL: set-up and control go over a gloo group of their own
        control = TorchGroupTransport(launcher.control_group(store, topology, timeout), owned=True)
    log.debug("pccl communicator over torch groups: %s on %s", topology, device)
    return Communicator(
        topology=topology,
        device=device,
        world=world,
        vendor=TorchGroupTransport(vendor),
        intra_mpi=intra,
        intra_torch=intra,
        inter=inter,
        control=control,
        owns_process_group=owns,
        timeout_s=timeout.total_seconds(),
        check=check,
    )


_DEFAULT: Communicator | None = None


def require_uninitialized() -> None:
    """``RuntimeError`` when the default communicator exists and is open (``init()`` twice)."""
    if _DEFAULT is not None and not _DEFAULT.closed:
        raise RuntimeError("pccl_torch is already initialised: call pccl_torch.shutdown() before init() again")


def set_default(comm: Communicator) -> Communicator:
    """Make ``comm`` the communicator collectives use when given none (``pccl_torch.init`` does)."""
    global _DEFAULT
    require_uninitialized()
    _DEFAULT = comm
    return comm


def shutdown() -> None:
    """Close the default communicator. Collective; a no-op when not initialised."""
    if _DEFAULT is not None:
        _DEFAULT.close()


def is_initialized() -> bool:
    return _DEFAULT is not None and not _DEFAULT.closed


def default_communicator() -> Communicator:
    """The communicator of ``init()``; ``NotInitializedError`` before it or after ``shutdown()``."""
    if _DEFAULT is None:
        raise NotInitializedError("pccl_torch is not initialised: call pccl_torch.init() first")
    if _DEFAULT.closed:
        raise NotInitializedError("pccl_torch was shut down: call pccl_torch.init() again before collectives")
    return _DEFAULT
