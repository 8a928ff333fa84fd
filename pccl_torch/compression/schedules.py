"""Compressed collectives over any :class:`~pccl_torch.transport.base.Transport`: the inter-node phase of a
hierarchical plan with ``compression=``, or the whole of a flat one. Same calling conventions as the
registered schedules (``registry.py``), with the wire format first, so ``functools.partial(schedule, fmt)``
stands in for an inter-node schedule.

- all-gather: encode this rank's block once; all-gather the wire bytes (the transport's own all-gather;
  variable-size wires first agree on the largest size); decode every block, this rank's own too, so
  every rank holds the same values.
- reduce-scatter (after ZeRO++'s all-to-all reduce-scatter): encode each destination's block; exchange them
  pairwise (step k: send to rank + k, receive from rank - k); decode and combine the p contributions in
  rank order into a float32 accumulator (float64 for float64), this rank's own block exact; round once.
  Every contribution is encoded once, so errors do not compound with the rank count as they would
  if a ring re-encoded partial sums.
- all-reduce: the compressed reduce-scatter to a 1/p shard, then the compressed all-gather of the shards:
  every rank decodes the same bytes, so results are bitwise identical on every rank.
- all-to-all: encode each block bound for another node once, at its source (its own absmax groups: a rank's
  small values never share a scale with another's large ones), lay every block end to end as bytes (the
  blocks that stay in the node as they are), run the plan's exact all-to-all on those bytes, two-level or
  flat (variable-size wires announce their sizes first, one integer per peer), and decode each block in its
  place at its destination. pccl's flat ``mpi`` plan on host tensors, with a fixed-size format, across a slow
  link, cuts the blocks into pieces whose exchanges overlap the encoding and decoding of the next and previous
  piece (``chunked_all_to_all``; ``Plan.run_all_to_all`` decides, ``chunk_count`` counts).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from pccl_torch.algorithms._layout import Blocks
from pccl_torch.compression.formats import WireFormat, aligned
from pccl_torch.ops import ReduceOp
from pccl_torch.profiling import phase
from pccl_torch.transport.base import COMPRESSED_ALL_TO_ALL, Transport
from pccl_torch.transport.staging import chunk_bounds
from pccl_torch.triton_kernels import QBLOCK, reduce_


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype compressed reductions accumulate in: float64 for float64, float32 for every other float."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def slots(buffer: torch.Tensor, width: int) -> list[torch.Tensor]:
    """``buffer`` cut into consecutive messages of ``width`` bytes (views)."""
    return [buffer[i * width:(i + 1) * width] for i in range(buffer.numel() // width)] if width else []


def combine_in_rank_order(fmt: WireFormat, own: torch.Tensor, received: list[torch.Tensor | None], me: int,
                          acc: torch.Tensor, op: ReduceOp) -> None:
    """``acc`` = ``op``, in rank order, of every rank's contribution: ``own`` (this rank's, exact) at ``me`` and
    the decoded ``received[i]`` of the others (``received[me]`` is not read)."""
    for i, wire in enumerate(received):
        if i == me:
            if i == 0:
                acc.copy_(own)
            else:
                reduce_(acc, own.to(acc.dtype), op)
        elif i == 0:
            fmt.decode(wire, acc)
        else:
            fmt.decode_accumulate(wire, acc, op)


def _sizes(t: Transport, nbytes: int, data_device: torch.device) -> list[int]:
    """Every rank's ``nbytes`` (an all-gather of one int64 each), on the level's control device: the host where it
    takes host memory (MPI, gloo), else the data's device (NCCL refuses host tensors; reading the sizes back is then
    a device-to-host copy, listed in docs/gpus.md)."""
    device = t.control_device(data_device)
    mine = torch.tensor([nbytes], dtype=torch.int64, device=device)
    every = torch.empty(t.size, dtype=torch.int64, device=device)
    t.native_all_gather(every, mine)
    return every.tolist()


def gather_wires(t: Transport, wire: torch.Tensor, fixed: int | None) -> tuple[torch.Tensor, int]:
    """Every rank's wire bytes in rank order, end to end in one buffer, and the width of each."""
    if fixed is None:  # variable size: pad everyone's to the largest
        width = aligned(max(_sizes(t, wire.numel(), wire.device)))
        padded = torch.zeros(width, dtype=torch.uint8, device=wire.device)
        padded[:wire.numel()].copy_(wire)
        wire = padded
    else:
        width = fixed
    gathered = torch.empty(t.size * width, dtype=torch.uint8, device=wire.device)
    t.native_all_gather(gathered, wire)
    return gathered, width


def all_gather_wires(t: Transport, wire: torch.Tensor, fixed: int | None) -> list[torch.Tensor]:
    """Every rank's wire bytes in rank order (views into one receive buffer)."""
    gathered, width = gather_wires(t, wire, fixed)
    return slots(gathered, width)


def exchange_wires(t: Transport, wires: list[torch.Tensor | None], fixed: int | None) -> list[torch.Tensor | None]:
    """All-to-all: ``wires[j]`` goes to rank ``j``; returns what each rank sent here (None for this rank).
    Pairwise steps, send to ``rank + k`` while receiving from ``rank - k`` (MPICH's large all-to-all)."""
    p, me = t.size, t.rank
    received: list[torch.Tensor | None] = [None] * p
    for k in range(1, p):
        dest, source = (me + k) % p, (me - k) % p
        outgoing = wires[dest]
        assert outgoing is not None
        if fixed is None:  # announce the size first
            size = torch.empty(1, dtype=torch.int64)
            t.sendrecv(torch.tensor([outgoing.numel()], dtype=torch.int64), dest, size, source)
            width = int(size[0])
        else:
            width = fixed
        incoming = torch.empty(width, dtype=torch.uint8, device=outgoing.device)
        t.sendrecv(outgoing, dest, incoming, source)
        received[source] = incoming
    return received


def all_gather(fmt: WireFormat, t: Transport, out: torch.Tensor, inp: torch.Tensor, blocks: Blocks) -> None:
    """``out`` block ``i`` = rank ``i``'s ``inp`` through ``fmt`` (decoded on every rank alike)."""
    if blocks.total == 0:
        return
    wires = all_gather_wires(t, fmt.encode(inp), fmt.wire_bytes(inp.numel(), inp.dtype))
    for i, wire in enumerate(wires):
        fmt.decode(wire, blocks.block(out, i))


def reduce_scatter(fmt: WireFormat, t: Transport, inp: torch.Tensor, out: torch.Tensor, blocks: Blocks,
                   op: ReduceOp) -> None:
    """``out`` = ``op`` over ranks, in rank order, of every rank's block ``t.rank`` of ``inp``."""
    p, me, n = t.size, t.rank, out.numel()
    if blocks.total == 0:
        return
    fixed = fmt.wire_bytes(n, inp.dtype)
    wires = [None if j == me else fmt.encode(blocks.block(inp, j)) for j in range(p)]
    received = exchange_wires(t, wires, fixed)
    acc_dtype = accumulator_dtype(out.dtype)
    acc = out if out.dtype == acc_dtype else torch.empty(n, dtype=acc_dtype, device=out.device)
    combine_in_rank_order(fmt, blocks.block(inp, me), received, me, acc, op)
    if acc is not out:
        out.copy_(acc)


def all_reduce(fmt: WireFormat, t: Transport, buf: torch.Tensor, op: ReduceOp) -> None:
    """In place ``op`` over every rank's ``buf``, bitwise identical on every rank."""
    p, n = t.size, buf.numel()
    if n == 0:
        return
    shard_len = -(-n // p)
    if shard_len * p == n:
        padded = buf
    else:  # equal shards; the padding is discarded
        padded = torch.zeros(shard_len * p, dtype=buf.dtype, device=buf.device)
        padded[:n].copy_(buf)
    layout = Blocks.even(p, shard_len)
    shard = torch.empty(shard_len, dtype=buf.dtype, device=buf.device)
    reduce_scatter(fmt, t, padded, shard, layout, op)
    all_gather(fmt, t, padded, shard, layout)
    if padded is not buf:
        buf.copy_(padded[:n])



def all_to_all(fmt: WireFormat, move: Callable[[torch.Tensor, torch.Tensor, Blocks, Blocks], None],
               announce: Callable[[list[int]], list[int]], out: torch.Tensor, inp: torch.Tensor, send: Blocks,
               recv: Blocks, me: int, local: int) -> None:
    """``out`` block ``i`` = rank ``i``'s block for rank ``me``, through ``fmt`` where it crosses nodes (ranks
    ``i // local`` and ``me // local`` differ), exact otherwise. ``move(out, inp, send, recv)`` runs the exact
    all-to-all (any schedule, flat or two-level) on the bytes; ``announce(sizes)`` tells each rank the byte
    count this rank sends it and returns what each sends this rank (variable-size formats only)."""
    p, node = len(send.counts), me // local

    def wire_of(i: int, count: int) -> int | None:  # bytes of one block on the wire (None: known once sent)
        return _wire_bytes(fmt, inp.dtype, count, i // local == node)

    pieces = [wire_of(j, c) for j, c in enumerate(send.counts)]
    encoded = {j: fmt.encode(send.block(inp, j)) for j, width in enumerate(pieces) if width is None}
    send_bytes = Blocks.from_counts([aligned(encoded[j].numel() if w is None else w) for j, w in enumerate(pieces)])
    outgoing = torch.zeros(send_bytes.total, dtype=torch.uint8, device=inp.device)
    for j, width in enumerate(pieces):
        slot = send_bytes.block(outgoing, j)
        if j in encoded:
            slot[:encoded[j].numel()].copy_(encoded[j])
        elif width:
            _to_wire(fmt, send.block(inp, j), slot[:width], j // local == node)
    widths = [wire_of(i, c) for i, c in enumerate(recv.counts)]
    recv_bytes = Blocks.from_counts([aligned(w) for w in widths] if fmt.fixed_size else  # every rank alike:
                                    announce(list(send_bytes.counts)))  # announcing is collective
    incoming = torch.empty(recv_bytes.total, dtype=torch.uint8, device=inp.device)
    move(incoming, outgoing, send_bytes, recv_bytes)
    for i, count in enumerate(recv.counts):
        if count:
            wire = recv_bytes.block(incoming, i)
            _from_wire(fmt, wire if widths[i] is None else wire[:widths[i]], recv.block(out, i), i // local == node)


def _wire_bytes(fmt: WireFormat, dtype: torch.dtype, count: int, near: bool) -> int | None:
    """Bytes of ``count`` elements of a block on the wire: as they are when the block stays in the node (``near``),
    else the format's (None for a variable-size format: known once encoded)."""
    return count * dtype.itemsize if near or count == 0 else fmt.wire_bytes(count, dtype)


def _to_wire(fmt: WireFormat, block: torch.Tensor, slot: torch.Tensor, near: bool) -> None:
    """A block (or a piece of one) into its bytes on the wire: as it is when it stays in the node (``near``),
    else encoded (fixed-size formats; ``slot`` is exactly the encoded length)."""
    if near:
        slot.copy_(block.view(torch.uint8))
    else:
        fmt.encode_into(block, slot)


def _from_wire(fmt: WireFormat, wire: torch.Tensor, target: torch.Tensor, near: bool) -> None:
    """:func:`_to_wire` undone, into ``target``."""
    if near:
        target.view(torch.uint8).copy_(wire)
    else:
        fmt.decode(wire, target)


#: The part of a rank's buffer each piece of a chunked compressed all-to-all carries (every block cut alike).
#: Measured with an mpi4py prototype of the schedule on the 3 x 2 testbed at 200 Mbit/s, int8 (2026-12-05): 1, 4
#: and 16 MiB a rank took 25-26 / 81 / 321 ms in one piece, 19-20 / 66-71 / 265 ms in pieces of 256 KiB (4 / 16 /
#: 64); pieces of 1 MiB lost the overlap at 4 and 16 MiB (88 / 358 ms: MPICH's messages past its eager size),
#: pieces of 128 KiB and less paid a call each (23 ms at 1 MiB, 91-157 ms at 4 MiB).
CHUNK_BYTES = 256 * 1024
MAX_CHUNKS = 256
#: Pieces pay only where the link, not the cores, bounds the call: on links faster than this the encoding and
#: decoding take as long as the bytes' transfer, and each piece's calls and per-call encoding costs add to it.
#: pccl-bench on the testbed, int8, one piece against pieces of 256 KiB (2026-12-05): at 200 Mbit/s (25 MB/s)
#: 3 x 2 1 MiB 26.9 -> 22.0 ms, 4 MiB 84 -> 77-82 ms, 2 x 2 even (15.1 / 53.0 ms against 14.9 / 55.6); at 1 Gbit/s
#: (119 MB/s) 2 x 2 1 MiB 4.5 -> 9.1 ms, 4 MiB 18 -> 29 ms, 3 x 2 1 MiB 8.4 -> 15.1 ms, 4 MiB 36 -> 59 ms.
SLOW_LINK_BYTES_PER_S = 50e6


def chunk_count(nbytes: int, link_bytes_per_s: float | None) -> int:
    """Pieces of a chunked compressed all-to-all whose ranks each send ``nbytes`` (the same on every rank) over an
    inter-node link of ``link_bytes_per_s`` (None: not measured, as a fast one)."""
    if (math.inf if link_bytes_per_s is None else link_bytes_per_s) > SLOW_LINK_BYTES_PER_S:
        return 1
    return max(1, min(MAX_CHUNKS, -(-nbytes // CHUNK_BYTES)))


def chunked_all_to_all(fmt: WireFormat, world: Transport, out: torch.Tensor, inp: torch.Tensor, send: Blocks,
                       recv: Blocks, me: int, local: int, chunks: int) -> None:
    """:func:`all_to_all` over ``world``'s own non-blocking all-to-all for a fixed-size format, with every block
    cut into ``chunks`` pieces (on :data:`QBLOCK` boundaries, so the scales, and the values, are those of the
    whole block): piece ``k + 1`` is encoded and started before piece ``k`` is waited for and decoded, so the
    cores encode and decode while the network carries the bytes (the same ``chunks`` on every rank)."""
    node = me // local

    def cuts(counts: tuple[int, ...]) -> list[list[tuple[int, int]]]:  # ``chunks`` pieces a block, some empty
        return [(bounds := chunk_bounds(c, chunks, multiple=QBLOCK)) + [(c, c)] * (chunks - len(bounds))
                for c in counts]

    def width(peer: int, n: int) -> int:  # bytes of n elements for or from ``peer`` on the wire (fixed-size format)
        return _wire_bytes(fmt, inp.dtype, n, peer // local == node)

    send_cuts, recv_cuts = cuts(send.counts), cuts(recv.counts)

    def start(k: int) -> tuple[object, torch.Tensor, Blocks, torch.Tensor]:
        spans = [cut[k] for cut in send_cuts]
        layout = Blocks.from_counts([aligned(width(j, hi - lo)) for j, (lo, hi) in enumerate(spans)])
        outgoing = torch.zeros(layout.total, dtype=torch.uint8, device=inp.device)  # padding: zeros, as one piece
        for j, (lo, hi) in enumerate(spans):
            if hi > lo:
                _to_wire(fmt, send.block(inp, j)[lo:hi], layout.block(outgoing, j)[:width(j, hi - lo)],
                         j // local == node)
        incoming = Blocks.from_counts([aligned(width(i, cut[k][1] - cut[k][0])) for i, cut in enumerate(recv_cuts)])
        received = torch.empty(incoming.total, dtype=torch.uint8, device=inp.device)
        request = world.start_all_to_all(received, outgoing, layout.counts, incoming.counts)
        return request, received, incoming, outgoing  # MPI reads ``outgoing`` until the request completes

    def finish(k: int, request: object, received: torch.Tensor, incoming: Blocks, _sent: torch.Tensor) -> None:
        world.wait(request, COMPRESSED_ALL_TO_ALL)
        for i, cut in enumerate(recv_cuts):
            lo, hi = cut[k]
            if hi > lo:
                _from_wire(fmt, incoming.block(received, i)[:width(i, hi - lo)], recv.block(out, i)[lo:hi],
                           i // local == node)

    pending = None
    for k in range(chunks):
        started = (k, *start(k))
        if pending is not None:
            finish(*pending)
        pending = started
    finish(*pending)


# Two-level forms for the fixed-size formats: the encoded bytes that crossed nodes are forwarded inside the
# node as they are (L x fewer bytes there than decoded floats) and decoded once, straight into their final
# place, which also replaces the unpack pass. The values are those of the inter-node schedules above
# followed by an exact intra-node all-gather: the same bytes are decoded by the same code. While a torch profiler
# records, their phases are ranges nested in the call's (pccl_torch.profiling.phase), as the exact forms' are.


def decode_node_major(fmt: WireFormat, wires: torch.Tensor, width: int, local: int, nodes: int,
                      out: torch.Tensor, n: int, node_major_out: bool, *, stride: int | None = None,
                      offset: int = 0) -> None:
    """``wires`` holds ``local x nodes`` messages (local rank l, node j) of ``n`` elements each; decode each into
    block ``j * local + l`` (global rank order) or ``l * nodes + j`` of ``out``. Block ``b`` is
    ``out[b * stride + offset:][:n]`` (default ``stride = n``, ``offset = 0``: blocks end to end; a pipelined chunk
    passes the full block length and its own start)."""
    stride = n if stride is None else stride
    for k, message in enumerate(slots(wires, width)):  # k = l * nodes + j
        target = (k % nodes) * local + k // nodes if node_major_out else k
        fmt.decode(message, out[target * stride + offset:target * stride + offset + n])


def hierarchical_all_gather(fmt: WireFormat, intra: Transport, inter: Transport, out: torch.Tensor,
                            inp: torch.Tensor) -> None:
    """Encode this rank's block; all-gather the bytes between nodes, then inside the node; decode every
    block into its global-rank place."""
    nodes, local, n = inter.size, intra.size, inp.numel()
    width = fmt.wire_bytes(n, inp.dtype)
    assert width is not None, "fixed-size formats only"
    if n == 0:
        return
    with phase("pccl:encode", inp):
        wire = fmt.encode(inp)
    with phase("pccl:inter:all_gather", wire, inter):
        from_nodes, _ = gather_wires(inter, wire, width)
    everyone = torch.empty(local * nodes * width, dtype=torch.uint8, device=inp.device)
    with phase("pccl:intra:all_gather", everyone, intra):
        intra.native_all_gather(everyone, from_nodes)
    with phase("pccl:decode", out):
        decode_node_major(fmt, everyone, width, local, nodes, out, n, node_major_out=True)


def hierarchical_all_reduce(fmt: WireFormat, intra: Transport, inter: Transport, buf: torch.Tensor,
                            op: ReduceOp) -> None:
    """Exact reduce-scatter inside the node; compressed reduce-scatter between nodes; the reduced piece
    encoded once, all-gathered between nodes and inside the node as bytes, and decoded by every rank."""
    local, nodes, n = intra.size, inter.size, buf.numel()
    if n == 0:
        return
    sub = -(-n // (local * nodes))  # each rank's finished piece; a shard is nodes pieces
    width = fmt.wire_bytes(sub, buf.dtype)
    assert width is not None, "fixed-size formats only"
    total = sub * nodes * local
    padded = buf if total == n else torch.zeros(total, dtype=buf.dtype, device=buf.device)
    if padded is not buf:
        with phase("pccl:pack", padded):
            padded[:n].copy_(buf)
    shard = torch.empty(sub * nodes, dtype=buf.dtype, device=buf.device)
    with phase("pccl:intra:reduce_scatter", padded, intra):
        intra.native_reduce_scatter(shard, padded, op)
    piece = torch.empty(sub, dtype=buf.dtype, device=buf.device)
    with phase("pccl:inter:reduce_scatter", shard, inter):
        reduce_scatter(fmt, inter, shard, piece, Blocks.even(nodes, sub), op)
    with phase("pccl:encode", piece):
        wire = fmt.encode(piece)
    with phase("pccl:inter:all_gather", wire, inter):
        from_nodes, _ = gather_wires(inter, wire, width)
    everyone = torch.empty(local * nodes * width, dtype=torch.uint8, device=buf.device)
    with phase("pccl:intra:all_gather", everyone, intra):
        intra.native_all_gather(everyone, from_nodes)
    with phase("pccl:decode", padded):
        decode_node_major(fmt, everyone, width, local, nodes, padded, sub, node_major_out=False)
    if padded is not buf:
        with phase("pccl:unpack", buf):
            buf.copy_(padded[:n])
