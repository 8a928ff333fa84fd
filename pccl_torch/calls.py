"""The call-shape cache: validate, choose and bind once per call shape, then run.

A training job repeats a few call shapes (collective, dtype, sizes, op, algorithm, compression, async) thousands of
times. The first call of a shape validates every argument, chooses the plan (``pccl_torch.selection``) and binds
a :class:`BoundCall`: the plan, the body that runs it on these sizes (for a flat MPI plan, the transport's bound
native collective: ``MPITransport.bind_*``), the counter entry and, with checking on, the signature the ranks agree
on. Later calls of the shape check only what can differ between calls of one shape (device, contiguity and, in
the API, aliasing) and call the bound object. This is what NCCL does with its per-communicator plans, and what
the ``persistent`` collectives of MPI 4 do for one buffer.

The cache lives on the communicator (``Communicator.calls``), is bounded (:data:`MAX_SHAPES`: a program with
ever-new sizes starts over), and goes with it. A plan online tuning has not decided yet is not cached: its
calls choose anew each time, as the tuner wants. Small blocking calls of a cached shape on one of MPI's own
collectives run it as an MPI-4 persistent collective (``MPITransport.bind_*``); binding one is collective, which
holds because every rank binds the same shapes at the same calls of a sound program.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from time import perf_counter
from typing import NamedTuple

import torch
from torch.autograd import profiler as torch_profiler

from pccl_torch import flight_recorder, profiling, workspace
from pccl_torch.algorithms import Blocks
from pccl_torch.errors import CommunicatorBrokenError, PcclError, PcclMismatchError, PcclTimeoutError, Stalled
from pccl_torch.ops import ReduceOp, Reduction
from pccl_torch.plan import Plan
from pccl_torch.signature import Signature, agree, agree_splits
from pccl_torch.transport.mpi import MPITransport
from pccl_torch.triton_kernels import scale_
from pccl_torch.work import Work

MAX_SHAPES = 4096
"""Bound calls per communicator before the cache starts over."""

Body = Callable[[torch.Tensor, "torch.Tensor | Exchange | None"], torch.Tensor]
"""What a bound call runs: ``body(a, b)`` with ``a`` the buffer (all-reduce) or output, ``b`` the input (None for
an all-reduce, or for an all-gather whose input is this rank's block of the output; an :class:`Exchange` for an
all-to-all)."""


class Exchange(NamedTuple):
    """An all-to-all call with split sizes: its input and blocks (sizes change from call to call)."""

    input: torch.Tensor
    send: Blocks
    """Elements of ``input`` for each rank, end to end."""
    recv: Blocks
    """Elements of the output from each rank, end to end."""


def host_driven(comm, plan: Plan) -> bool:
    """Whether a call of ``plan`` on ``comm`` crosses a level that needs host memory (MPI, staged): the worker
    thread drives such a call; one over device libraries only (NCCL) is enqueued by the caller's thread."""
    if not plan.hierarchical:
        return getattr(comm, plan.transport).host_memory_only
    return any(level.host_memory_only for level in (comm.inter, comm.world, comm.intra_level(plan.intra)))


def workspace_need(comm, plan: Plan, body: Body, nbytes: int, dtype: torch.dtype) -> workspace.Need:
    """The device memory a call of ``body`` on a full buffer of ``nbytes`` takes where a worker runs it: its plan's
    (``Plan.workspace``) and the body's own temporaries (``body.takes``, bytes each)."""
    return plan.workspace(comm, nbytes // dtype.itemsize, dtype).plus(*getattr(body, "takes", ()))


class BoundCall:
    """One call shape, validated and chosen: calling it numbers, runs and counts one collective."""

    __slots__ = ("comm", "plan", "body", "nbytes", "dtype", "block", "offset", "entry", "async_op", "signature",
                 "on_cuda", "host_driven", "need", "label", "recorder", "phased", "full", "__weakref__")

    def __init__(self, comm, plan: Plan, body: Body, nbytes: int, async_op: bool, signature: Signature) -> None:
        self.comm = comm
        self.plan = plan
        self.body = body
        self.nbytes = nbytes
        """The caller's buffer bytes a call moves (what ``stats()`` counts): the full buffer."""
        self.dtype = signature.dtype
        self.block = nbytes // comm.topology.world_size
        """Bytes of one rank's block of the full buffer."""
        self.offset = comm.topology.rank * self.block
        """Where this rank's block starts in the full buffer, in bytes (the in-place all-gather's input)."""
        self.async_op = async_op
        self.entry = comm.stats.entry(plan)
        """This plan's counters (``[calls, bytes, seconds]``), updated in place."""
        self.signature = signature if comm.check or plan.probe is not None else None
        """What the ranks agree on before each call when checking is on (None: no agreement)."""
        self.on_cuda = comm.device.type == "cuda"
        """CUDA tensors: enqueue and return, in the group's stream order (``pccl_torch.work``)."""
        self.host_driven = self.on_cuda and host_driven(comm, plan)
        """Whether a level of the plan needs host memory (MPI): the worker drives it behind a gate."""
        self.need = workspace_need(comm, plan, body, nbytes, self.dtype) if self.on_cuda else None
        """CUDA: the device memory a call takes on the worker, reserved at issue (``pccl_torch.workspace``); every
        CUDA call has it, since a device-only one issued while the worker is busy runs there too."""
        self.label = f"{plan.collective} (plan {plan.name})"
        """The call as errors name it."""
        self.recorder = comm.recorder
        """The communicator's flight recorder (``pccl_torch.flight_recorder``; None when it is off)."""
        self.phased = self.recorder is not None and plan.hierarchical
        """Whether the plan has phases the recorder marks (``flight_recorder.running.slot`` of the thread that runs it points at the call's slot)."""
        self.full = self.signature is not None or (self.recorder is not None and self.recorder.stacks)
        """Whether every call takes ``run`` (agreement, or a recorded stack), not the inlined blocking path."""

    def __call__(self, a: torch.Tensor, b: torch.Tensor | None = None) -> Work | None:
        """Number the call, then run it now (blocking: after the queued async calls) or queue it (``async_op``).

        The blocking success path allocates nothing: where ranks share cores every microsecond here is paid
        several times over by the ranks that wait for this one. While a torch profiler records, the call runs
        inside its ranges (``run``; ``pccl_torch.profiling``), on whichever thread runs it."""
        comm = self.comm
        if comm.broken is not None:
            raise CommunicatorBrokenError(
                f"this pccl communicator is broken by an earlier failure and cannot run collectives: {comm.broken}")
        sequence = comm.sequence = comm.sequence + 1
        executor = comm.executor
        if self.on_cuda:
            return self._issue_on_cuda(sequence, a, b)
        if self.async_op:
            if self.recorder is not None:
                self.recorder.begin(sequence, self, perf_counter(), started=False)
            work = functools.partial(self.run, sequence, a, b)
            return Work(executor.submit(profiling.carried(work) if torch_profiler._is_profiler_enabled else work),
                        self.plan.collective, self.plan.name)
        if executor._last is not None:
            executor.drain()
        if self.full or torch_profiler._is_profiler_enabled:
            self.run(sequence, a, b)
            return None
        start = perf_counter()  # the plain blocking call, inlined: a Python call less than run()
        recorder = self.recorder
        if recorder is not None:  # the flight recorder's slot, written in place (Recorder.begin, inlined)
            slot = recorder.slots[sequence % recorder.size]
            slot.seq = sequence
            slot.call = self
            slot.created = slot.started = start
            slot.completed = 0.0
            if self.phased:
                slot.phase = slot.level = None
                flight_recorder.running.slot = slot
        try:
            self.body(a, b)
        except Exception as exc:
            raise self._failed(exc, sequence)
        finally:
            if self.phased:  # a later flat call on this thread must not mark this call's waits
                flight_recorder.running.slot = None
        end = perf_counter()
        if recorder is not None:
            slot.completed = end
        entry = self.entry
        entry[0] += 1
        entry[1] += self.nbytes
        entry[2] += end - start
        return None

    def _issue_on_cuda(self, sequence: int, a: torch.Tensor, b: torch.Tensor | None) -> Work | None:
        """Enqueue the call in the group's stream order and return (ProcessGroupNCCL's contract): a blocking call
        is an async one whose Work the caller's current stream waits for at once. A call the caller's thread
        enqueues (device levels only) that failed raises here, as a blocking CPU call does."""
        if self.recorder is not None:
            self.recorder.begin(sequence, self, perf_counter(), started=False)
        call = functools.partial(self.run, sequence, a, b)
        if torch_profiler._is_profiler_enabled:
            call = profiling.carried(call)
        queue = self.comm.executor
        need = self.need if not isinstance(b, Exchange) else \
            self.plan.workspace(self.comm, b.input.numel(), self.dtype, even=False)  # sizes change call to call
        future, end, gated = queue.issue(call, host_driven=self.host_driven, what=self.label, need=need,
                                         tensors=(a, b if isinstance(b, torch.Tensor) else getattr(b, "input", None)))
        if future.done() and future.exception() is not None and not self.async_op:
            raise future.exception()
        work = Work(future, self.plan.collective, self.plan.name, end=end, gated=gated, output=a, queue=queue)
        if self.async_op:
            return work
        work.wait()
        return None

    def run(self, sequence: int, a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """Run call ``sequence``: agree on its signature (checking on), time and count it (what ``__call__`` does
        inline for a plain blocking call); inside its profiler ranges while a torch profiler records."""
        if torch_profiler._is_profiler_enabled:
            topology = self.comm.topology
            with profiling.call_ranges(self.plan.collective, self.dtype, self.nbytes, self.plan.name,
                                       topology.world_size, topology.rank, sequence, self.async_op):
                return self._run(sequence, a, b)
        return self._run(sequence, a, b)

    def _run(self, sequence: int, a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        comm, plan, recorder = self.comm, self.plan, self.recorder
        slot = None
        if recorder is not None:  # scheduled already when queued (async, CUDA): started now
            slot = recorder.slots[sequence % recorder.size]
            if slot.seq != sequence or slot.call is not self:
                slot = recorder.begin(sequence, self, perf_counter(), started=True)
            else:
                slot.started = perf_counter()
            if self.phased:
                flight_recorder.running.slot = slot
        try:
            if self.signature is not None:
                if comm.check:
                    agree(comm, self.signature, sequence)
                if plan.probe is not None:  # an online-tuning trial: timed from a common start, as pccl-bench times
                    comm.world.barrier()
            start = perf_counter()
            result = self.body(a, b)
        except Exception as exc:
            raise self._failed(exc, sequence)
        finally:
            if self.phased:
                flight_recorder.running.slot = None
        end = perf_counter()
        if slot is not None:
            slot.completed = end
        seconds = end - start
        entry = self.entry
        entry[0] += 1
        entry[1] += self.nbytes
        entry[2] += seconds
        if plan.probe is not None:
            plan.probe(seconds)
        return result

    def _failed(self, exc: Exception, sequence: int) -> Exception:
        """The error call ``sequence`` raises for ``exc``: a mismatch found before any data moved leaves the
        communicator sound; anything else breaks it, a peer that never answered as ``PcclTimeoutError``."""
        comm, plan = self.comm, self.plan
        if self.recorder is not None:
            self.recorder.failed(sequence, f"{type(exc).__name__}: {exc}", getattr(exc, "peers", ()))
        if isinstance(exc, PcclMismatchError):
            return exc
        if isinstance(exc, Stalled):
            error = PcclTimeoutError(plan.collective, sequence, plan.name, comm.topology.rank, exc)
            error.__cause__ = exc
            comm.mark_broken(error)
            return error
        comm.mark_broken(PcclError(f"pccl {plan.collective} #{sequence} ({plan.name}) failed: {exc}"))
        return exc


def make_room(comm) -> None:
    """Before binding a shape for keeps: start the cache over once it holds :data:`MAX_SHAPES` shapes, freeing
    the persistent collectives its bound calls held. It counts shapes bound, which every rank binds at the same
    calls, so every rank starts over at the same call (binding a persistent collective is collective)."""
    if comm.bound_shapes >= MAX_SHAPES:
        comm.forget_calls()
        comm.bound_shapes = 0
        if isinstance(comm.world, MPITransport):
            comm.world.release_persistent()


def remember(comm, keys: tuple[tuple | None, ...], bound: BoundCall) -> BoundCall:
    """Keep ``bound`` for the calls of each of ``keys`` (after :func:`make_room`)."""
    comm.bound_shapes += 1
    for key in keys:
        if key is not None:
            comm.calls[key] = bound
    return bound


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as 1-D (itself when it already is: ``view(-1)`` costs ~2.5 us a call)."""
    return tensor if tensor.dim() == 1 else tensor.view(-1)


def _native_world(comm, plan: Plan) -> MPITransport | None:
    """The MPI transport a plan runs MPI's own flat collective on, for host tensors (else None)."""
    if plan.name != "mpi" or comm.device.type != "cpu" or not isinstance(comm.world, MPITransport):
        return None
    return comm.world


def all_reduce_body(comm, plan: Plan, reduction: Reduction, dtype: torch.dtype, nbytes: int, persistent: bool) -> Body:
    """The body of an all-reduce of ``nbytes`` of ``dtype`` with ``reduction`` under ``plan``; ``persistent``: a
    shape bound for keeps on every rank at this call, which may hold a persistent collective."""
    world = _native_world(comm, plan)
    native = world.bind_all_reduce(dtype, nbytes, reduction.combine, persistent=persistent) if world else None
    pre_scale, divide = reduction.pre_scale, reduction.divide_by_world
    if native is not None and pre_scale is None and not divide:
        return native  # the common case: MPI's own call, nothing around it
    combine, world_size = reduction.combine, comm.topology.world_size

    def body(tensor: torch.Tensor, _: torch.Tensor | None) -> torch.Tensor:
        buf = _flat(tensor)
        if pre_scale is not None:
            scale_(buf, pre_scale)
        if native is not None:
            native(buf, None)
        else:
            plan.run_all_reduce(comm, buf, combine)
        if divide:
            scale_(buf, 1.0 / world_size)
        return tensor

    return body


def all_gather_body(comm, plan: Plan, nbytes: int, persistent: bool) -> Body:
    """The body of an all-gather into an output of ``nbytes`` under ``plan``; an input of None: in place."""
    world = _native_world(comm, plan)
    native = world.bind_all_gather(nbytes // comm.topology.world_size, persistent=persistent) if world else None
    if native is not None:
        return native
    rank, world_size = comm.topology.rank, comm.topology.world_size

    def body(out: torch.Tensor, inp: torch.Tensor | None) -> torch.Tensor:
        flat_out = _flat(out)
        if inp is None:
            block = flat_out.numel() // world_size
            inp = flat_out[rank * block:][:block]
        plan.run_all_gather(comm, flat_out, _flat(inp))
        return out

    return body


def reduce_scatter_body(comm, plan: Plan, reduction: Reduction, dtype: torch.dtype, nbytes: int,
                        persistent: bool) -> Body:
    """The body of a reduce-scatter of an input of ``nbytes`` of ``dtype`` with ``reduction`` under ``plan``;
    an output that overlaps the input gets its result through a temporary."""
    world = _native_world(comm, plan)
    native = world.bind_reduce_scatter(dtype, nbytes, reduction.combine, persistent=persistent) if world else None
    pre_scale, divide = reduction.pre_scale, reduction.divide_by_world
    combine, world_size = reduction.combine, comm.topology.world_size
    out_bytes = nbytes // world_size

    def body(out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
        o, i = out.data_ptr(), inp.data_ptr()
        aliased = out_bytes and o < i + nbytes and i < o + out_bytes
        target = workspace.empty(out.numel(), out.dtype, out.device).view(out.shape) if aliased else out
        if pre_scale is not None:
            inp = scale_(workspace.empty(inp.numel(), inp.dtype, inp.device).copy_(_flat(inp)), pre_scale)
        if native is not None:
            native(target, inp)
        else:
            plan.run_reduce_scatter(comm, _flat(inp), _flat(target), combine)
        if divide:
            scale_(target, 1.0 / world_size)
        if target is not out:
            out.copy_(target)
        return out

    body.takes = (out_bytes,) + ((nbytes,) if pre_scale is not None else ())  # the aliased output, the scaled input
    if native is not None and pre_scale is None and not divide:
        def direct(out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
            o, i = out.data_ptr(), inp.data_ptr()
            return body(out, inp) if out_bytes and o < i + nbytes and i < o + out_bytes else native(out, inp)

        direct.hot = getattr(native, "hot", None)  # the compiled hot path re-checks aliasing itself
        return direct
    return body


def all_to_all_body(comm, plan: Plan, numel: int, nbytes: int) -> Body:
    """The body of an all-to-all of equal blocks between tensors of ``numel`` elements (``nbytes``) under ``plan``:
    for a flat MPI plan on host tensors, MPI's own ``Alltoall`` bound once."""
    world = _native_world(comm, plan)
    native = world.bind_all_to_all(nbytes) if world else None
    if native is not None:
        return native
    blocks = Blocks.even(comm.topology.world_size, numel // comm.topology.world_size)

    def body(out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
        plan.run_all_to_all(comm, _flat(out), _flat(inp), blocks, blocks, even=True)
        return out

    return body


def exchange_body(comm, plan: Plan) -> Body:
    """The body of an all-to-all with split sizes (an :class:`Exchange` a call) under ``plan``; with checking on,
    the ranks first agree that their split sizes mirror each other."""
    check = comm.check

    def body(out: torch.Tensor, job: Exchange) -> torch.Tensor:
        if check:
            agree_splits(comm, job.send.counts, job.recv.counts)
        plan.run_all_to_all(comm, _flat(out), _flat(job.input), job.send, job.recv, even=False)
        return out

    return body


def signature(plan: Plan, dtype: torch.dtype, numel: int, op: ReduceOp | None) -> Signature:
    return Signature(plan.collective, plan.name, dtype, numel, op.value if op else "none")
