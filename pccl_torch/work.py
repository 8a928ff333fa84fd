"""Work handles and the per-communicator worker that runs collectives in issue order.

Asynchronous calls (``async_op=True``) are queued on one worker thread per communicator, so every rank
runs its collectives in the order it issued them (what MPI and NCCL require). A blocking call first
waits for the queued ones, then runs in the caller's thread without a thread hop. An inline executor runs
every call at once in the caller's thread and hands back a completed future (``PCCL_ASYNC=inline``).

On CUDA a queued call runs on the stream that was current where it was issued (torch's current stream is
per thread): the call's work waits for what the caller queued before it, and the caller's stream is made to
wait for the call's results, as torch.distributed's NCCL work does.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Callable
from typing import Any

import torch


class Work:
    """Handle of one collective: ``wait()``, ``is_completed()``, ``result()`` (as torch's Work)."""

    def __init__(self, future: concurrent.futures.Future[Any], collective: str, algorithm: str) -> None:
        self._future = future
        self.collective = collective
        self.algorithm = algorithm

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; re-raises the collective's error. ``TimeoutError`` after ``timeout`` s."""
        try:
            self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"{self.collective} ({self.algorithm}) not complete after {timeout} s"
            ) from None
        return True

    def is_completed(self) -> bool:
        """True once the collective has finished (successfully or not)."""
        return self._future.done()

    def is_success(self) -> bool:
        """True once the collective has finished without error."""
        return self._future.done() and self._future.exception() is None

    def exception(self) -> BaseException | None:
        """The error the collective raised, if it finished with one."""
        return self._future.exception() if self._future.done() else None

    def result(self) -> Any:
        """Wait, then return the output tensor."""
        return self._future.result()

    def get_future(self) -> torch.futures.Future:
        """A ``torch.futures.Future`` completed with the output tensor (for DDP-style hooks)."""
        fut: torch.futures.Future = torch.futures.Future()

        def forward(done: concurrent.futures.Future[Any]) -> None:
            error = done.exception()
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(done.result())

        self._future.add_done_callback(forward)
        return fut


class OrderedExecutor:
    """Runs submitted calls one at a time, in submission order, on a lazily started worker thread, or
    (``inline``) at once in the submitting thread."""

    def __init__(self, name: str, *, inline: bool = False, device: torch.device | None = None) -> None:
        self._name = name
        self.inline = inline
        self._cuda = device if device is not None and device.type == "cuda" else None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._last: concurrent.futures.Future[Any] | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Queue ``fn``; its future holds the result or the error (inline: already done on return)."""
        if self.inline:
            done: concurrent.futures.Future[Any] = concurrent.futures.Future()
            try:
                done.set_result(fn())
            except Exception as exc:  # the Work handle re-raises it, as with the worker thread
                done.set_exception(exc)
            return done
        if self._cuda is not None:
            fn = functools.partial(_on_stream, torch.cuda.current_stream(self._cuda), fn)
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self._name)
            self._last = self._pool.submit(fn)
            return self._last

    def run_now(self, fn: Callable[[], Any]) -> Any:
        """Wait for everything queued, then run ``fn`` in this thread."""
        self.drain()
        return fn()

    def drain(self) -> None:
        """Wait until every queued call has finished (their errors stay with their Work handles)."""
        last = self._last
        if last is not None:
            concurrent.futures.wait([last])
            with self._lock:
                if self._last is last:  # nothing queued since: later blocking calls need not wait
                    self._last = None

    def shutdown(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            self._last = None


def _on_stream(stream: torch.cuda.Stream, fn: Callable[[], Any]) -> Any:
    """``fn()`` with ``stream`` as this thread's current stream (the issuing thread's, for a queued call)."""
    with torch.cuda.stream(stream):
        return fn()
