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

**The streams, and why the device's queue has no cycle.** Every stream pccl waits on or writes a gate on is its
own (``pccl_torch.cuda_streams.new_stream``: created through the driver, never one of torch's 32 pool streams
that ProcessGroupNCCL, FSDP2 and the user share), made once per owner, never per call:

==================  ==========================  ============================================================
stream              who queues on it            what
==================  ==========================  ============================================================
order (per group)   the issuing thread          waits for the caller's stream; gate waits; end events; NCCL
                                                calls of device-only plans; device futures' copies out
worker (per group)  the worker thread only      waits for the ``ready`` event of its call; the call's work;
                                                the gate's write (last)
staging down/up     the worker thread only      device-to-host / host-to-device copies of one transport
(per transport)
==================  ==========================  ============================================================

A wait is never queued ahead of the write it waits for on the same stream: gate ``k``'s wait is on the order
stream, its write on the worker stream, which holds nothing but the worker's own calls in FIFO order, each
behind a ``ready`` event recorded on the order stream *before* gate ``k``'s wait (so before any wait the write
could be stuck behind). The staging streams wait only for the worker stream's past, and each belongs to one
transport (one worker): two groups' workers never share one. Nobody but pccl can queue work on these streams, so
no user stream, torch Future callback or FSDP2 copy can sit between a wait and its write.

**Failures** (NCCL's async error handling): a call that fails on the worker breaks the group (:attr:`Queue.failure`),
its output is poisoned with NaN where it holds floats (never a half-written result that looks done; a mismatch,
found before any data moved, leaves the buffer as given), and then its gate opens (the device never waits on a
flag nobody will write). The error is raised by the next ``wait()``, ``synchronize()`` or call on the group, from
any thread of the rank.

**Capture**: a host-driven call under CUDA graph capture is refused with a :class:`~pccl_torch.errors.PcclError`
naming capture and the plan; device-only plans are captured as NCCL's calls are.

**Memory** (``pccl_torch.workspace``): the worker neither allocates nor frees device memory while a gate may be
closed. Why: the caller's buffers are ``record_stream``-ed on the order stream at issue, so their free events sit
behind the closed gates, and a caching-allocator retry (an allocation missing the cache under memory pressure, or
``empty_cache``) waits for every such event, and ``cudaFree``-s, holding the allocator's lock: a worker that
allocated then, or waited for that lock, would wait for the gate it must open. How:

- the issuing thread allocates the call's *workspace* (sized by ``Plan.workspace``: the schedules' temporaries,
  and two lanes for the conversions of staged copies and 16-bit reductions) before it closes the gate, and marks
  it in use on the worker's stream; two calls never share one;
- the worker takes every device temporary from it (``scratch.empty``, ``workspace.empty``/``lane``); a call that
  would take more fails with ``WorkspaceExhausted`` instead of allocating;
- marks: the caller's buffers on the order stream (and the worker's, for host-driven calls), the workspace on the
  worker's stream; the staging streams that read both, and NCCL's, are joined back into the worker's stream
  before the gate opens, so those events cover them too (marking them from the worker would take the lock);
- the queue keeps each call's workspace and tensors until an issuing thread sees the call done (``_release_done``,
  at the next issue or drain), so the worker never drops the last reference to device memory;
- a device future marks what its copies out write on the order stream, where they run.

Left on a worker, named in ``pccl_torch.workspace``: an uneven two-level all-to-all's regrouped blocks (sized by
the node's count exchange, on the worker), compressed plans' temporaries (unless pipelined), and what libraries
do inside their calls (ProcessGroupNCCL's ``recordStream`` may take the allocator's lock, unless
``TORCH_NCCL_AVOID_RECORD_STREAMS=1``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pccl_torch import workspace
from pccl_torch.cuda_streams import _check, host_wait, new_stream
from pccl_torch.errors import CommunicatorBrokenError, PcclError, PcclMismatchError

log = logging.getLogger(__name__)


class Work:
    """Handle of one collective: ``wait()``, ``synchronize()``, ``is_completed()``, ``result()`` (as torch's Work).

    On CUDA (``end`` given: the event recorded on the group's order stream at issue) :meth:`wait` orders the current
    stream after the collective and returns at once."""

    def __init__(self, future: concurrent.futures.Future[Any], collective: str, algorithm: str, *,
                 end: torch.cuda.Event | None = None, gated: bool = True, output: Any = None,
                 queue: Queue | None = None) -> None:
        self._future = future
        self.collective = collective
        self.algorithm = algorithm
        self._end = end
        self._gated = gated
        """Whether ``end`` follows the worker's part in stream order (else :meth:`wait` waits for it on the host)."""
        self._output = output
        """What the collective produces (the output tensor), known at issue on CUDA."""
        self.queue = queue
        """The group's queue (CUDA): its order stream, and the failure of any call of the group (raised here)."""

    def wait(self, timeout: float | None = None) -> bool:
        """CPU: block until done. CUDA: make the current stream wait for the collective and return; with
        ``timeout``, or where the device cannot wait for the worker (no gate), block the host as well. Raises the
        collective's error, or (CUDA) that of any failed call of the group, once known; ``TimeoutError`` after
        ``timeout`` s."""
        end = self._end
        if end is not None and timeout is None and self._gated:
            self._raise_failure()
            torch.cuda.current_stream().wait_event(end)
            return True
        try:
            self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{self.collective} ({self.algorithm}) not complete after {timeout} s") from None
        if end is not None:
            self._raise_failure()
            torch.cuda.current_stream().wait_event(end)
            if timeout is not None:
                end.synchronize()
        return True

    def synchronize(self) -> None:
        """Block the host until the collective has finished, on the device too (torch's ``Work.synchronize``)."""
        self._future.result()
        if self._end is not None:
            self._raise_failure()
            self._end.synchronize()

    def _raise_failure(self) -> None:
        """Raise this call's error, or the group's first failure (NCCL's async error handling: a call that failed on
        the worker breaks the group, and every later wait of the rank raises)."""
        error = self.exception()
        if error is not None:
            raise error
        if self.queue is not None:
            self.queue.raise_if_failed()

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
            return device_future(self, self._output)
        fut = torch.futures.Future()

        def forward(done: concurrent.futures.Future[Any]) -> None:
            error = done.exception()
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(done.result())

        self._future.add_done_callback(forward)
        return fut


def device_future(work: Work, value: Any, then: Callable[[], Any] | None = None) -> torch.futures.Future:
    """A device-aware ``torch.futures.Future`` holding ``value``, completed now, on the group's order stream behind
    ``work`` (a CUDA Work of that group): ``then`` (copies out) runs there in stream order, so the future's
    ``wait()``/``value()`` make the current stream wait for both and the host never does (torch's NCCL futures).

    The order stream, not a stream per call: it is pccl's own (``pccl_torch.cuda_streams``), ``work``'s end is
    already on it, and the buffers the copies read were marked in use there at issue; every tensor of ``value``
    (what ``then`` writes) is marked too, so the allocator keeps them until the copies are done."""
    stream = work.queue.order_stream()
    stream.wait_stream(torch.cuda.current_stream())  # ``then`` may read what the caller queued
    with torch.cuda.stream(stream):
        work.wait()  # the order stream waits for its own end (a no-op) or, without a gate, the host for the worker
        if then is not None:
            for tensor in tensors_in(value):
                tensor.record_stream(stream)
            then()
        fut = torch.futures.Future(devices=[stream.device])
        fut.set_result(value)
    return fut


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors of ``value`` (a tensor, or (nested) lists and tuples of them, such as a ProcessGroup call's
    arguments or a c10d future's value), in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


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
    def tried(cls, device: torch.device, stream: torch.cuda.Stream) -> HostGate:
        """A gate whose write and wait were tried once on ``stream`` (pccl's own, idle: the write is queued first,
        so the wait behind it cannot block anything). A device without stream memory operations fails here,
        ``RuntimeError``, not in a collective. Waited for by an event, as sync-debug mode allows."""
        gate = cls(device)
        number = gate.issued + 1
        gate.open_after(stream, number)
        gate.close_behind(stream)
        host_wait(stream)
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
        self._held: collections.deque[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = collections.deque()
        """Calls on the worker and what they hold (their workspace, the caller's tensors): released by an issuing
        thread once done, so that the worker never frees device memory (``pccl_torch.workspace``)."""
        self.failure: BaseException | None = None
        """The first error of a call the worker ran on CUDA tensors: the group is broken from then on."""

    # -- CPU -----------------------------------------------------------------------------------------------
    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Queue ``fn``; its future holds the result or the error (inline: already done on return). On CUDA the
        device's one worker runs it (:class:`DeviceWorker`), after every call queued before on any group."""
        if self.inline:
            return _run(fn)
        if self.cuda is not None:
            self._last = device_worker(self.cuda).submit(fn)
            return self._last
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
        self._release_done()

    @property
    def busy(self) -> bool:
        """Whether calls may still be queued or running on the worker (CUDA: the device's, any group's calls)."""
        last = device_worker(self.cuda).last if self.cuda is not None else self._last
        return last is not None and not last.done()

    # -- CUDA ----------------------------------------------------------------------------------------------
    def order_stream(self) -> torch.cuda.Stream:
        """The stream every call of the communicator is ordered on (pccl's own, made at the first CUDA call)."""
        if self._order is None:
            self._order = new_stream(self.cuda)
        return self._order

    def raise_if_failed(self) -> None:
        """``CommunicatorBrokenError`` (caused by the first failure) once a call of the group failed on the worker."""
        failure = self.failure
        if failure is not None:
            raise CommunicatorBrokenError(
                f"pccl group '{self._name}' is broken: a collective failed on its worker ({failure}); every later "
                "wait, synchronize and call of this rank raises, as NCCL's async error handling does") from failure

    def issue(self, fn: Callable[[], Any], *, host_driven: bool, tensors: tuple[torch.Tensor | None, ...] = (),
              what: str = "a collective", need: workspace.Need | None = None,
              ) -> tuple[concurrent.futures.Future[Any], torch.cuda.Event, bool]:
        """Enqueue ``fn`` (a call on CUDA tensors) in the group's order; returns (its future, the end event, whether
        the end follows the call in stream order). Never waits on the host for the network.

        ``host_driven`` False: every level is a device library; ``fn`` enqueues its NCCL calls on the order stream
        now, in this thread (or, while earlier calls are still on the worker, on the worker after them, behind the
        gate, as a host-driven call). True: the worker runs it behind the gate (module docstring). ``tensors``
        (the caller's buffers, the output first) are marked in use by pccl's streams, so that the caching allocator
        does not hand their memory out again before the call is done with it, whenever the caller frees them.
        ``need``: the device memory ``fn`` takes where the worker runs it, allocated here, before the gate closes
        (``pccl_torch.workspace``). ``what`` names the call and its plan in errors. Raises before anything is
        queued on a broken group, and for a host-driven call under CUDA graph capture."""
        self.raise_if_failed()
        self._release_done()
        if not host_driven and self.busy and self._gate_or_none() is not None:
            host_driven = True  # earlier calls still on the worker: this one follows them there, behind the gate,
            # rather than this thread waiting for them (it may use a level they use: the control level, with checks)
        if host_driven and torch.cuda.is_current_stream_capturing():
            raise PcclError(
                f"pccl cannot capture {what} in a CUDA graph: it crosses MPI between nodes, which a thread of the "
                "host drives (a graph replays device work only). Issue it outside the capture, or capture only "
                "calls whose every level is NCCL (torchrun, one node), which are captured as NCCL's are")
        caller = torch.cuda.current_stream(self.cuda)
        order = self.order_stream()
        order.wait_stream(caller)  # the dependency on the caller's work, taken at issue
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
        space = self._reserve(need, worker)  # before the gate closes: the worker allocates nothing behind it
        ready = torch.cuda.Event()
        ready.record(order)  # the caller's work and every earlier call of the group
        gate = self._gate_or_none()
        number = gate.close_behind(order) if gate is not None else 0
        end = torch.cuda.Event()
        end.record(order)
        output = tensors[0] if tensors else None
        part = functools.partial(self._behind_gate, fn, ready, gate, number, output, space)
        future = self.submit(part)
        self._hold(future, part)
        if gate is None and not self._warned:
            self._warned = True
            log.warning("pccl: this CUDA driver has no stream memory operations (cuStreamWaitValue32): waits on "
                        "collectives that cross MPI block the host until the worker finishes")
        return future, end, gate is not None

    def _reserve(self, need: workspace.Need | None, worker: torch.cuda.Stream) -> workspace.Workspace | None:
        """The call's workspace, allocated by this (issuing) thread and marked in use by the worker's stream (every
        other stream that uses it joins the worker's before the call ends)."""
        if need is None or need.nbytes == 0:
            return None
        space = workspace.Workspace(need, self.cuda)
        space.memory.record_stream(worker)
        return space

    def _hold(self, future: concurrent.futures.Future[Any], part: Callable[[], Any]) -> None:
        """Keep ``part`` (the call's workspace and the caller's tensors) until an issuing thread sees it done."""
        with self._lock:
            self._held.append((future, part))

    def _release_done(self) -> None:
        """Let go of what the group's finished worker calls held: in this (issuing) thread, not the worker, since it
        may free device memory; after the lock, which the worker never takes anyway."""
        done = []
        with self._lock:
            while self._held and self._held[0][0].done():
                done.append(self._held.popleft())
        done.clear()

    def _behind_gate(self, fn: Callable[[], Any], ready: torch.cuda.Event, gate: HostGate | None,
                     number: int, output: torch.Tensor | None, space: workspace.Workspace | None = None) -> Any:
        """The worker's part: ``fn`` on the worker's stream after ``ready``, its device temporaries from ``space``
        (reserved at issue); then the gate opens behind its copies.

        A failure breaks the group first (:attr:`failure`: every later wait, synchronize and call of the rank
        raises), then poisons ``output`` (NaN where it holds floats: a consumer already queued behind the gate reads
        NaN, never a half-written result that looks done; a mismatch found before any data moved leaves it as it
        was), and only then opens the gate: the device must never wait for a flag nobody will write."""
        stream = self.worker_stream()
        stream.wait_event(ready)
        try:
            with torch.cuda.stream(stream), workspace.serving(space):
                return fn()
        except BaseException as exc:
            self._fail(exc, stream, output)
            raise
        finally:
            if gate is not None:
                gate.open_after(stream, number)
            else:
                host_wait(stream)  # no gate: the end event must not fire before the results are there

    def _fail(self, exc: BaseException, stream: torch.cuda.Stream, output: torch.Tensor | None) -> None:
        """Record the group's first failure and poison ``output`` in ``stream``'s order (see :meth:`_behind_gate`)."""
        if self.failure is None:
            self.failure = exc
        if isinstance(exc, PcclMismatchError):
            return  # found before any data moved: ``output`` holds what the caller gave, not a half-written result
        if output is not None and output.is_floating_point():
            try:
                with torch.cuda.stream(stream):
                    output.fill_(float("nan"))
            except Exception as poison:  # noqa: BLE001 - the device may be what failed; the gate must open anyway
                log.error("pccl: could not poison the output of a failed call (%s)", poison)

    def worker_stream(self) -> torch.cuda.Stream:
        """The stream the worker's part of a host-driven call runs on (pccl's own, made by the issuing thread)."""
        if self._worker_stream is None:
            self._worker_stream = new_stream(self.cuda)
        return self._worker_stream

    def _gate_or_none(self) -> HostGate | None:
        """The group's gate, made at the first host-driven call where the driver's stream memory operations work
        (tried once on a stream of its own); None where they do not."""
        if self._gate is None and not self._gate_tried:
            self._gate_tried = True
            if HostGate.available():
                try:
                    self._gate = HostGate.tried(self.cuda, self.worker_stream())  # idle: no host-driven call yet
                except RuntimeError as exc:
                    log.warning("pccl: the CUDA driver's stream memory operations failed (%s)", exc)
        return self._gate

    def shutdown(self) -> None:
        if self.cuda is not None:  # the device's worker serves other groups too: wait for this group's calls only
            self.drain()
            return
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            self._last = None


class DeviceWorker:
    """The one thread that runs the host-driven calls of every group on one CUDA device, in issue order.

    Why one a device, not one a group: a host-driven plan's NCCL parts (inside the node) are enqueued by the worker,
    after MPI steps whose timing differs between ranks. With a worker per group, two groups' NCCL enqueues (and the
    calling thread's, for device-only plans issued meanwhile) would interleave in an order set by that timing, which
    can differ between ranks: a hang where NCCL serialises communicators (``CUDA_DEVICE_MAX_CONNECTIONS=1``). With
    one worker a device, and a device-only call issued while it is busy sent behind it (:meth:`Queue.issue`), every
    NCCL enqueue of the device happens in the order calls were issued, on every rank that issues them alike, which
    is the order NCCL itself asks of its users. The cost: two groups' MPI steps between nodes no longer overlap."""

    def __init__(self, device: torch.device) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"pccl-cuda{device.index}",
                                                          initializer=functools.partial(torch.cuda.set_device, device))
        self.last: concurrent.futures.Future[Any] | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        with self._lock:
            self.last = self.pool.submit(fn)
            return self.last


_DEVICE_WORKERS: dict[int, DeviceWorker] = {}
_DEVICE_WORKERS_LOCK = threading.Lock()


def device_worker(device: torch.device) -> DeviceWorker:
    """The device's :class:`DeviceWorker` (started at its first host-driven call; lives as long as the process)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    worker = _DEVICE_WORKERS.get(index)
    if worker is None:
        with _DEVICE_WORKERS_LOCK:
            worker = _DEVICE_WORKERS.setdefault(index, DeviceWorker(torch.device("cuda", index)))
    return worker
