"""Work handles and each group's queue: the one place of pccl's part of ProcessGroupNCCL's contract.

What a caller of a collective sees, and where it is decided (``docs/gpus.md``, "CUDA semantics"):

- **One FIFO per group.** Every call on a communicator, pccl's own and those handed to the vendor library alike
  (``torch_backend``: broadcast, barrier, bypassed dtypes), runs in issue order: through
  :meth:`Queue.submit`/:meth:`Queue.issue`, never beside the queue.
- **CPU tensors.** ``async_op=True`` calls run on one worker thread per communicator (``PCCL_ASYNC=thread``) or at
  once in the caller's thread (``inline``); a blocking call waits for the queued ones, then runs in the caller's
  thread. :meth:`Work.wait` blocks the host, as gloo's does.
- **CUDA tensors: enqueue and return.** Each communicator has an *order stream*. At issue the order stream waits
  for the caller's current stream (the dependency is taken then, as NCCL records its event at enqueue, not when
  a worker happens to run), and the call's end is recorded on it. :meth:`Work.wait` makes the *current* stream wait
  for that end and returns; the host blocks only in :meth:`Work.synchronize` or ``wait(timeout)``. Sync calls are
  async calls waited this way.

  - Where every level the plan crosses is a device library (NCCL: torchrun, DeepSpeed's launcher, one node), the
    calling thread enqueues the plan's NCCL calls on the order stream itself: a chain of NCCL calls, stream-ordered
    by construction, nothing on the host.
  - Where a level is MPI over host staging, the worker thread runs the MPI part. At issue the order stream is
    given a *gate* (:class:`HostGate`: ``cuStreamWaitValue32`` on a pinned flag, through the CUDA driver) and the
    call's end is recorded behind it; the worker's copies wait for an event recorded at issue, and when its
    host-to-device copies are queued it opens the gate in their stream order (``cuStreamWriteValue32``). The
    calling thread never waits for MPI: a call over device libraries only, issued while earlier calls are still on
    the worker, follows them there behind the gate. Without the driver's stream memory operations,
    :meth:`Work.wait` falls back to waiting on the host for the worker (logged once).

  The worker thread sets its device once, when it starts.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)


class Work:
    """Handle of one collective: ``wait()``, ``synchronize()``, ``is_completed()``, ``result()`` (as torch's Work).

    On CUDA (``end`` given: the event recorded on the group's order stream at issue) :meth:`wait` orders the current
    stream after the collective and returns at once."""

    def __init__(self, future: concurrent.futures.Future[Any], collective: str, algorithm: str, *,
                 end: torch.cuda.Event | None = None, gated: bool = True, output: Any = None) -> None:
        self._future = future
        self.collective = collective
        self.algorithm = algorithm
        self._end = end
        self._gated = gated
        """Whether ``end`` follows the worker's part in stream order (else :meth:`wait` waits for it on the host)."""
        self._output = output
        """What the collective produces (the output tensor), known at issue on CUDA."""

    def wait(self, timeout: float | None = None) -> bool:
        """CPU: block until done. CUDA: make the current stream wait for the collective and return; with
        ``timeout``, or where the device cannot wait for the worker (no gate), block the host as well. Re-raises
        the collective's error once known; ``TimeoutError`` after ``timeout`` s."""
        end = self._end
        if end is not None and timeout is None and self._gated:
            error = self.exception()
            if error is not None:
                raise error
            torch.cuda.current_stream().wait_event(end)
            return True
        try:
            self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{self.collective} ({self.algorithm}) not complete after {timeout} s") from None
        if end is not None:
            torch.cuda.current_stream().wait_event(end)
            if timeout is not None:
                end.synchronize()
        return True

    def synchronize(self) -> None:
        """Block the host until the collective has finished, on the device too (torch's ``Work.synchronize``)."""
        self._future.result()
        if self._end is not None:
            self._end.synchronize()

    def is_completed(self) -> bool:
        """True once the collective has finished (successfully or not), on the device too."""
        if not self._future.done():
            return False
        return self._end is None or self._future.exception() is not None or self._end.query()

    def is_success(self) -> bool:
        """True once the collective has finished without error."""
        return self.is_completed() and self._future.exception() is None

    def exception(self) -> BaseException | None:
        """The error the collective raised, if it finished with one."""
        return self._future.exception() if self._future.done() else None

    def result(self) -> Any:
        """Wait (as :meth:`wait`), then the output tensor."""
        self.wait()
        return self._output if self._end is not None else self._future.result()

    @property
    def on_device(self) -> bool:
        """Whether the collective is ordered on a CUDA stream (its waits order streams, not the host)."""
        return self._end is not None

    def get_future(self) -> torch.futures.Future:
        """A ``torch.futures.Future`` completed with the output tensor (for DDP-style hooks). On CUDA it is
        device-aware and completed at once (:func:`device_future`), as NCCL's futures are."""
        if self._end is not None:
            return device_future(self.wait, self._output)
        fut = torch.futures.Future()

        def forward(done: concurrent.futures.Future[Any]) -> None:
            error = done.exception()
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(done.result())

        self._future.add_done_callback(forward)
        return fut


def device_future(wait: Callable[[], Any], value: Any, then: Callable[[], Any] | None = None) -> torch.futures.Future:
    """A device-aware ``torch.futures.Future`` holding ``value``, completed now: on a side stream that ran ``wait``
    (a Work's wait: the stream waits for the collective) and then ``then`` (copies out, in stream order), so its
    ``wait()``/``value()`` make the current stream wait for both, and the host never does (torch's NCCL futures)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # ``then`` may read what the caller queued
    with torch.cuda.stream(stream):
        wait()
        if then is not None:
            then()
        fut = torch.futures.Future(devices=[torch.device("cuda", torch.cuda.current_device())])
        fut.set_result(value)
    return fut


def _run(fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    """``fn()`` now, its result or error in a completed future (the Work handle re-raises it)."""
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()
    try:
        done.set_result(fn())
    except Exception as exc:  # noqa: BLE001 - kept for the Work handle, as with the worker thread
        done.set_exception(exc)
    return done


class HostGate:
    """A point in a stream that opens when work the host drives is done: a pinned 32-bit flag that a stream waits
    to reach a value (``cuStreamWaitValue32``) and another stream writes (``cuStreamWriteValue32``), both through
    the CUDA driver. :meth:`available` says whether this driver has them."""

    _WAIT_GEQ = 0x0
    _WRITE_DEFAULT = 0x0

    def __init__(self, device: torch.device) -> None:
        self._driver = _driver_stream_memops()
        self._flag = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self._address = self._flag.data_ptr()  # unified addressing: the pinned page's device address is its own
        self.issued = 0
        self.device = device

    @staticmethod
    def available() -> bool:
        return _driver_stream_memops() is not None

    @classmethod
    def tried(cls, device: torch.device) -> HostGate:
        """A gate whose wait and write were tried once on a private stream (a device without stream memory
        operations fails here, ``RuntimeError``, not in a collective)."""
        gate = cls(device)
        probe = torch.cuda.Stream(device)
        number = gate.close_behind(probe)
        gate.open_after(torch.cuda.Stream(device), number)
        probe.synchronize()
        return gate

    def close_behind(self, stream: torch.cuda.Stream) -> int:
        """Make ``stream`` wait until the gate of the next call opens; its number."""
        self.issued += 1
        wait, _ = self._driver
        _check(wait(ctypes.c_void_p(stream.cuda_stream), ctypes.c_uint64(self._address),
                    ctypes.c_uint32(self.issued & 0xFFFFFFFF), ctypes.c_uint(self._WAIT_GEQ)), "cuStreamWaitValue32")
        return self.issued

    def open_after(self, stream: torch.cuda.Stream, number: int) -> None:
        """Open gate ``number`` once what ``stream`` holds so far is done."""
        _, write = self._driver
        _check(write(ctypes.c_void_p(stream.cuda_stream), ctypes.c_uint64(self._address),
                     ctypes.c_uint32(number & 0xFFFFFFFF), ctypes.c_uint(self._WRITE_DEFAULT)), "cuStreamWriteValue32")


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with CUDA driver error {status}")


@functools.cache
def _driver_stream_memops() -> tuple[Callable, Callable] | None:
    """The driver's ``cuStreamWaitValue32`` and ``cuStreamWriteValue32`` (their ``_v2`` forms where exported), or
    None where there is no CUDA driver or it lacks them."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    found = []
    for name in ("cuStreamWaitValue32", "cuStreamWriteValue32"):
        function = getattr(driver, f"{name}_v2", None) or getattr(driver, name, None)
        if function is None:
            return None
        function.restype = ctypes.c_int
        function.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        found.append(function)
    return found[0], found[1]


class Queue:
    """One communicator's FIFO: every call on it, pccl's own and delegated, runs in issue order (module docstring).

    CPU: a lazily started worker thread, or (``inline``) the caller's thread. CUDA: the order stream, the gate, and
    the worker for what the host drives."""

    def __init__(self, name: str, *, inline: bool = False, device: torch.device | None = None) -> None:
        self._name = name
        self.inline = inline
        self.cuda = device if device is not None and device.type == "cuda" else None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._last: concurrent.futures.Future[Any] | None = None
        self._lock = threading.Lock()
        self._order: torch.cuda.Stream | None = None
        self._worker_stream: torch.cuda.Stream | None = None
        self._gate: HostGate | None = None
        self._gate_tried = False
        self._warned = False

    # -- CPU -----------------------------------------------------------------------------------------------
    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Queue ``fn``; its future holds the result or the error (inline: already done on return)."""
        if self.inline:
            return _run(fn)
        with self._lock:
            if self._pool is None:
                initializer = (functools.partial(torch.cuda.set_device, self.cuda) if self.cuda is not None
                               else None)  # the worker's device, set once (else it would make a context on GPU 0)
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self._name,
                                                                   initializer=initializer)
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

    @property
    def busy(self) -> bool:
        """Whether calls may still be queued or running on the worker."""
        last = self._last
        return last is not None and not last.done()

    # -- CUDA ----------------------------------------------------------------------------------------------
    def order_stream(self) -> torch.cuda.Stream:
        """The stream every call of the communicator is ordered on (created at the first CUDA call)."""
        if self._order is None:
            self._order = torch.cuda.Stream(self.cuda)
        return self._order

    def issue(self, fn: Callable[[], Any], *, host_driven: bool, tensors: tuple[torch.Tensor | None, ...] = ()
              ) -> tuple[concurrent.futures.Future[Any], torch.cuda.Event, bool]:
        """Enqueue ``fn`` (a call on CUDA tensors) in the group's order; returns (its future, the end event, whether
        the end follows the call in stream order). Never waits on the host for the network.

        ``host_driven`` False: every level is a device library; ``fn`` enqueues its NCCL calls on the order stream
        now, in this thread (or, while earlier calls are still on the worker, on the worker after them, behind the
        gate, as a host-driven call). True: the worker runs it behind the gate (module docstring). ``tensors``
        (the caller's buffers) are marked in use by pccl's streams, so that the caching allocator does not hand
        their memory out again before the call is done with it, whenever the caller frees them."""
        caller = torch.cuda.current_stream(self.cuda)
        order = self.order_stream()
        order.wait_stream(caller)  # the dependency on the caller's work, taken at issue
        if not host_driven and self.busy and self._gate_or_none() is not None:
            host_driven = True  # earlier calls still on the worker: this one follows them there, behind the gate,
            # rather than this thread waiting for them (it may use a level they use: the control level, with checks)
        worker = self.worker_stream() if host_driven else None
        for tensor in tensors:
            if tensor is not None:
                tensor.record_stream(order)
                if worker is not None:
                    tensor.record_stream(worker)
        if not host_driven:
            if self.busy:  # no gate (the driver lacks stream memory operations): the group's order on the host
                self.drain()
            with torch.cuda.stream(order):
                future = _run(fn)
            end = torch.cuda.Event()
            end.record(order)
            return future, end, True
        ready = torch.cuda.Event()
        ready.record(order)  # the caller's work and every earlier call of the group
        gate = self._gate_or_none()
        number = gate.close_behind(order) if gate is not None else 0
        end = torch.cuda.Event()
        end.record(order)
        future = self.submit(functools.partial(self._behind_gate, fn, ready, gate, number))
        if gate is None and not self._warned:
            self._warned = True
            log.warning("pccl: this CUDA driver has no stream memory operations (cuStreamWaitValue32): waits on "
                        "collectives that cross MPI block the host until the worker finishes")
        return future, end, gate is not None

    def _behind_gate(self, fn: Callable[[], Any], ready: torch.cuda.Event, gate: HostGate | None,
                     number: int) -> Any:
        """The worker's part: ``fn`` on the worker's stream after ``ready``; then the gate opens behind its copies
        (also when it failed: the device must never wait for a flag nobody will write)."""
        stream = self.worker_stream()
        stream.wait_event(ready)
        try:
            with torch.cuda.stream(stream):
                return fn()
        finally:
            if gate is not None:
                gate.open_after(stream, number)
            else:
                stream.synchronize()  # no gate: the end event must not fire before the results are there

    def worker_stream(self) -> torch.cuda.Stream:
        """The stream the worker's part of a host-driven call runs on (created by the issuing thread)."""
        if self._worker_stream is None:
            self._worker_stream = torch.cuda.Stream(self.cuda)
        return self._worker_stream

    def _gate_or_none(self) -> HostGate | None:
        """The group's gate, made at the first host-driven call where the driver's stream memory operations work
        (tried once on a stream of its own); None where they do not."""
        if self._gate is None and not self._gate_tried:
            self._gate_tried = True
            if HostGate.available():
                try:
                    self._gate = HostGate.tried(self.cuda)
                except RuntimeError as exc:
                    log.warning("pccl: the CUDA driver's stream memory operations failed (%s)", exc)
        return self._gate

    def shutdown(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            self._last = None

