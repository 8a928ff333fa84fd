"""Reduce-scatter schedules: ring, recursive halving (any p, by folding) and pairwise (direct)."""

from __future__ import annotations

import torch

from pccl_torch import scratch
from pccl_torch.algorithms._layout import Blocks, Fold
from pccl_torch.algorithms.registry import register
from pccl_torch.ops import ReduceOp
from pccl_torch.transport.base import Transport
from pccl_torch.triton_kernels import reduce_


@register("reduce_scatter", "ring",
          summary="p-1 steps; each passes a running partial of one block to the right neighbour",
          cost="(p-1) a + (p-1)/p n (b + g)", scratch=lambda p, n: (2 * -(-n // p),) if p > 1 else ())
def ring(t: Transport, inp: torch.Tensor, out: torch.Tensor, blocks: Blocks, op: ReduceOp) -> None:
    r, p = t.rank, t.size
    if p == 1:
        out.copy_(inp)
        return
    # Step s sends the partial of block (r-s-1) and receives the partial of block (r-s-2), to which
    # this rank adds its own contribution; after p-1 steps the received block is block r, complete.
    pair = scratch.empty("reduce_scatter.ring.pair", 2 * blocks.max_count, inp.dtype, inp.device).view(2, -1)
    sending = blocks.block(inp, (r - 1) % p)
    for step in range(p - 1):
        index = (r - step - 2) % p
        receiving = pair[step % 2, : blocks.counts[index]]
        t.sendrecv(sending, (r + 1) % p, receiving, (r - 1) % p)
        reduce_(receiving, blocks.block(inp, index), op)
        sending = receiving
    out.copy_(sending)


@register("reduce_scatter", "recursive_halving",
          summary="lg p steps exchanging halving ranges with rank^2^k; non-powers of two fold in 2 extra steps",
          cost="lg p a + (p-1)/p n (b + g) (+ n b + n/p b if p is not a power of two)",
          scratch=lambda p, n: (n, n))
def recursive_halving(t: Transport, inp: torch.Tensor, out: torch.Tensor, blocks: Blocks, op: ReduceOp) -> None:
    r, p = t.rank, t.size
    fold = Fold.of(p)
    if fold.is_extra(r):
        t.send(inp, r - 1)
        t.recv(out, r - 1)
        return
    work = scratch.empty_like("reduce_scatter.recursive_halving.work", inp)
    work.copy_(inp)
    incoming_all = scratch.empty_like("reduce_scatter.recursive_halving.incoming", inp)
    if fold.has_extra(r):
        t.recv(incoming_all, r + 1)
        reduce_(work, incoming_all, op)
    v = fold.virtual(r)
    lo, dist = 0, fold.pof2 // 2  # this rank's virtual range is [lo, lo + 2 * dist)
    posted: list = []  # a step reduces into the half it keeps, never into one it sent: the sends complete at the end
    while dist >= 1:
        keep_lo, send_lo = (lo, lo + dist) if v < lo + dist else (lo + dist, lo)
        keep = blocks.span(work, fold.first_rank(keep_lo), fold.first_rank(keep_lo + dist))
        incoming = incoming_all[: keep.numel()]
        t.sendrecv_posted(blocks.span(work, fold.first_rank(send_lo), fold.first_rank(send_lo + dist)),
                          fold.first_rank(v ^ dist), incoming, fold.first_rank(v ^ dist), posted)
        reduce_(keep, incoming, op)
        lo, dist = keep_lo, dist // 2
    out.copy_(blocks.block(work, r))
    if fold.has_extra(r):
        t.send(blocks.block(work, r + 1), r + 1)
    t.complete_posted(posted)


@register("reduce_scatter", "pairwise",
          summary="p-1 steps; at step s send block r+s to rank r+s and receive own block from rank r-s",
          cost="(p-1) a + (p-1)/p n (b + g)", scratch=lambda p, n: (-(-n // p),))
def pairwise(t: Transport, inp: torch.Tensor, out: torch.Tensor, blocks: Blocks, op: ReduceOp) -> None:
    r, p = t.rank, t.size
    out.copy_(blocks.block(inp, r))
    incoming = scratch.empty_like("reduce_scatter.pairwise.incoming", out)
    posted: list = []  # the sends read the input, never written: they complete at the end
    for step in range(1, p):
        dest = (r + step) % p
        t.sendrecv_posted(blocks.block(inp, dest), dest, incoming, (r - step) % p, posted)
        reduce_(out, incoming, op)
    t.complete_posted(posted)
