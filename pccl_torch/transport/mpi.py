"""mpi4py transport: zero-copy point-to-point and native collectives on torch tensors.

CPU tensors go to MPI as a buffer over their memory (``MPI.buffer.fromaddress(data_ptr, nbytes)``: no
copy; bytes for moves, so bfloat16, which has no NumPy or MPI type, works; the MPI type of the dtype for
reductions). It is 3x cheaper than ``tensor.numpy()``, which matters more than it seems: with 4 ranks
sharing 2 cores, a 1 KiB all-reduce took 93 us through ``numpy()`` and 66 us through the address, against
60 us for a ready-made NumPy array, as every instruction of one rank delays the others. CUDA tensors go through
``__cuda_array_interface__`` after the producing stream is synchronised, when the MPI library is
CUDA-aware (``PCCL_CUDA_AWARE_MPI=1``); otherwise they are staged through host memory.
Never pickled objects, never ``.tolist()``.

Native collectives are MPI's blocking calls watched by :mod:`pccl_torch.watchdog` when the communicator
waits ``blocking`` (the default: MPICH's blocking collectives are up to 2x faster for small messages than
its non-blocking ones). Otherwise, and for every point-to-point call, everything is non-blocking
underneath (``Isend``/``Irecv``/``Iallreduce``...) and polled against the transport's deadline: a blocking
MPI call cannot time out, and a dead peer would hang it forever. Between
two polls the waiting rank yields its core (``sched_yield``): a bare Python spin on ``Test`` made a 1 KiB
all-reduce over 4 ranks on 2 cores 100x slower (8 ms against MPICH's blocking 80 us: the spinning ranks
starve the ones they wait for), while test-and-yield costs what a blocking wait does (92 vs 85 us). After
its spin (a multiple of what such waits took recently; ``_spin_for``), it naps ``_NAP_S`` between polls instead,
so a long wait (for a late peer) does not hold a core.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from mpi4py import MPI

from pccl_torch import failure_notice, flight_recorder, hotpath, watchdog
from pccl_torch.cuda_streams import host_wait
from pccl_torch.errors import Stalled
from pccl_torch.ops import ReduceOp
from pccl_torch.transport.base import COMPRESSED_ALL_TO_ALL, Transport, check_split_counts
from pccl_torch.transport.staging import Chunk, HostStaging, blocks, chunk_bounds, chunk_count

_MPI_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD, ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX}
# MPI has no 16-bit float types: native reductions on them run on a float32 copy.
_UPCAST = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
_MPI_TYPES = {torch.float32: MPI.FLOAT, torch.float64: MPI.DOUBLE, torch.int32: MPI.INT32_T,
              torch.int64: MPI.INT64_T}


def _needs_typing(tensor: torch.Tensor) -> bool:
    """Whether a native reduction on a host tensor must run on a float32 copy (16-bit floats)."""
    return tensor.dtype not in _MPI_TYPES
# Polling schedule: yield the core between polls for the wait's spin, then nap _NAP_S between polls.
#: The spin where each rank has a core; where ranks share cores a spinning rank delays the very rank it waits
#: for, so the spin is short there (1 ms: small collectives across the 1 Gbit/s testbed, 4 ranks on 2 cores,
#: 4-256 KiB against MPICH, all-gather 0.50-0.63x with 0.2 ms against 0.73-0.84x, reduce-scatter 0.53-0.61x
#: against 0.84-0.92x; the ZeRO-3 demo's median step and CPU a step unchanged, 2026-12-05) ...
SPIN_S = 0.05
SHARED_CORES_SPIN_S = 0.001
#: ... but not shorter than ``SPIN_FACTOR`` times what the same kind of wait took recently (at most
#: ``MAX_SPIN_S``): a napping rank does not drive MPI's progress, so a call every rank is in stalls until it
#: wakes (4 ranks on 2 cores, barrier-started all-reduces: 1 MiB 3.5 ms with a flat 0.2 ms spin against 1.1 ms
#: with a 2 ms one or MPI's blocking call). A wait that outlasts that is a wait for a late peer: it naps, so the
#: late rank gets the core (the stalls of a fixed long spin in training).
SPIN_FACTOR = 2.0
MAX_SPIN_S = 0.01
#: An all-to-all's wait is a wait for its peers more than for its bytes: MPI posts every block's send and receive
#: at once and the bytes move in one step, while in mixture-of-experts training a rank waits in every exchange for
#: the ranks whose experts got more tokens. So where ranks share cores its yield phase ends sooner. The mixture-of-
#: experts GPT on 2 x 2 testbed ranks at 1 Gbit/s: with every wait's yield capped at 1 ms its ranks used 1312-1336
#: against 1545-1590 ms of CPU a step, and pccl-bench's all-to-all from 256 KiB to 16 MiB moved by under 3%
#: (barrier-started all-gathers and reduce-scatters lost 15%, so they keep ``MAX_SPIN_S``).
ALL_TO_ALL_MAX_SPIN_S = 0.001
NATIVE_ALL_TO_ALL = "MPI's native all-to-all"
_WAITS_FOR_PEERS = frozenset({NATIVE_ALL_TO_ALL, COMPRESSED_ALL_TO_ALL})
_TYPICAL_RISE = 1.1
_NAP_S = 0.0002
_POLLS_PER_CHECK = 16
_WHOLE_GROUP = (None,)
"""The peers of a wait on a native collective, as the flight recorder notes them: every other rank of the group."""


BoundNative = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]
"""A bound native collective (``MPITransport.bind_*``): ``run(a, b) -> a``."""


def _unchanged(tensor: torch.Tensor, _: torch.Tensor | None = None) -> torch.Tensor:
    """An all-reduce over one rank: its buffer as it is."""
    return tensor


PERSISTENT_MAX_BYTES = 4096
"""The largest buffer a bound call runs as a persistent collective over staging copies (``bind_*``)."""


@functools.cache
def _persistent_collectives() -> bool:
    """Whether this MPI has MPI-4's persistent collectives (MPICH 4+, Open MPI 5+; the same on every rank)."""
    return MPI.Get_version() >= (4, 0) and hasattr(MPI.Comm, "Allreduce_init")


def _call_watched(watch: watchdog.Watch, failed: Callable[["MPI.Exception"], Stalled], call, *args) -> None:
    """``call(*args)``, a blocking MPI call, under ``watch``; an error a fault-tolerant MPI reports becomes
    ``failed(exc)`` (``Stalled``)."""
    watch.since = time.perf_counter()
    try:
        call(*args)
    except MPI.Exception as exc:
        raise failed(exc) from exc
    finally:
        watch.since = 0.0


class _AddressViews:
    """The memory view of the last tensor address seen, made again only when the address changes (a training
    loop passes the same buffers call after call)."""

    __slots__ = ("nbytes", "address", "view")

    def __init__(self, nbytes: int) -> None:
        self.nbytes, self.address, self.view = nbytes, None, None

    def of(self, tensor: torch.Tensor) -> memoryview:
        address = tensor.data_ptr()
        if address != self.address:
            self.address, self.view = address, memoryview(MPI.buffer.fromaddress(address, self.nbytes))
        return self.view


def _bound_copy(nbytes: int) -> BoundNative:
    """An all-gather or reduce-scatter over one rank: the input's bytes into the output (in distinct host
    memory; an input of None is the output already), copied by the buffers' memory views (no torch op)."""
    outputs, inputs = _AddressViews(nbytes), _AddressViews(nbytes)

    def run(out: torch.Tensor, inp: torch.Tensor | None) -> torch.Tensor:
        if inp is not None and nbytes:
            outputs.of(out)[:] = inputs.of(inp)
        return out

    return run


def _nap() -> None:
    time.sleep(_NAP_S)

_FAILED_WAIT_S = 0.5
_FAILURE_CHECK_S = 0.1  # how often a waiting rank asks a fault-tolerant MPI whether a peer has failed
_ERROR_NAMES = {MPI.ERR_PROC_FAILED: "MPI_ERR_PROC_FAILED", MPI.ERR_PROC_FAILED_PENDING: "MPI_ERR_PROC_FAILED_PENDING"}
#: Set once MPI raised a process-failure error (only a fault-tolerant MPI does).
_mpi_reported_failure = False


@functools.cache
def _revoke_supported() -> bool:
    """Whether a broken communicator revokes its MPI communicators: on Open MPI (ULFM is built in; without
    ``--with-ft`` the call just fails), or once MPI reported a failure. Never tried on MPICH otherwise,
    whose revoke on a healthy job without fault tolerance is not to be relied on."""
    return MPI.Get_library_version().startswith("Open MPI")


def cuda_aware() -> bool:
    """Whether CUDA buffers may be handed to MPI directly (opt-in: the PyPI MPI builds are not)."""
    return os.environ.get("PCCL_CUDA_AWARE_MPI", "0") == "1"


def _buffer(tensor: torch.Tensor, datatype: "MPI.Datatype" = MPI.BYTE) -> Any:
    """``[buffer, datatype]`` over a contiguous tensor's memory, without a copy; CUDA tensors (CUDA-aware
    MPI only) by ``__cuda_array_interface__`` once their stream is done."""
    if tensor.is_cuda:
        host_wait(torch.cuda.current_stream(tensor.device))  # MPI reads device memory outside stream order
        return [tensor.reshape(-1).view(torch.uint8) if datatype == MPI.BYTE else tensor, datatype]
    if not tensor.is_contiguous():
        raise ValueError("internal error: MPI buffers must be contiguous tensors")
    return [MPI.buffer.fromaddress(tensor.data_ptr(), tensor.numel() * tensor.element_size()), datatype]


def _counts_and_displacements(counts: Sequence[int], element_size: int) -> tuple[list[int], list[int]]:
    """Byte counts and displacements of consecutive blocks of ``counts`` elements (an ``Alltoallv`` message)."""
    sizes = [c * element_size for c in counts]
    displacements, start = [], 0
    for size in sizes:
        displacements.append(start)
        start += size
    return sizes, displacements


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class MPITransport(Transport):
    """Point-to-point messages and native collectives over an mpi4py communicator."""

    name = "mpi"
    #: Native collectives as MPI's blocking calls under the watchdog (``PCCL_WAIT=blocking``), instead of
    #: non-blocking ones polled against the deadline (set by the communicator).
    blocking: bool = False
    #: How long a polled wait yields the core between polls before it sleeps between them (set per machine).
    spin_s: float = SPIN_S

    def __init__(self, comm: "MPI.Comm", *, owned: bool = False) -> None:
        self.comm = comm
        self._typical: dict[tuple[str, int], float] = {}  # fastest recent seconds per kind of wait (_learn)
        self._watches: dict[str, watchdog.Watch] = {}  # the watchdog's watch per kind of blocking call
        self._requests: list[MPI.Prequest] = []  # persistent collectives bound by bind_* (release_persistent)
        self._owned = owned
        self.staging = HostStaging()
        """Pinned host buffers and side streams for CUDA tensors an MPI that is not CUDA-aware cannot take."""
        self.stage_host_tensors = False
        """Send host tensors through the staging too (tests: every chunking of the CUDA path, on CPU)."""
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()

    def stages(self, *tensors: torch.Tensor, reduce: bool = False) -> bool:
        """Whether a call on ``tensors`` goes through host staging (:attr:`staging`): CUDA tensors, unless MPI is
        CUDA-aware and (``reduce``) reduces their dtype; host tensors too with :attr:`stage_host_tensors`."""
        for tensor in tensors:
            if tensor.is_cuda:
                if not cuda_aware() or (reduce and tensor.dtype not in _MPI_TYPES):
                    return True
            elif self.stage_host_tensors:
                return True
        return False

    def send(self, tensor: torch.Tensor, dest: int) -> None:
        if self.stages(tensor):
            host = self.staging.host("send", tensor.numel(), tensor.dtype)
            return self.staging.run([Chunk([(tensor.reshape(-1), host)], lambda: self._send(host, dest))],
                                    tensor.device)
        return self._send(tensor, dest)

    def _send(self, tensor: torch.Tensor, dest: int) -> None:
        self._complete([self.comm.Isend(_buffer(tensor), dest)], [dest], "send to", _nbytes(tensor))

    def recv(self, tensor: torch.Tensor, source: int) -> None:
        if self.stages(tensor):
            host = self.staging.host("recv", tensor.numel(), tensor.dtype)
            return self.staging.run([Chunk((), lambda: self._recv(host, source), [(host, tensor.reshape(-1))])],
                                    tensor.device)
        return self._recv(tensor, source)

    def _recv(self, tensor: torch.Tensor, source: int) -> None:
        self._complete([self.comm.Irecv(_buffer(tensor), source)], [source], "receive from", _nbytes(tensor))

    def sendrecv(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int) -> None:
        if self.stages(send, recv):
            sbuf = self.staging.host("send", send.numel(), send.dtype)
            rbuf = self.staging.host("recv", recv.numel(), recv.dtype)
            work = functools.partial(self._sendrecv, sbuf, dest, rbuf, source)
            return self.staging.run([Chunk([(send.reshape(-1), sbuf)], work, [(rbuf, recv.reshape(-1))])],
                                    (send if send.is_cuda else recv).device)
        return self._sendrecv(send, dest, recv, source)

    def _sendrecv(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int) -> None:
        requests = [self.comm.Irecv(_buffer(recv), source), self.comm.Isend(_buffer(send), dest)]
        self._complete(requests, [source, dest], "exchange with", _nbytes(send) + _nbytes(recv))

    def sendrecv_posted(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int,
                        posted: list) -> None:
        """Waits for the receive only; the send stays in ``posted``. MPICH over TCP (UCX or OFI) completes a send
        when the peer has acknowledged it: across the testbed at RTT 20 ms an exchange step of 4-32 KiB took
        20.3-20.5 ms waiting for both, 12.2-12.3 ms waiting for the receive
        (``benchmarks/results/latency-regime/fourth-pass/step-cost``). Staged (device) buffers exchange as
        :meth:`sendrecv` does: their host copies are reused."""
        if self.stages(send, recv):
            return self.sendrecv(send, dest, recv, source)
        receiving = self.comm.Irecv(_buffer(recv), source)
        posted.append((self.comm.Isend(_buffer(send), dest), dest, _nbytes(send)))
        self._complete([receiving], [source], "receive from", _nbytes(recv))

    def complete_posted(self, posted: list) -> None:
        if posted:
            self._complete([request for request, _, _ in posted], [dest for _, dest, _ in posted], "send to",
                           sum(nbytes for _, _, nbytes in posted))
            posted.clear()

    def native_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        if self._size == 1:  # one rank: a copy, on the tensors' own device (no host staging)
            out.copy_(inp.view_as(out))
            return None
        if self.stages(inp, out):
            return self._staged_all_gather(out, inp)
        return self._host_all_gather(out, inp)

    def _host_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        if self.blocking:
            return self._blocking(self.comm.Allgather, (_buffer(inp), _buffer(out)), "MPI's native all-gather")
        self._complete_collective(self.comm.Iallgather(_buffer(inp), _buffer(out)), "MPI's native all-gather",
                                  _nbytes(out))
        return None

    def native_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp) -> None:
        if self._size == 1:
            out.copy_(inp.view_as(out))
            return None
        if self.stages(inp, out, reduce=True):
            return self._staged_reduce_scatter(out, inp, op)
        return self._host_reduce_scatter(out, inp, op)

    def _host_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp) -> None:
        if _needs_typing(inp) or _needs_typing(out):  # through float32 copies MPI can reduce, and back
            with self._typed(inp, copy_back=False) as src, self._typed(out, copy_back=True) as dst:
                return self._host_reduce_scatter(dst, src, op)
        datatype = _MPI_TYPES[inp.dtype]
        if self.blocking:
            return self._blocking(self.comm.Reduce_scatter_block,
                                  (_buffer(inp, datatype), _buffer(out, datatype), _MPI_OPS[op]),
                                  "MPI's native reduce-scatter")
        self._complete_collective(self.start_reduce_scatter(out, inp, op), "MPI's native reduce-scatter", _nbytes(inp))
        return None

    def native_all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        if self._size == 1:  # the reduction of one contribution is itself
            return None
        if self.stages(tensor, reduce=True):
            return self._staged_all_reduce(tensor, op)
        return self._host_all_reduce(tensor, op)

    def _host_all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        if _needs_typing(tensor):
            with self._typed(tensor, copy_back=True) as buf:
                return self._host_all_reduce(buf, op)
        if self.blocking:
            return self._blocking(self.comm.Allreduce,
                                  (MPI.IN_PLACE, _buffer(tensor, _MPI_TYPES[tensor.dtype]), _MPI_OPS[op]),
                                  "MPI's native all-reduce")
        request = self.comm.Iallreduce(MPI.IN_PLACE, _buffer(tensor, _MPI_TYPES[tensor.dtype]), _MPI_OPS[op])
        self._complete_collective(request, "MPI's native all-reduce", _nbytes(tensor))
        return None

    def native_all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: Sequence[int],
                          recv_counts: Sequence[int]) -> None:
        if self._size == 1:
            if out.numel():
                out.copy_(inp[:out.numel()])
            return None
        if self.stages(inp, out):
            return self._staged_all_to_all(out, inp, send_counts, recv_counts)
        return self._host_all_to_all(out, inp, send_counts, recv_counts)

    def _host_all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: Sequence[int],
                         recv_counts: Sequence[int]) -> None:
        size, first = inp.element_size(), send_counts[0]
        if all(c == first for c in send_counts) and all(c == first for c in recv_counts):  # MPI's own rule by size
            send, recv, call, start = _buffer(inp), _buffer(out), self.comm.Alltoall, self.comm.Ialltoall
        else:
            send = [_buffer(inp)[0], _counts_and_displacements(send_counts, size), MPI.BYTE]
            recv = [_buffer(out)[0], _counts_and_displacements(recv_counts, size), MPI.BYTE]
            call, start = self.comm.Alltoallv, self.comm.Ialltoallv
        if self.blocking:
            return self._blocking(call, (send, recv), NATIVE_ALL_TO_ALL)
        self._complete_collective(start(send, recv), NATIVE_ALL_TO_ALL, _nbytes(out))
        return None

    # Staged native collectives (``stages``): the collective cut into chunks along each rank's block, every chunk
    # copied to host memory, moved by the host path of the same collective and copied back (``staging``).
    def _chunks(self, numel: int, dtype: torch.dtype, parts: int) -> list[tuple[int, int]]:
        """Bounds of the chunks of a row of ``numel`` elements of ``dtype`` in a message of ``parts`` such rows
        (the same on every rank: it depends on the message's size only)."""
        nbytes = numel * parts * dtype.itemsize
        return chunk_bounds(numel, chunk_count(nbytes, self.staging.chunk_bytes))

    def _staged(self, source: torch.Tensor, target: torch.Tensor, rows: tuple[int, int], dtype: torch.dtype,
                work: Callable[[torch.Tensor, torch.Tensor], None]) -> None:
        """Through host staging: ``source`` as ``rows[0]`` rows and ``target`` as ``rows[1]`` rows of one width
        (one row a rank, or the whole buffer), in ``dtype`` on the host; chunk ``c`` copies columns ``lo:hi`` of
        every source row down, runs ``work(target_chunk, source_chunk)`` on them (the host path of the same
        collective) and copies the target chunk back. ``target is source``: in place, one host buffer."""
        rows_in, rows_out = rows
        width = source.numel() // rows_in
        host_in = self.staging.host("send", rows_in * width, dtype)
        host_out = host_in if target is source else self.staging.host("recv", rows_out * width, dtype)
        src, dst = blocks(source, rows_in), blocks(target, rows_out)
        chunks = []
        for lo, hi in self._chunks(width, dtype, max(rows_in, rows_out)):
            sent, received = host_in[rows_in * lo:rows_in * hi], host_out[rows_out * lo:rows_out * hi]
            chunks.append(Chunk([(src[:, lo:hi], sent.view(rows_in, hi - lo))],
                                functools.partial(work, received, sent),
                                [(received.view(rows_out, hi - lo), dst[:, lo:hi])]))
        self.staging.run(chunks, (source if source.is_cuda else target).device)

    def _staged_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self._staged(inp, out, (1, self._size), inp.dtype, self._host_all_gather)

    def _staged_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp) -> None:
        self._staged(inp, out, (self._size, 1), _UPCAST.get(inp.dtype, inp.dtype),
                     lambda o, i: self._host_reduce_scatter(o, i, op))

    def _staged_all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        self._staged(tensor, tensor, (1, 1), _UPCAST.get(tensor.dtype, tensor.dtype),
                     lambda o, _: self._host_all_reduce(o, op))

    def _staged_all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: Sequence[int],
                           recv_counts: Sequence[int]) -> None:
        world, first = self._size, send_counts[0]
        if all(c == first for c in send_counts) and all(c == first for c in recv_counts):
            def exchange(o: torch.Tensor, i: torch.Tensor) -> None:
                self._host_all_to_all(o, i, [i.numel() // world] * world, [o.numel() // world] * world)

            self._staged(inp.reshape(-1)[:world * first], out.reshape(-1)[:world * first], (world, world),
                         inp.dtype, exchange)
            return
        host_in = self.staging.host("send", inp.numel(), inp.dtype)
        host_out = self.staging.host("recv", out.numel(), out.dtype)
        work = functools.partial(self._host_all_to_all, host_out, host_in, send_counts, recv_counts)
        self.staging.run([Chunk([(inp.reshape(-1), host_in)], work, [(host_out, out.reshape(-1))])],
                         (out if out.is_cuda else inp).device)

    def _watch(self, what: str) -> watchdog.Watch:
        """The watchdog's watch of this transport's blocking ``what`` (one per kind, made at its first call)."""
        watch = self._watches.get(what)
        if watch is None or watch.timeout_s != self.timeout_s:
            watch = self._watches[what] = watchdog.Watch(self.timeout_s, what)
        return watch

    def _blocking(self, call, args: tuple, what: str) -> None:
        """``call(*args)``, a blocking MPI collective, watched by the watchdog for the transport's timeout;
        a failure a fault-tolerant MPI reports becomes ``Stalled`` as in the polled path."""
        watch = self._watch(what)
        waiting = flight_recorder.waiting_on(self, _WHOLE_GROUP)
        _call_watched(watch, self._failure_of(what), call, *args)
        flight_recorder.waited(waiting)

    # Bound native collectives: for the call-shape cache (``pccl_torch.calls``), MPI's own collective on host
    # tensors of one size and dtype as a single callable ``run(a, b) -> a`` (``a`` the buffer or output, ``b`` the
    # input), everything that does not change between the calls of one shape (datatype, op, watch, the MPI
    # message of the last address seen) decided once. None where the general path must run (polled waits,
    # dtypes MPI does not reduce).
    #
    # ``persistent``: a call up to PERSISTENT_MAX_BYTES runs an MPI-4 persistent collective over staging buffers
    # of its own (``*_init`` once, then ``Start``/``Wait``): MPICH's persistent collectives skip the per-call
    # setup of the blocking ones (2 ranks, 1 KiB, median of the slower rank: all-reduce 2.19 us with both
    # copies against 3.00 us blocking, all-gather 2.15 against 2.51), and the copies cost less than that up to
    # ~4 KiB (16 KiB: 9.4 against 8.9 us). ``*_init`` is collective: the caller asks for it only where every
    # rank binds the same shapes at the same call (``pccl_torch.calls``: final shapes, in issue order).
    def bind_all_reduce(self, dtype: torch.dtype, nbytes: int, op: ReduceOp, *,
                        persistent: bool = False) -> BoundNative | None:
        """In-place all-reduce of a host tensor of ``dtype`` and ``nbytes``."""
        if self._size == 1:
            return _unchanged
        if dtype not in _MPI_TYPES:
            return None
        datatype, mpi_op, what = _MPI_TYPES[dtype], _MPI_OPS[op], "MPI's native all-reduce"
        if not self.blocking:
            def run_polled(tensor: torch.Tensor, _: torch.Tensor | None = None) -> torch.Tensor:
                self._host_all_reduce(tensor, op)
                return tensor

            return self._polled(run_polled, what, nbytes, datatype, mpi_op, nbytes // dtype.itemsize)
        watch = self._watch(what)
        failed = self._failure_of(what)
        staged = self._staging(nbytes, persistent)
        if staged is not None:
            request = self._persistent(lambda: self.comm.Allreduce_init(MPI.IN_PLACE, [staged, datatype], mpi_op))
            start, wait = request.Start, request.Wait
            seen: list = [None, None]  # the buffer's address, its view

            def run_persistent(tensor: torch.Tensor, _: torch.Tensor | None = None) -> torch.Tensor:
                address = tensor.data_ptr()
                if address != seen[0]:
                    seen[0], seen[1] = address, memoryview(MPI.buffer.fromaddress(address, nbytes))
                view = seen[1]
                staged[:] = view
                start()  # a persistent collective's Start never blocks: only its Wait is watched
                _call_watched(watch, failed, wait)
                view[:] = staged
                return tensor

            run_persistent.hot = self._hot_spec(datatype, mpi_op, nbytes // dtype.itemsize, watch, failed, request,
                                                staged)
            return run_persistent
        allreduce = self.comm.Allreduce
        last: list = [None, None]  # the buffer's address, its message

        def run(tensor: torch.Tensor, _: torch.Tensor | None = None) -> torch.Tensor:
            address = tensor.data_ptr()
            if address != last[0]:
                last[0], last[1] = address, [MPI.buffer.fromaddress(address, nbytes), datatype]
            _call_watched(watch, failed, allreduce, MPI.IN_PLACE, last[1], mpi_op)
            return tensor

        run.hot = self._hot_spec(datatype, mpi_op, nbytes // dtype.itemsize, watch, failed)
        return run

    def bind_all_gather(self, nbytes: int, *, persistent: bool = False) -> BoundNative | None:
        """All-gather of ``nbytes`` from each rank's host input into the output; an input of None is this
        rank's block of the output already (MPI's ``IN_PLACE``)."""
        if self._size == 1:
            return _bound_copy(nbytes)
        what, total = "MPI's native all-gather", nbytes * self._size
        if not self.blocking:
            def run_polled(out: torch.Tensor, inp: torch.Tensor | None) -> torch.Tensor:
                send = MPI.IN_PLACE if inp is None else _buffer(inp)
                self._complete_collective(self.comm.Iallgather(send, _buffer(out)), what, total)
                return out

            return self._polled(run_polled, what, total, MPI.BYTE, MPI.OP_NULL, nbytes)
        watch = self._watch(what)
        failed = self._failure_of(what)
        staged_in, staged_out = self._staging(nbytes, persistent), self._staging(total, persistent)
        if staged_in is not None and staged_out is not None:
            request = self._persistent(lambda: self.comm.Allgather_init(staged_in, staged_out))
            start, wait = request.Start, request.Wait
            own = slice(self._rank * nbytes, (self._rank + 1) * nbytes)
            seen: list = [None, None, None, None]  # output address, its view, input address, its view

            def run_persistent(out: torch.Tensor, inp: torch.Tensor | None) -> torch.Tensor:
                address = out.data_ptr()
                if address != seen[0]:
                    seen[0], seen[1] = address, memoryview(MPI.buffer.fromaddress(address, total))
                if inp is None:
                    staged_in[:] = seen[1][own]
                else:
                    address = inp.data_ptr()
                    if address != seen[2]:
                        seen[2], seen[3] = address, memoryview(MPI.buffer.fromaddress(address, nbytes))
                    staged_in[:] = seen[3]
                start()  # a persistent collective's Start never blocks: only its Wait is watched
                _call_watched(watch, failed, wait)
                seen[1][:] = staged_out
                return out

            run_persistent.hot = self._hot_spec(MPI.BYTE, MPI.OP_NULL, nbytes, watch, failed, request, staged_in,
                                                staged_out)
            return run_persistent
        allgather = self.comm.Allgather
        last: list = [None, None, None, None]  # output address, its buffer, input address, its buffer

        def run(out: torch.Tensor, inp: torch.Tensor | None) -> torch.Tensor:
            address = out.data_ptr()
            if address != last[0]:
                last[0], last[1] = address, MPI.buffer.fromaddress(address, total)
            if inp is None:
                send = MPI.IN_PLACE
            else:
                address = inp.data_ptr()
                if address != last[2]:
                    last[2], last[3] = address, MPI.buffer.fromaddress(address, nbytes)
                send = last[3]
            _call_watched(watch, failed, allgather, send, last[1])
            return out

        run.hot = self._hot_spec(MPI.BYTE, MPI.OP_NULL, nbytes, watch, failed)
        return run

    def bind_reduce_scatter(self, dtype: torch.dtype, nbytes: int, op: ReduceOp, *,
                            persistent: bool = False) -> BoundNative | None:
        """Reduce-scatter of a host input of ``nbytes`` (every rank's blocks) into an output in other memory."""
        if self._size == 1:
            return _bound_copy(nbytes)
        if dtype not in _MPI_TYPES:
            return None
        datatype, mpi_op, what = _MPI_TYPES[dtype], _MPI_OPS[op], "MPI's native reduce-scatter"
        block = nbytes // self._size
        if not self.blocking:
            def run_polled(out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
                self._host_reduce_scatter(out, inp, op)
                return out

            return self._polled(run_polled, what, nbytes, datatype, mpi_op, block // dtype.itemsize)
        watch = self._watch(what)
        failed = self._failure_of(what)
        staged_in, staged_out = self._staging(nbytes, persistent), self._staging(block, persistent)
        if staged_in is not None and staged_out is not None:
            request = self._persistent(lambda: self.comm.Reduce_scatter_block_init(
                [staged_in, datatype], [staged_out, datatype], mpi_op))
            start, wait = request.Start, request.Wait
            seen: list = [None, None, None, None]  # input address, its view, output address, its view

            def run_persistent(out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
                address = inp.data_ptr()
                if address != seen[0]:
                    seen[0], seen[1] = address, memoryview(MPI.buffer.fromaddress(address, nbytes))
                staged_in[:] = seen[1]
                start()  # a persistent collective's Start never blocks: only its Wait is watched
                _call_watched(watch, failed, wait)
                address = out.data_ptr()
                if address != seen[2]:
                    seen[2], seen[3] = address, memoryview(MPI.buffer.fromaddress(address, block))
                seen[3][:] = staged_out
                return out

            run_persistent.hot = self._hot_spec(datatype, mpi_op, block // dtype.itemsize, watch, failed, request,
                                                staged_in, staged_out)
            return run_persistent
        call = self.comm.Reduce_scatter_block
        last: list = [None, None, None, None]  # input address, its message, output address, its message

        def run(out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
            address = inp.data_ptr()
            if address != last[0]:
                last[0], last[1] = address, [MPI.buffer.fromaddress(address, nbytes), datatype]
            address = out.data_ptr()
            if address != last[2]:
                last[2], last[3] = address, [MPI.buffer.fromaddress(address, block), datatype]
            _call_watched(watch, failed, call, last[1], last[3], mpi_op)
            return out

        run.hot = self._hot_spec(datatype, mpi_op, block // dtype.itemsize, watch, failed)
        return run

    def bind_all_to_all(self, nbytes: int) -> BoundNative | None:
        """All-to-all of equal blocks between host tensors of ``nbytes`` each (MPI's ``Alltoall`` on the bytes)."""
        if self._size == 1:
            return _bound_copy(nbytes)
        what = NATIVE_ALL_TO_ALL
        if not self.blocking:
            def run_polled(out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
                self._complete_collective(self.comm.Ialltoall(_buffer(inp), _buffer(out)), what, nbytes)
                return out

            return self._polled(run_polled, what, nbytes, MPI.BYTE, MPI.OP_NULL, nbytes // self._size)
        watch, call = self._watch(what), self.comm.Alltoall
        failed = self._failure_of(what)
        outputs, inputs = _AddressViews(nbytes), _AddressViews(nbytes)

        def run(out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
            _call_watched(watch, failed, call, inputs.of(inp), outputs.of(out))
            return out

        run.hot = self._hot_spec(MPI.BYTE, MPI.OP_NULL, nbytes // self._size, watch, failed)
        return run

    def _polled(self, run: BoundNative, what: str, nbytes: int, datatype: "MPI.Datatype", op: "MPI.Op",
                count: int) -> BoundNative:
        """``run``, a bound native collective that starts MPI's non-blocking call and polls it (waits not
        ``blocking``), with what the compiled hot path needs to run the same call (``nbytes``: the size class its
        polled waits learn under)."""
        run.hot = hotpath.Spec(  # type: ignore[attr-defined]
            self.comm, datatype, op, count, MPI.REQUEST_NULL, 0, 0, None, None, self.spin_s,
            self._failure_of(what), lambda request, spun: self._complete([request], [None], what, nbytes, spun=spun))
        return run

    def _hot_spec(self, datatype: "MPI.Datatype", op: "MPI.Op", count: int, watch: watchdog.Watch,
                  failed: Callable[["MPI.Exception"], Stalled], request: "MPI.Prequest" = MPI.REQUEST_NULL,
                  staged_in: memoryview | None = None, staged_out: memoryview | None = None) -> hotpath.Spec:
        """What the compiled hot path needs to run a bound blocking native collective (``pccl_torch.hotpath``)."""
        address = [0 if view is None else MPI.buffer(view).address for view in (staged_in, staged_out)]
        return hotpath.Spec(self.comm, datatype, op, count, request, address[0], address[1], (staged_in, staged_out),
                            watch, 0.0, failed, None)

    @staticmethod
    def _staging(nbytes: int, persistent: bool) -> memoryview | None:
        """A staging buffer for a persistent collective of ``nbytes`` (None when it would not pay)."""
        if not persistent or not 0 < nbytes <= PERSISTENT_MAX_BYTES or not _persistent_collectives():
            return None
        return memoryview(bytearray(nbytes))

    def _persistent(self, init: Callable[[], "MPI.Prequest"]) -> "MPI.Prequest":
        """A persistent collective request from ``init`` (collective), freed by :meth:`release_persistent`."""
        request = init()
        self._requests.append(request)
        return request

    def _failure_of(self, what: str) -> Callable[["MPI.Exception"], Stalled]:
        """What a bound call of ``what`` raises for an MPI error (only a fault-tolerant MPI reports one):
        ``Stalled``."""
        return lambda exc: self._process_failure(exc.Get_error_class(), [None], what, 0.0)

    def release_persistent(self) -> None:
        """Free the persistent collectives bound so far (inactive: a local call); their bound calls must be gone."""
        for request in self._requests:
            if request != MPI.REQUEST_NULL:
                request.Free()
        self._requests.clear()

    def _complete_collective(self, request: "MPI.Request", what: str, nbytes: int) -> None:
        self._complete([request], [None], what, nbytes)

    # Non-blocking collectives for schedules that overlap several (the pipelined hierarchy): each returns
    # the started request; ``wait`` completes one within the deadline. Host buffers of MPI-typed dtypes
    # only (the caller stages CUDA and 16-bit tensors once for the whole call).
    def start_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> "MPI.Request":
        """Start MPI's all-gather of ``inp`` into ``out`` (size x inp.numel() elements)."""
        return self.comm.Iallgather(_buffer(inp), _buffer(out))

    def start_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp) -> "MPI.Request":
        """Start MPI's reduce-scatter: ``out`` receives block ``rank`` of the ``op`` over every ``inp``.

        Equal counts, not ``Ireduce_scatter_block``: MPICH 5.0's non-blocking block form took 4-9x its blocking
        call's time at 512 KiB-1 MiB a call (2 and 4 ranks on one machine, polled, every call of a 400-call run);
        the counts form about as long as the blocking call."""
        datatype = _MPI_TYPES[inp.dtype]
        return self.comm.Ireduce_scatter(_buffer(inp, datatype), _buffer(out, datatype),
                                         [out.numel()] * self._size, _MPI_OPS[op])

    def start_all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> "MPI.Request":
        """Start MPI's in-place all-reduce of ``tensor``."""
        return self.comm.Iallreduce(MPI.IN_PLACE, _buffer(tensor, _MPI_TYPES[tensor.dtype]), _MPI_OPS[op])

    def start_all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: Sequence[int] | None = None,
                         recv_counts: Sequence[int] | None = None) -> "MPI.Request":
        """Start MPI's all-to-all of ``size`` equal blocks, or of ``send_counts`` / ``recv_counts`` elements a
        block (``Ialltoallv``), as bytes."""
        check_split_counts(send_counts, recv_counts)
        if send_counts is None:
            return self.comm.Ialltoall(_buffer(inp), _buffer(out))
        size = inp.element_size()
        return self.comm.Ialltoallv([_buffer(inp)[0], _counts_and_displacements(send_counts, size), MPI.BYTE],
                                    [_buffer(out)[0], _counts_and_displacements(recv_counts, size), MPI.BYTE])

    def wait(self, request: "MPI.Request", what: str) -> None:
        """Complete a started collective within the deadline (driving every other pending one meanwhile)."""
        self._complete([request], [None], what)

    def barrier(self) -> None:
        self.comm.Barrier()

    #: MPI gets host buffers (CUDA tensors are staged, once per call, by the schedules that overlap calls).
    host_memory_only = True

    def reduces(self, dtype: torch.dtype) -> bool:
        """Whether MPI reduces host tensors of ``dtype`` as they are (16-bit floats: no)."""
        return dtype in _MPI_TYPES

    @staticmethod
    def _label(what: str, peers: Sequence[int | None]) -> str:
        """``what`` and the transport ranks it was with ("exchange with ranks 3/1"), for error messages
        only: nothing is formatted on the path that succeeds."""
        ranks = [str(p) for p in peers if p is not None]
        return f"{what} rank{'s' if len(ranks) > 1 else ''} {'/'.join(ranks)}" if ranks else what

    def _spin_for(self, key: tuple[str, int]) -> float:
        """How long a wait of kind ``key`` yields before it naps (see ``SPIN_FACTOR``)."""
        typical = self._typical.get(key)
        if typical is None:
            return self.spin_s
        longest = ALL_TO_ALL_MAX_SPIN_S if key[0] in _WAITS_FOR_PEERS else MAX_SPIN_S
        return min(max(self.spin_s, SPIN_FACTOR * typical), max(self.spin_s, longest))

    def _learn(self, key: tuple[str, int], seconds: float) -> None:
        """Track the fastest recent wait of kind ``key``: a minimum that rises at most ``_TYPICAL_RISE``-fold a
        call, so waits for late peers barely move it while a lasting slow-down (a slower link) is followed."""
        typical = self._typical.get(key)
        self._typical[key] = seconds if typical is None or seconds < typical else min(seconds, typical * _TYPICAL_RISE)

    def _complete(self, requests: list["MPI.Request"], peers: Sequence[int | None], what: str,
                  nbytes: int = 0, *, spun: float = 0.0) -> None:
        """Wait for ``requests`` (one peer each; None: the whole group) until the deadline, else ``Stalled``.

        Polls in batches of ``_POLLS_PER_CHECK`` (yield, test) with nothing else in between: on a shared
        core every instruction between two tests delays the peers this rank waits for. The clock, the
        deadline and the failure notices are looked at between batches; after the spin of this kind of wait
        (``what`` and the size class of ``nbytes``: ``_spin_for``) the yield becomes a nap; ``spun``: seconds this
        wait already polled (the compiled hot path's fast poll), counted against the spin and the deadline."""
        # One request: its own Test (Testall on a one-element list cost 20 us more per 1 KiB all-reduce
        # on 4 ranks sharing 2 cores: 90 against 70 us).
        test = requests[0].Test if len(requests) == 1 else functools.partial(MPI.Request.Testall, requests)
        start = time.monotonic() - spun
        key = (what, nbytes.bit_length())
        try:
            if not test():  # a real wait: the running call's flight-recorder slot names who it is waiting for
                waiting = flight_recorder.waiting_on(self, peers)
                self._poll(test, requests, peers, what, start, self._spin_for(key))
                flight_recorder.waited(waiting)
        except MPI.Exception as exc:  # a fault-tolerant MPI (ULFM) reports the failure instead of hanging
            raise self._process_failure(exc.Get_error_class(), peers, what, time.monotonic() - start) from exc
        self._learn(key, time.monotonic() - start)

    def _poll(self, test: Callable[[], bool], requests: list["MPI.Request"], peers: Sequence[int | None],
              what: str, start: float, spin_s: float) -> None:
        """``_complete``'s loop: poll ``test`` until it succeeds, the deadline passes or a peer is known dead."""
        deadline = start + self.timeout_s
        next_failure_check = start + _FAILURE_CHECK_S
        pause = os.sched_yield
        while True:
            for _ in range(_POLLS_PER_CHECK):
                pause()
                if test():
                    return
            now = time.monotonic()
            if failure_notice.reported():
                # Stop touching MPI at once: polling a dead peer may make MPICH abort the whole job.
                pending = [q for p in peers for q in (self.others() if p is None else [p])]
                raise Stalled(self.communicator_ranks(pending), now - start,
                              f"{self._label(what, peers)} over MPI: mpiexec reported a failed process")
            if now >= deadline:
                self._abandon(requests, peers, what, now - start)
            if now >= next_failure_check and _revoke_supported():
                # ULFM: a failure this rank's requests never hear of (a non-blocking collective's
                # schedule can wait on a survivor) is still known to its failure detector.
                next_failure_check = now + _FAILURE_CHECK_S
                if self._failed_ranks(wait_s=0.0):
                    raise self._process_failure(MPI.ERR_PROC_FAILED, peers, what, now - start)
            if now - start >= spin_s:
                pause = _nap

    def _process_failure(self, error_class: int, peers: Sequence[int | None], what: str, waited: float) -> Stalled:
        """The error for a failure MPI reported (``error_class``): names the failed processes once MPI knows
        them, and revokes this communicator so its other members stop waiting too."""
        global _mpi_reported_failure
        _mpi_reported_failure = True
        revoked = error_class == MPI.ERR_REVOKED or self._is_revoked()
        failed = self._failed_ranks(wait_s=0.0 if revoked else _FAILED_WAIT_S)
        revoked = revoked and not failed  # a peer's revoke after a real failure: report the failure
        pending = failed or [q for p in peers for q in (self.others() if p is None else [p])]
        self.abort()
        if revoked:
            detail = "a peer gave up on the communicator and revoked it (MPI_ERR_REVOKED)"
        else:
            detail = f"MPI reported a failed process ({_ERROR_NAMES.get(error_class, MPI.Get_error_string(error_class).strip())})"
        return Stalled(self.communicator_ranks(pending), waited, f"{self._label(what, peers)} over MPI: {detail}")

    def _is_revoked(self) -> bool:
        try:
            return bool(self.comm.Is_revoked())
        except (MPI.Exception, NotImplementedError, AttributeError):
            return False

    def _failed_ranks(self, wait_s: float) -> list[int]:
        """This communicator's ranks that MPI knows have failed (ULFM; [] elsewhere). A rank can hear of a
        failure (its operation failed) shortly before its failure detector names the process: wait up to
        ``wait_s`` for the name. (Survivors that already gave up and exited count as failed too.)"""
        give_up = time.monotonic() + wait_s
        while True:
            try:
                group = self.comm.Get_failed()
            except (MPI.Exception, NotImplementedError, AttributeError):
                return []
            try:
                ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), self.comm.Get_group())
            finally:
                group.Free()
            failed = [r for r in ranks if r != MPI.UNDEFINED]
            if failed or time.monotonic() >= give_up:
                return failed
            time.sleep(0.01)

    def abort(self) -> None:
        """Revoke the communicator once MPI has reported a process failure (ULFM): every member's pending
        and future operations on it fail at once instead of waiting for a rank that gave up."""
        if self.comm == MPI.COMM_NULL or not (_mpi_reported_failure or _revoke_supported()):
            return
        try:
            self.comm.Revoke()
        except (MPI.Exception, NotImplementedError, AttributeError):
            pass  # not a fault-tolerant MPI: the peers' own deadlines end their waits

    def _abandon(self, requests: list["MPI.Request"], peers: Sequence[int | None], what: str,
                 waited: float) -> None:
        """Cancel what is still pending (a late message must not land in the caller's buffer) and raise."""
        pending: list[int] = []
        for request, peer in zip(requests, peers):
            if request.Test():
                continue
            pending.extend(self.others() if peer is None else [peer])
            try:
                request.Cancel()
            except MPI.Exception:
                pass  # a started collective or send cannot always be cancelled; the communicator is broken anyway
        raise Stalled(self.communicator_ranks(pending), waited,
                      f"{self._label(what, peers)} over MPI: timed out after {self.timeout_s:g} s")

    @staticmethod
    @contextmanager
    def _typed(tensor: torch.Tensor, *, copy_back: bool) -> Iterator[torch.Tensor]:
        """A float32 copy of a 16-bit host ``tensor`` for MPI to reduce (written back with ``copy_back``); a
        tensor MPI reduces as it is, itself."""
        wanted = _UPCAST.get(tensor.dtype, tensor.dtype)
        if wanted == tensor.dtype:
            yield tensor
            return
        staged = tensor.to(wanted)
        yield staged
        if copy_back:
            tensor.copy_(staged)

    def close(self) -> None:
        self.release_persistent()
        if self._owned and self.comm != MPI.COMM_NULL:
            self.comm.Free()
            self.comm = MPI.COMM_NULL
