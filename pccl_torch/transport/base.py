"""The point-to-point interface every algorithm is written against.

An algorithm sees only ``rank``, ``size`` and these calls, so the same schedule runs over mpi4py, over an
intra-node torch.distributed group, and over the in-process threaded transport the unit tests use.
Messages between a pair of ranks are delivered in the order they were sent (MPI's non-overtaking rule);
algorithms rely on it and use no tags. Buffers are flat, contiguous tensors.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import torch

from pccl_torch.ops import ReduceOp


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

    def abort(self) -> None:
        """After a failure: make peers still waiting on this transport fail at once where the library can
        (ULFM's revoke); a no-op by default. Local only, never waits."""

    def close(self) -> None:
        """Release what the transport owns (communicators, groups). Idempotent."""
