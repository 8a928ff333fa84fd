"""The communicator: topology plus the transports of each level, created from an ``mpiexec`` launch.

``init()`` is collective over the MPI communicator (``COMM_WORLD`` by default):
1. duplicate it (pccl's traffic never mixes with the user's);
2. detect the topology (``PCCL_LOCAL_SIZE`` emulates nodes of k consecutive ranks);
3. initialise torch.distributed if nobody has (rank and world size from MPI; rank 0 picks a free TCP
   port and broadcasts its address over MPI, or ``MASTER_ADDR``/``MASTER_PORT`` are used when set);
4. build the intra-node torch group of this node (gloo for CPU tensors, NCCL for CUDA) and the
   inter-node MPI communicator of this local rank (``Split(color=local_rank)``: one per local rank,
   so the local ranks of a node drive their NICs in parallel).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from pccl_torch.selector.profile import Profile, ProfileError
from pccl_torch.selector.runtime import Selector, profile_path
from pccl_torch.topology import Topology, detect
from pccl_torch.transport.base import Transport
from pccl_torch.transport.mpi import MPITransport
from pccl_torch.transport.torch_group import TorchGroupTransport
from pccl_torch.work import OrderedExecutor

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = datetime.timedelta(minutes=5)


class NotInitializedError(RuntimeError):
    """A collective was called before ``pccl_torch.init()`` or after ``pccl_torch.shutdown()``."""


@dataclass(slots=True)
class CollectiveStats:
    """Per-collective counters: calls, bytes moved by the caller's buffers, seconds, algorithm use."""

    calls: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)
    seconds: Counter[str] = field(default_factory=Counter)
    algorithms: Counter[tuple[str, str]] = field(default_factory=Counter)

    def record(self, collective: str, algorithm: str, nbytes: int, seconds: float) -> None:
        self.calls[collective] += 1
        self.bytes[collective] += nbytes
        self.seconds[collective] += seconds
        self.algorithms[(collective, algorithm)] += 1

    def reset(self) -> None:
        for counter in (self.calls, self.bytes, self.seconds, self.algorithms):
            counter.clear()


@dataclass(eq=False)
class Communicator:
    """Everything one rank needs to run the collectives; build it with :func:`pccl_torch.init`."""

    topology: Topology
    device: torch.device
    world: MPITransport
    """All ranks over MPI: the flat algorithms and the flat ``mpi`` native collective."""
    vendor: Transport
    """All ranks over the torch.distributed world group: the flat ``vendor`` native collective."""
    intra: Transport
    """This node's ranks over a torch.distributed group (NCCL/gloo): the intra-node phase."""
    inter: MPITransport
    """This local rank's peers on every node over MPI: the inter-node phase."""
    owns_process_group: bool = False
    selector: Selector | None = None
    """The learned algorithm choice (None: the heuristic); identical on every rank."""
    executor: OrderedExecutor = field(default_factory=lambda: OrderedExecutor("pccl"))
    stats: CollectiveStats = field(default_factory=CollectiveStats)
    closed: bool = False

    def close(self) -> None:
        """Finish queued work and free the communicators (collective: every rank must call it)."""
        if self.closed:
            return
        self.executor.shutdown()
        for transport in (self.inter, self.intra, self.world):
            transport.close()
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        self.closed = True


def _device_for(device: str | torch.device | None, topology: Topology) -> torch.device:
    if device is None:
        return torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", topology.local_rank % max(torch.cuda.device_count(), 1))
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device}: pccl_torch runs on 'cpu' or 'cuda' tensors")
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


def _agreed_selector(comm) -> Selector | None:
    """Rank 0 reads the selector profile and broadcasts its text, so every rank holds the same one and
    makes the same choice for the same call; a bad profile fails on every rank with the same error."""
    text = origin = error = None
    if comm.Get_rank() == 0:
        try:
            path = profile_path()
            if path is not None:
                origin, text = str(path), path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            error = f"cannot read selector profile {origin or path}: {exc.strerror}"
    text, origin, error = comm.bcast((text, origin, error), root=0)
    if error:
        raise ProfileError(error)
    return None if text is None else Selector(Profile.from_json(text, origin), origin)


def init_process_group(backend: str = "pccl", *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> None:
    """``torch.distributed.init_process_group(backend)`` under an ``mpiexec`` launch: rank and world size
    from MPI, the rendezvous address broadcast over MPI (``MASTER_ADDR``/``MASTER_PORT`` when set)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    topology = Topology(world.Get_rank(), world.Get_size(), 1)
    _rendezvous(world, topology, backend, timeout)


def create(comm=None, *, local_size: int | None = None, device: str | torch.device | None = None,
           timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> Communicator:
    """Build a :class:`Communicator` (collective over ``comm``, default ``MPI.COMM_WORLD``)."""
    from mpi4py import MPI

    world_comm = (comm if comm is not None else MPI.COMM_WORLD).Dup()
    try:
        topology = detect(world_comm, local_size)
        selector = _agreed_selector(world_comm)
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
        _rendezvous(world_comm, topology, "cpu:gloo,cuda:nccl" if dev.type == "cuda" else "gloo", timeout)
        owns = True

    node_groups = [topology.node_ranks(k) for k in range(topology.num_nodes)]
    intra_group, _ = dist.new_subgroups_by_enumeration(node_groups, timeout=timeout, backend=group_backend)
    inter_comm = world_comm.Split(color=topology.local_rank, key=topology.node)
    log.debug("pccl communicator: %s on %s", topology, dev)
    return Communicator(
        topology=topology,
        device=dev,
        world=MPITransport(world_comm, owned=True),
        # With the pccl backend as the default group, its private gloo group is the vendor library.
        vendor=TorchGroupTransport(getattr(dist.group.WORLD, "vendor", dist.group.WORLD)),
        intra=TorchGroupTransport(intra_group, owned=True),
        inter=MPITransport(inter_comm, owned=True),
        owns_process_group=owns,
        selector=selector,
    )


_DEFAULT: Communicator | None = None


def init(comm=None, *, local_size: int | None = None, device: str | torch.device | None = None,
         timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> Communicator:
    """Create the default communicator (see module docstring) and return it. Collective."""
    global _DEFAULT
    if _DEFAULT is not None and not _DEFAULT.closed:
        raise RuntimeError("pccl_torch is already initialised: call pccl_torch.shutdown() before init() again")
    _DEFAULT = create(comm, local_size=local_size, device=device, timeout=timeout)
    return _DEFAULT


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
