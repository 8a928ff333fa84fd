"""An in-process transport: every rank is a thread, every message a tensor copy in a FIFO queue.

It lets unit tests run an algorithm's real schedule at 1..128 ranks in one process, in milliseconds,
and catch a schedule that deadlocks (a receive that times out) or misroutes data. Native collectives are
computed from every rank's contribution in rank order, so they are deterministic references too.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from pccl_torch.ops import ReduceOp
from pccl_torch.transport.base import Transport, check_split_counts

from pccl_torch.triton_kernels import reduce_

DEFAULT_TIMEOUT_S = 60.0


class ThreadedWorld:
    """``size`` ranks living in one process; :meth:`run` executes one function per rank in threads."""

    def __init__(self, size: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if size < 1:
            raise ValueError(f"a ThreadedWorld needs at least 1 rank, got {size}")
        self.size = size
        self.timeout_s = timeout_s
        self._queues: dict[tuple[int, int], queue.Queue[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(size)
        self._slots: list[torch.Tensor | None] = [None] * size
        self.transports = [ThreadedTransport(self, r) for r in range(size)]

    def channel(self, source: int, dest: int) -> queue.Queue[torch.Tensor]:
        key = (source, dest)
        with self._lock:
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = queue.Queue()
            return q

    def exchange(self, rank: int, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank contributes ``tensor``; every rank gets all contributions in rank order."""
        self._slots[rank] = tensor.clone()
        self._barrier.wait(self.timeout_s)
        contributions = [t for t in self._slots if t is not None]
        self._barrier.wait(self.timeout_s)
        return contributions

    def run(self, fn: Callable[..., Any], per_rank_args: Sequence[Sequence[Any]] | None = None) -> list[Any]:
        """Run ``fn(transport, *per_rank_args[r])`` on every rank; return results in rank order.

        The first exception raised by any rank is re-raised here (after all threads have ended).
        """
        args = per_rank_args if per_rank_args is not None else [()] * self.size
        results: list[Any] = [None] * self.size
        errors: list[BaseException] = []

        def body(r: int) -> None:
            try:
                results[r] = fn(self.transports[r], *args[r])
            except BaseException as exc:  # noqa: BLE001 - reported to the caller below
                errors.append(exc)
                self._barrier.abort()

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.timeout_s * 4)
            if t.is_alive():
                raise TimeoutError(f"a rank of the ThreadedWorld({self.size}) did not finish: deadlock?")
        if errors:
            raise errors[0]
        return results


class ThreadedTransport(Transport):
    """One rank's view of a :class:`ThreadedWorld`."""

    name = "threads"

    def __init__(self, world: ThreadedWorld, rank: int) -> None:
        self._world = world
        self._rank = rank
        self._size = world.size

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.size:
            raise ValueError(f"peer {peer} out of range for {self.size} ranks")

    def send(self, tensor: torch.Tensor, dest: int) -> None:
        self._check_peer(dest)
        self._world.channel(self._rank, dest).put(tensor.clone())

    def recv(self, tensor: torch.Tensor, source: int) -> None:
        self._check_peer(source)
        try:
            message = self._world.channel(source, self._rank).get(timeout=self._world.timeout_s)
        except queue.Empty:
            raise TimeoutError(f"rank {self._rank}: no message from rank {source} (schedule deadlock?)") from None
        if message.numel() != tensor.numel() or message.dtype != tensor.dtype:
            raise RuntimeError(
                f"rank {self._rank}: message from {source} has {message.numel()} x {message.dtype}, "
                f"expected {tensor.numel()} x {tensor.dtype}"
            )
        tensor.copy_(message)

    def sendrecv(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int) -> None:
        self.send(send, dest)  # queued, so sending first cannot deadlock
        self.recv(recv, source)

    def sendrecv_posted(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int,
                        posted: list) -> None:
        """Exchanges at once, and keeps the send buffer with a copy of its bytes: :meth:`complete_posted` checks the
        contract a transport with sends in flight relies on (no schedule writes a posted send's buffer before)."""
        self.sendrecv(send, dest, recv, source)
        posted.append((send, send.clone()))

    def complete_posted(self, posted: list) -> None:
        for send, sent in posted:
            if not torch.equal(send.reshape(-1).view(torch.uint8), sent.reshape(-1).view(torch.uint8)):
                raise RuntimeError(f"rank {self._rank}: a send buffer was written while its send was in flight "
                                   "(before complete_posted)")
        posted.clear()

    def _reduced(self, tensor: torch.Tensor, op: ReduceOp) -> torch.Tensor:
        parts = self._world.exchange(self._rank, tensor)
        return functools.reduce(lambda acc, x: reduce_(acc, x, op), parts[1:], parts[0].clone())

    def native_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        out.copy_(torch.cat(self._world.exchange(self._rank, inp)))

    def native_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp) -> None:
        n = out.numel()
        out.copy_(self._reduced(inp, op)[self._rank * n : (self._rank + 1) * n])

    def native_all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        tensor.copy_(self._reduced(tensor, op))

    def native_all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: Sequence[int],
                          recv_counts: Sequence[int]) -> None:
        counts = self._world.exchange(self._rank, torch.tensor(list(send_counts), dtype=torch.int64))
        payloads = self._world.exchange(self._rank, inp)
        pieces = []
        for source, (theirs, payload) in enumerate(zip(counts, payloads)):
            start = int(theirs[:self._rank].sum())
            pieces.append(payload[start:start + recv_counts[source]])
        if out.numel():
            torch.cat(pieces, out=out)

    # The non-blocking forms run at once: every rank starts the same steps in the same order (the pipelined
    # schedules' rule), so running each to completion when it starts cannot deadlock.
    def start_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self.native_all_gather(out, inp)

    def start_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp) -> None:
        self.native_reduce_scatter(out, inp, op)

    def start_all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        self.native_all_reduce(tensor, op)

    def start_all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: Sequence[int] | None = None,
                         recv_counts: Sequence[int] | None = None) -> None:
        check_split_counts(send_counts, recv_counts)
        if send_counts is not None:
            return self.native_all_to_all(out, inp, send_counts, recv_counts)
        width = inp.numel() // self.size
        parts = self._world.exchange(self._rank, inp)
        out.copy_(torch.cat([part[self._rank * width:(self._rank + 1) * width] for part in parts]))

    def wait(self, request: None, what: str) -> None:
        return None
