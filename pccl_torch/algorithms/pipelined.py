"""Pipelined two-level compositions: the hierarchical schedules of ``hierarchical.py`` cut into chunks, so
the intra-node phase of one chunk runs while the inter-node phase of another crosses the network.

Both levels are driven by non-blocking native collectives (MPI's ``Iallgather``, ``Ireduce_scatter`` (equal counts),
``Iallreduce``, or a torch group's async calls where pccl runs without an MPI launch); a step of chunk ``c`` starts once step ``k - 1`` of the same
chunk has completed. Steps are started in one fixed order on every rank (tick ``t`` starts step ``k`` of
chunk ``t - k`` for k = 0, 1, ...), so every communicator sees its collectives in the same order on all
ranks, as MPI requires; waiting on the earliest unfinished step of that order cannot deadlock, and every
wait drives all the started steps (MPI progresses every pending request while one is tested; gloo and NCCL
progress on their own threads and streams).

P = N nodes x L ranks; a chunk of width w elements (of the n per rank block, or of the all-reduce buffer):
- all-gather: inter AG of input[c] -> [N, w]; intra AG -> [L, N, w]; unpack into out[:, :, c] of [N, L, n].
- reduce-scatter: pack input[:, :, c] of [N, L, n] -> [L, N, w]; intra RS -> [N, w]; inter RS -> out[c].
- all-reduce: intra RS of buf[c] (w a multiple of L) -> shard [w / L]; inter AR of the shard; intra AG.
Results equal the unpipelined schedule's element for element (each element takes the same reductions in
the same order); all-reduce results are bitwise identical on every rank. Where a level cannot reduce 16-bit floats (MPI)
they are reduced in float32, and where a level needs host memory (MPI) CUDA tensors are staged through it,
once for the whole call: then every temporary is host memory, and the only device memory a worker uses is the
call's workspace lanes, for the conversions of 16-bit floats (``staging.transfer``, ``pccl_torch.workspace``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from pccl_torch import scratch, workspace
from pccl_torch.cuda_streams import host_wait
from pccl_torch.profiling import chunk_step
from pccl_torch.ops import ReduceOp
from pccl_torch.transport.base import Transport
from pccl_torch.transport.staging import chunk_bounds, transfer
from pccl_torch.triton_kernels import pack_window, unpack_window

#: A step of one chunk: starts its collective and returns the request, or does local work and returns None.
Step = Callable[[], object]


def run(chunk_steps: Sequence[Sequence[tuple[Transport | None, Step, str]]]) -> None:
    """Run every chunk's steps in order, overlapping chunks: see the module docstring for the order. While a
    torch profiler records, each step's start and each wait is a range (``profiling.chunk_step``)."""
    started: dict[tuple[int, int], tuple[Transport, object, str]] = {}
    depth = len(chunk_steps[0])

    def finish(c: int, k: int) -> None:
        pending = started.pop((c, k), None)
        if pending is not None:
            transport, request, what = pending
            with chunk_step(what, c, transport, waiting=True):
                transport.wait(request, what)

    for tick in range(len(chunk_steps) + depth - 1):
        for k in range(depth):
            c = tick - k
            if not 0 <= c < len(chunk_steps):
                continue
            if k:
                finish(c, k - 1)
            transport, step, what = chunk_steps[c][k]
            with chunk_step(what, c, transport):
                request = step()
            if transport is not None:
                started[(c, k)] = (transport, request, what)
    for c, k in sorted(started):
        finish(c, k)


def staged(tensor: torch.Tensor, reduce: bool, levels: Sequence[Transport], *, contents: bool = True) -> torch.Tensor:
    """A tensor every one of ``levels`` can work on, holding ``tensor`` (``contents``; an output needs only the
    room): in pinned host memory when one of them needs host memory, in float32 when one of them cannot reduce
    the dtype (``reduce``); ``tensor`` itself when it is. Results go back with :func:`restore`."""
    host = tensor.is_cuda and any(t.host_memory_only for t in levels)
    upcast = reduce and not all(t.reduces(tensor.dtype) for t in levels)
    if not (host or upcast):
        return tensor
    dtype = torch.float32 if upcast else tensor.dtype
    if not host:  # host tensors (a CUDA tensor is never upcast without a level needing host memory)
        copy = workspace.empty(tensor.numel(), dtype, tensor.device).view(tensor.shape)
        return copy.copy_(tensor) if contents else copy
    copy = torch.empty(tensor.shape, dtype=dtype, pin_memory=True)
    if contents:  # converted on the device if need be, one copy into page-locked memory, after the caller's work
        transfer(tensor, copy, non_blocking=True)
        host_wait(torch.cuda.current_stream(tensor.device))  # MPI reads the host copy (docs/gpus.md)
    return copy


def restore(tensor: torch.Tensor, copy: torch.Tensor) -> None:
    """``copy``'s results into ``tensor`` (a :func:`staged` copy of it; nothing when it is ``tensor``), in the
    caller's stream order on CUDA."""
    if copy is not tensor:
        transfer(copy, tensor, non_blocking=tensor.is_cuda)


def all_gather(intra: Transport, inter: Transport, out: torch.Tensor, inp: torch.Tensor, chunks: int) -> None:
    nodes, local, n = inter.size, intra.size, inp.numel()
    host_out = staged(out, False, (intra, inter), contents=False)
    host_in = staged(inp, False, (intra, inter))
    from_nodes = scratch.empty("pipelined.all_gather.from_nodes", nodes * n, host_in.dtype, host_in.device)
    by_local = scratch.empty("pipelined.all_gather.by_local", local * nodes * n, host_in.dtype, host_in.device)
    steps = []
    for start, stop in chunk_bounds(n, chunks):
        w = stop - start
        g1, g2 = from_nodes[nodes * start:nodes * stop], by_local[local * nodes * start:local * nodes * stop]
        steps.append((
            (inter, lambda i=host_in[start:stop], g1=g1: inter.start_all_gather(g1, i), "inter all-gather"),
            (intra, lambda g1=g1, g2=g2: intra.start_all_gather(g2, g1), "intra all-gather"),
            (None, lambda g2=g2, s=start, w=w: unpack_window(g2, host_out, local, nodes, n, s, w), "unpack"),
        ))
    run(steps)
    restore(out, host_out)


def reduce_scatter(intra: Transport, inter: Transport, inp: torch.Tensor, out: torch.Tensor, op: ReduceOp,
                   chunks: int) -> None:
    nodes, local, n = inter.size, intra.size, out.numel()
    host_in, host_out = staged(inp, True, (intra, inter)), staged(out, True, (intra, inter), contents=False)
    packed = scratch.empty("pipelined.reduce_scatter.packed", local * nodes * n, host_in.dtype, host_in.device)
    partial = scratch.empty("pipelined.reduce_scatter.partial", nodes * n, host_in.dtype, host_in.device)
    steps = []
    for start, stop in chunk_bounds(n, chunks):
        w = stop - start
        p, q = packed[local * nodes * start:local * nodes * stop], partial[nodes * start:nodes * stop]
        steps.append((
            (None, lambda p=p, s=start, w=w: pack_window(host_in, p, nodes, local, n, s, w), "pack"),
            (intra, lambda p=p, q=q: intra.start_reduce_scatter(q, p, op), "intra reduce-scatter"),
            (inter, lambda q=q, o=host_out[start:stop]: inter.start_reduce_scatter(o, q, op), "inter reduce-scatter"),
        ))
    run(steps)
    restore(out, host_out)


def all_reduce(intra: Transport, inter: Transport, buf: torch.Tensor, op: ReduceOp, chunks: int) -> None:
    local, n = intra.size, buf.numel()
    host = staged(buf, True, (intra, inter))
    bounds = chunk_bounds(n, chunks, multiple=local)
    width = max(-(-(bounds[0][1] - bounds[0][0]) // local) * local, local)  # whole shards, >= 1 each
    padded_len = width * len(bounds)
    if padded_len == n:
        work = host
    else:  # every chunk a whole number of shards; the padding is discarded
        work = scratch.empty("pipelined.all_reduce.padded", padded_len, host.dtype, host.device)
        work[:n].copy_(host)
        work[n:].zero_()
    shards = scratch.empty("pipelined.all_reduce.shards", padded_len // local, host.dtype, host.device)
    steps = []
    for start in range(0, padded_len, width):
        piece, shard = work[start:start + width], shards[start // local:(start + width) // local]
        steps.append((
            (intra, lambda p=piece, s=shard: intra.start_reduce_scatter(s, p, op), "intra reduce-scatter"),
            (inter, lambda s=shard: inter.start_all_reduce(s, op), "inter all-reduce"),
            (intra, lambda p=piece, s=shard: intra.start_all_gather(p, s), "intra all-gather"),
        ))
    run(steps)
    if work is not host:
        host.copy_(work[:n])
    restore(buf, host)
