"""Where each rank sits: node id, local rank, local size, node count.

Ranks must be placed in blocks: node ``k`` holds ranks ``k*L .. k*L + L - 1`` (what ``mpiexec`` and
``torchrun`` do by default), every node with the same ``L``. ``PCCL_LOCAL_SIZE=L`` overrides detection
so one machine can emulate ``world / L`` nodes of ``L`` consecutive ranks.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpi4py import MPI

log = logging.getLogger(__name__)

LOCAL_SIZE_ENV = "PCCL_LOCAL_SIZE"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; the machine's count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def kernel_id() -> str:
    """What identifies the kernel, hence the CPUs, this process runs on: the boot id, shared by every
    network namespace of one machine (testbed nodes) and different on every other machine."""
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        import socket

        return socket.gethostname()


class TopologyError(RuntimeError):
    """The ranks' placement cannot be used (unequal nodes, non-block placement, bad override)."""


@dataclass(frozen=True, slots=True)
class Topology:
    """This rank's place in a world of ``num_nodes`` nodes of ``local_size`` ranks each."""

    rank: int
    """Global rank, ``node * local_size + local_rank``."""
    world_size: int
    """Number of ranks in the world."""
    local_size: int
    """Ranks per node (``L``)."""
    hosts: int = 1
    """Shared-memory domains the ranks span (MPI's ``COMM_TYPE_SHARED`` split): 1 when every rank shares
    one machine's memory, as with nodes emulated by ``PCCL_LOCAL_SIZE``, where the hierarchy cannot pay."""
    cpu_ranks: int = 1
    """Ranks running on this rank's CPUs (the same kernel): with testbed namespaces or emulated nodes, all of
    the machine's ranks, whatever node they stand for."""
    cores: int = field(default_factory=usable_cores)
    """CPU cores this process may run on."""

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise TopologyError(f"world_size must be at least 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise TopologyError(f"rank {self.rank} is outside a world of {self.world_size} ranks")
        if self.local_size < 1 or self.world_size % self.local_size:
            raise TopologyError(
                f"local size {self.local_size} does not divide the world size {self.world_size}: "
                "every node must hold the same number of ranks (set PCCL_LOCAL_SIZE to a divisor, "
                "or launch the same number of ranks on every node)"
            )

    @property
    def node(self) -> int:
        """Index of this rank's node."""
        return self.rank // self.local_size

    @property
    def local_rank(self) -> int:
        """Index of this rank within its node."""
        return self.rank % self.local_size

    @property
    def num_nodes(self) -> int:
        """Number of nodes (``N``)."""
        return self.world_size // self.local_size

    @property
    def networked(self) -> bool:
        """True when the nodes are joined by a network (several shared-memory domains), not by memory."""
        return self.hosts > 1

    @property
    def cores_per_rank(self) -> float:
        """This machine's cores over the ranks running on them: below 1, ranks that wait by spinning take
        the CPU from the ranks they wait for."""
        return self.cores / self.cpu_ranks

    @property
    def ranks_share_cores(self) -> bool:
        """Fewer cores than ranks on this machine: waits must not spin (``PCCL_WAIT=auto``)."""
        return self.cores_per_rank < 1

    @property
    def is_hierarchical(self) -> bool:
        """True when there are several nodes of several ranks: both levels have work to do."""
        return self.num_nodes > 1 and self.local_size > 1

    def node_ranks(self, node: int) -> list[int]:
        """Global ranks of ``node``."""
        return list(range(node * self.local_size, (node + 1) * self.local_size))

    def peer_ranks(self, local_rank: int) -> list[int]:
        """Global ranks with the given local rank, one per node (one inter-node communicator)."""
        return list(range(local_rank, self.world_size, self.local_size))


def local_size_override() -> int | None:
    """``PCCL_LOCAL_SIZE`` as an int, or None when unset; ``TopologyError`` when malformed."""
    raw = os.environ.get(LOCAL_SIZE_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise TopologyError(f"{LOCAL_SIZE_ENV}={raw!r} is not an integer; expected ranks per node, e.g. 2") from None
    if value < 1:
        raise TopologyError(f"{LOCAL_SIZE_ENV}={value} must be at least 1")
    return value


def detect(comm: "MPI.Comm", local_size: int | None = None) -> Topology:
    """Topology of ``comm``: from ``local_size``, else ``PCCL_LOCAL_SIZE``, else MPI's shared-memory split.

    Collective over ``comm`` (every rank must call it). With an explicit local size, nodes that do not
    divide the world raise ``TopologyError``; nodes found by detection that hold different numbers of
    ranks, or ranks not placed in blocks, make the topology flat (one rank a node) with one log line.
    """
    from mpi4py import MPI

    rank = comm.Get_rank()
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        node_leader = node_comm.allreduce(rank, op=MPI.MIN)
        detected = node_comm.Get_size()
    finally:
        node_comm.Free()
    return from_placements(rank, comm.allgather((node_leader, detected)), ranks_on_this_machine(comm), local_size)


def from_placements(rank: int, placements: list[tuple[int, int]], cpu_ranks: int,
                    local_size: int | None = None) -> Topology:
    """The topology of rank ``rank`` given every rank's (node leader, ranks on that node): ``local_size``, else
    ``PCCL_LOCAL_SIZE``, else the nodes found when they are blocks of equal size, else flat (one log line)."""
    chosen = local_size if local_size is not None else local_size_override()
    if chosen is None:
        problem = placement_problem(placements)
        if problem is not None and rank == 0:
            log.warning("pccl: %s; running the flat algorithms (one rank a node)", problem)
        chosen = 1 if problem is not None else placements[rank][1]
    hosts = len({leader for leader, _ in placements})
    return Topology(rank, len(placements), chosen, hosts, cpu_ranks)


def ranks_on_this_machine(comm: "MPI.Comm") -> int:
    """Ranks of ``comm`` running on this rank's kernel, hence sharing its CPUs (collective over ``comm``)."""
    kernel = kernel_id()
    return sum(1 for other in comm.allgather(kernel) if other == kernel)


def placement_problem(placements: list[tuple[int, int]]) -> str | None:
    """Why the detected nodes cannot be used as equal blocks of ranks (None when they can)."""
    sizes = sorted({s for _, s in placements})
    if len(sizes) > 1:
        return f"nodes hold different numbers of ranks ({sizes})"
    detected = sizes[0]
    for r, (leader, _) in enumerate(placements):
        if leader != r - r % detected:
            return (f"rank {r} shares a node with rank {leader}: ranks are not placed in blocks of {detected} "
                    "consecutive ranks per node (place ranks in blocks, as mpiexec does by default: node k holds ranks "
                    "k*L .. k*L+L-1)")
    return None
