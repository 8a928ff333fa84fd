"""The point-to-point interface every algorithm is written against.

An algorithm sees only ``rank``, ``size`` and these calls, so the same schedule runs over mpi4py, over an
intra-node torch.distributed group, and over the in-process threaded transport the unit tests use.
Messages between a pair of ranks are delivered in the order they were sent (MPI's non-overtaking rule);
algorithms rely on it and use no tags. Buffers are flat, contiguous tensors.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence

import torch

from pccl_torch.ops import ReduceOp

COMPRESSED_ALL_TO_ALL = "compressed all-to-all"
"""What a compressed all-to-all's pieces wait under (``Transport.wait``): a transport that polls may end its
yield phase sooner for an all-to-all, whose waits are mostly for late peers (``transport.mpi``)."""


def check_split_counts(send_counts: Sequence[int] | None, recv_counts: Sequence[int] | None) -> None:
    """``start_all_to_all``'s counts come together (split sizes) or not at all (equal blocks); one alone would
    send one layout and receive another."""
    if (send_counts is None) != (recv_counts is None):
        given, missing = ("send_counts", "recv_counts") if recv_counts is None else ("recv_counts", "send_counts")
        raise ValueError(f"start_all_to_all got {given} without {missing}; give both (split sizes) or neither "
                         f"(equal blocks)")


class Transport(abc.ABC):
    """Point-to-point messaging among ``size`` ranks, plus the group's own ("native") collectives."""

    #: Short name shown in logs and errors (``"mpi"``, ``"torch:gloo"``, ``"threads"``).
    name: str = "transport"
    #: Set by each implementation's constructor.
    _rank: int
    _size: int
    #: Seconds a blocking call waits for its peers before raising ``Stalled`` (set by :meth:`attach`).
    timeout_s: float = 300.0
    #: Communicator rank of each transport rank, for naming peers in errors (set by :meth:`attach`).
    ranks: tuple[int, ...] = ()

    def attach(self, ranks: Sequence[int], timeout_s: float) -> None:
        """Tell the transport its peers' communicator ranks and how long it may wait for them."""
        self.ranks = tuple(ranks)
        self.timeout_s = timeout_s

    def communicator_ranks(self, peers: Sequence[int]) -> list[int]:
        """``peers`` (transport ranks) as communicator ranks, when :meth:`attach` told them."""
        return [self.ranks[p] for p in peers] if self.ranks else list(peers)

    def others(self) -> list[int]:
        """Every transport rank but this one (who a stalled native collective may be waiting for)."""
        return [p for p in range(self.size) if p != self.rank]

    @property
    def rank(self) -> int:
        """This rank's index in the group, ``0 <= rank < size``."""
        return self._rank

    @property
    def size(self) -> int:
        """Number of ranks in the group."""
        return self._size

    @abc.abstractmethod
    def send(self, tensor: torch.Tensor, dest: int) -> None:
        """Send ``tensor`` to ``dest``; returns once ``tensor`` may be reused."""

    @abc.abstractmethod
    def recv(self, tensor: torch.Tensor, source: int) -> None:
        """Receive exactly ``tensor.numel()`` elements from ``source`` into ``tensor``."""

    @abc.abstractmethod
    def sendrecv(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int) -> None:
        """Send ``send`` to ``dest`` while receiving ``recv`` from ``source`` (deadlock-free exchange)."""

    def sendrecv_posted(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int,
                        posted: list) -> None:
        """:meth:`sendrecv` that may return once ``recv`` has arrived, with the send still in flight: it is then
        kept in ``posted`` until :meth:`complete_posted`, and ``send`` must not be written before that. For the
        schedules whose send buffers are never written again (all-gathers, reduce-scatter by recursive halving or
        pairwise, all-to-all): where a transport reports a send complete only once its peer has acknowledged it,
        waiting for that every step costs a round trip a step instead of a one-way latency. Here: a plain
        :meth:`sendrecv`."""
        self.sendrecv(send, dest, recv, source)

    def complete_posted(self, posted: list) -> None:
        """Complete the sends :meth:`sendrecv_posted` left in ``posted`` (within the deadline) and empty it."""
        posted.clear()

    # Native collectives: the group's own implementation (MPI library, NCCL/gloo), used by the
    # "mpi"/"vendor" algorithms and by the intra-node phase of the hierarchical compositions.
    def native_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """``out`` (size x inp.numel()) receives every rank's ``inp`` in rank order."""
        raise NotImplementedError(f"{self.name} has no native all-gather")

    def native_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp) -> None:
        """``out`` receives block ``rank`` of the element-wise ``op`` over every rank's ``inp``."""
        raise NotImplementedError(f"{self.name} has no native reduce-scatter")

    def native_all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        """In place element-wise ``op`` over every rank's ``tensor``."""
        raise NotImplementedError(f"{self.name} has no native all-reduce")

    def native_all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: Sequence[int],
                          recv_counts: Sequence[int]) -> None:
        """Consecutive blocks of ``inp`` (``send_counts[j]`` elements) go to rank ``j``; consecutive blocks of
        ``out`` (``recv_counts[i]`` elements) come from rank ``i``."""
        raise NotImplementedError(f"{self.name} has no native all-to-all")

    # Non-blocking native collectives, for schedules that overlap several (the pipelined hierarchy): each
    # returns a started request that ``wait`` completes within the transport's deadline.
    def start_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> object:
        """Start the native all-gather of ``inp`` into ``out``; returns the request for :meth:`wait`."""
        raise NotImplementedError(f"{self.name} has no non-blocking all-gather")

    def start_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp) -> object:
        """Start the native reduce-scatter: ``out`` receives block ``rank`` of the ``op`` over every ``inp``."""
        raise NotImplementedError(f"{self.name} has no non-blocking reduce-scatter")

    def start_all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> object:
        """Start the native in-place all-reduce of ``tensor``."""
        raise NotImplementedError(f"{self.name} has no non-blocking all-reduce")

    def start_all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: Sequence[int] | None = None,
                         recv_counts: Sequence[int] | None = None) -> object:
        """Start the native all-to-all: block ``j`` of ``inp`` goes to rank ``j``, block ``i`` of ``out`` comes
        from rank ``i`` (bytes, so any dtype); ``size`` equal blocks each, or ``send_counts`` / ``recv_counts``
        elements a block (both or neither)."""
        raise NotImplementedError(f"{self.name} has no non-blocking all-to-all")

    def wait(self, request: object, what: str) -> None:
        """Complete a request a ``start_*`` call returned, within the deadline."""
        raise NotImplementedError(f"{self.name} has no non-blocking collectives")

    #: Whether the transport needs host memory (CUDA tensors are staged through it).
    host_memory_only: bool = False
    #: Whether the transport takes host tensors (MPI, gloo, threads; not NCCL): what the control level must do.
    host_capable: bool = True

    def control_device(self, data_device: torch.device) -> torch.device:
        """Where the small tensors a collective exchanges about itself (counts, signatures) go, for data on
        ``data_device``: the host where the transport needs host memory (nothing to stage), else the data's device
        (NCCL takes CUDA tensors only)."""
        return torch.device("cpu") if self.host_memory_only else data_device

    def reduces(self, dtype: torch.dtype) -> bool:
        """Whether the native reductions take tensors of ``dtype`` as they are (else: a float32 copy)."""
        return True

    def barrier(self) -> None:
        """Return once every rank has called it (benchmarks start each timed call from one)."""
        self.native_all_reduce(torch.zeros(1), ReduceOp.SUM)

    def broadcast_json(self, value: object, root: int = 0) -> object:
        """``root``'s ``value`` (anything ``json`` writes) on every rank: set-up agreement (the selector profile),
        over the native all-gather, so it works on every transport. Collective; not for the data path."""
        mine = json.dumps(value).encode() if self.rank == root else b""
        lengths = torch.empty(self.size, dtype=torch.int64)
        self.native_all_gather(lengths, torch.tensor([len(mine)], dtype=torch.int64))
        width = int(lengths.max())
        rows = torch.empty(self.size * width, dtype=torch.uint8)
        padded = torch.zeros(width, dtype=torch.uint8)
        padded[:len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8) if mine else padded[:0]
        self.native_all_gather(rows, padded)
        return json.loads(rows[root * width:root * width + int(lengths[root])].numpy().tobytes())

    def abort(self) -> None:
        """After a failure: make peers still waiting on this transport fail at once where the library can
        (ULFM's revoke); a no-op by default. Local only, never waits."""

    def close(self) -> None:
        """Release what the transport owns (communicators, groups). Idempotent."""
