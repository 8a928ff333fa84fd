"""Pipelined compressed two-level collectives: the fixed-size wire formats (``bf16``, ``int8``, ``fp8``) on the
pipelined hierarchy of ``algorithms.pipelined``, so that one chunk's encoding, decoding and exact intra-node
phases run while another chunk's encoded bytes cross the network.

The steps of a chunk are those of the unpipelined two-level forms (``schedules.hierarchical_*``), with the
inter-node exchanges as non-blocking native collectives (all-gather, and an all-to-all of equal encoded
blocks for the reduce-scatter) and the encoding and decoding as local steps between them; ``pipelined.run``
starts them in one fixed order on every rank. P = N nodes x L ranks, chunk ``c`` of width ``w``:

- all-gather: encode input[c]; inter AG of the bytes -> [N, bytes(w)]; intra AG of those -> [L, N, bytes(w)];
  decode each into out[rank, c].
- reduce-scatter: pack input[:, :, c] -> [L, N, w]; intra RS (exact) -> [N, w]; encode the N - 1 blocks bound
  for the other nodes; inter all-to-all; decode-accumulate in node order (own block exact) into out[c].
- all-reduce: intra RS (exact) of piece c -> N sub-blocks; the compressed reduce-scatter between nodes as
  above; the reduced sub-block encoded once; inter AG and intra AG of the bytes; every rank decodes every
  sub-block, so results are bitwise identical on every rank.

Chunks start at multiples of the quantization block (``QBLOCK``), so all-gathers and reduce-scatters of
float32 and float64 tensors give exactly the unpipelined compressed results. Tensors a level cannot reduce
(16-bit floats on MPI) run in float32 for the whole call, as in the exact pipelined schedules, so their
partial sums are not rounded to 16 bits between the levels.
"""

from __future__ import annotations

import torch

from pccl_torch.algorithms.pipelined import chunk_bounds, restore, run, staged
from pccl_torch.compression.formats import WireFormat
from pccl_torch.compression.schedules import accumulator_dtype, combine_in_rank_order, decode_node_major, slots
from pccl_torch.ops import ReduceOp
from pccl_torch.transport.base import Transport
from pccl_torch.triton_kernels import QBLOCK, pack_window


def _encode_others(fmt: WireFormat, blocks: list[torch.Tensor], send: list[torch.Tensor], node: int) -> None:
    for j, block in enumerate(blocks):
        if j != node:
            fmt.encode_into(block, send[j])


def all_gather(fmt: WireFormat, intra: Transport, inter: Transport, out: torch.Tensor, inp: torch.Tensor,
               chunks: int) -> None:
    nodes, local, n = inter.size, intra.size, inp.numel()
    if n == 0:
        return
    host_out = staged(out, False, (intra, inter), contents=False)
    host_in = staged(inp, False, (intra, inter))
    steps = []
    for start, stop in chunk_bounds(n, chunks, multiple=QBLOCK):
        width = fmt.wire_bytes(stop - start, inp.dtype)
        wire = torch.empty(width, dtype=torch.uint8, device=host_in.device)
        from_nodes = torch.empty(nodes * width, dtype=torch.uint8, device=host_in.device)
        everyone = torch.empty(local * nodes * width, dtype=torch.uint8, device=host_in.device)
        steps.append((
            (None, lambda x=host_in[start:stop], wire=wire: fmt.encode_into(x, wire), "encode"),
            (inter, lambda wire=wire, g=from_nodes: inter.start_all_gather(g, wire), "inter all-gather (encoded)"),
            (intra, lambda g=from_nodes, e=everyone: intra.start_all_gather(e, g), "intra all-gather (encoded)"),
            (None, lambda e=everyone, width=width, start=start, w=stop - start: decode_node_major(
                fmt, e, width, local, nodes, host_out, w, True, stride=n, offset=start), "decode"),
        ))
    run(steps)
    restore(out, host_out)


def reduce_scatter(fmt: WireFormat, intra: Transport, inter: Transport, inp: torch.Tensor, out: torch.Tensor,
                   op: ReduceOp, chunks: int) -> None:
    nodes, local, n, node = inter.size, intra.size, out.numel(), inter.rank
    if n == 0:
        return
    host_in, host_out = staged(inp, True, (intra, inter)), staged(out, True, (intra, inter), contents=False)
    acc_dtype = accumulator_dtype(host_out.dtype)
    steps = []
    for start, stop in chunk_bounds(n, chunks, multiple=QBLOCK):
        w = stop - start
        width = fmt.wire_bytes(w, host_in.dtype)
        packed = torch.empty(local * nodes * w, dtype=host_in.dtype, device=host_in.device)
        partial = torch.empty(nodes * w, dtype=host_in.dtype, device=host_in.device)
        send = torch.empty(nodes * width, dtype=torch.uint8, device=host_in.device)
        recv = torch.empty(nodes * width, dtype=torch.uint8, device=host_in.device)
        target = host_out[start:stop]

        def combine(partial=partial, recv=recv, target=target, w=w, width=width) -> None:
            acc = target if target.dtype == acc_dtype else torch.empty(w, dtype=acc_dtype, device=target.device)
            combine_in_rank_order(fmt, partial[node * w:(node + 1) * w], slots(recv, width), node, acc, op)
            if acc is not target:
                target.copy_(acc)

        steps.append((
            (None, lambda p=packed, s=start, w=w: pack_window(host_in, p, nodes, local, n, s, w), "pack"),
            (intra, lambda p=packed, q=partial: intra.start_reduce_scatter(q, p, op), "intra reduce-scatter"),
            (None, lambda q=partial, s=send, w=w, width=width: _encode_others(
                fmt, list(q.view(nodes, w)), slots(s, width), node), "encode"),
            (inter, lambda s=send, r=recv: inter.start_all_to_all(r, s), "inter all-to-all (encoded)"),
            (None, combine, "decode and combine"),
        ))
    run(steps)
    restore(out, host_out)


def all_reduce(fmt: WireFormat, intra: Transport, inter: Transport, buf: torch.Tensor, op: ReduceOp,
               chunks: int) -> None:
    nodes, local, n, node = inter.size, intra.size, buf.numel(), inter.rank
    if n == 0:
        return
    host = staged(buf, True, (intra, inter))
    acc_dtype = accumulator_dtype(host.dtype)
    group = local * nodes  # a piece holds a whole number of sub-blocks, one per rank
    bounds = chunk_bounds(n, chunks, multiple=group)
    width = max(-(-(bounds[0][1] - bounds[0][0]) // group) * group, group)
    padded_len = width * len(bounds)
    work = host if padded_len == n else torch.zeros(padded_len, dtype=host.dtype, device=host.device)
    if work is not host:
        work[:n].copy_(host)
    sub = width // group
    nbytes = fmt.wire_bytes(sub, host.dtype)
    steps = []
    for start in range(0, padded_len, width):
        piece = work[start:start + width]
        shard = torch.empty(sub * nodes, dtype=host.dtype, device=host.device)
        send = torch.empty(nodes * nbytes, dtype=torch.uint8, device=host.device)
        recv = torch.empty(nodes * nbytes, dtype=torch.uint8, device=host.device)
        wire = torch.empty(nbytes, dtype=torch.uint8, device=host.device)
        from_nodes = torch.empty(nodes * nbytes, dtype=torch.uint8, device=host.device)
        everyone = torch.empty(group * nbytes, dtype=torch.uint8, device=host.device)

        def combine_and_encode(shard=shard, recv=recv, wire=wire) -> None:
            acc = torch.empty(sub, dtype=acc_dtype, device=shard.device)
            combine_in_rank_order(fmt, shard[node * sub:(node + 1) * sub], slots(recv, nbytes), node, acc, op)
            fmt.encode_into(acc if acc.dtype == shard.dtype else acc.to(shard.dtype), wire)

        steps.append((
            (intra, lambda p=piece, s=shard: intra.start_reduce_scatter(s, p, op), "intra reduce-scatter"),
            (None, lambda s=shard, snd=send: _encode_others(fmt, list(s.view(nodes, sub)), slots(snd, nbytes), node),
             "encode"),
            (inter, lambda snd=send, r=recv: inter.start_all_to_all(r, snd), "inter all-to-all (encoded)"),
            (None, combine_and_encode, "combine and encode"),
            (inter, lambda wire=wire, g=from_nodes: inter.start_all_gather(g, wire), "inter all-gather (encoded)"),
            (intra, lambda g=from_nodes, e=everyone: intra.start_all_gather(e, g), "intra all-gather (encoded)"),
            (None, lambda e=everyone, p=piece: decode_node_major(fmt, e, nbytes, local, nodes, p, sub, False),
             "decode"),
        ))
    run(steps)
    if work is not host:
        host.copy_(work[:n])
    restore(buf, host)
