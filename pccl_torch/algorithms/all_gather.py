"""All-gather schedules: ring, recursive doubling (any p, by folding) and Bruck (any p)."""

from __future__ import annotations

import torch

from pccl_torch import scratch
from pccl_torch.algorithms._layout import Blocks, Fold
from pccl_torch.algorithms.registry import register
from pccl_torch.transport.base import Transport
from pccl_torch.triton_kernels import rotate_


def _place_own(out: torch.Tensor, inp: torch.Tensor, blocks: Blocks, rank: int) -> None:
    own = blocks.block(out, rank)
    if own.numel() and own.data_ptr() != inp.data_ptr():
        own.copy_(inp)


@register("all_gather", "ring", summary="p-1 steps, each passing one block to the right neighbour",
          cost="(p-1) a + (p-1)/p n b")
def ring(t: Transport, out: torch.Tensor, inp: torch.Tensor, blocks: Blocks) -> None:
    r, p = t.rank, t.size
    _place_own(out, inp, blocks, r)
    posted: list = []  # every block is written once, before it is sent: the sends complete at the end
    for step in range(p - 1):
        t.sendrecv_posted(blocks.block(out, (r - step) % p), (r + 1) % p,
                          blocks.block(out, (r - step - 1) % p), (r - 1) % p, posted)
    t.complete_posted(posted)


@register("all_gather", "recursive_doubling",
          summary="lg p steps exchanging doubling ranges with rank^2^k; non-powers of two fold in 2 extra steps",
          cost="lg p a + (p-1)/p n b (+2 steps if p is not a power of two)")
def recursive_doubling(t: Transport, out: torch.Tensor, inp: torch.Tensor, blocks: Blocks) -> None:
    r, p = t.rank, t.size
    _place_own(out, inp, blocks, r)
    fold = Fold.of(p)
    if fold.is_extra(r):
        t.send(blocks.block(out, r), r - 1)
        t.recv(out, r - 1)
        return
    if fold.has_extra(r):
        t.recv(blocks.block(out, r + 1), r + 1)
    v = fold.virtual(r)
    dist = 1
    posted: list = []  # a step receives into blocks no send reads: the sends complete at the end
    while dist < fold.pof2:
        mine, theirs = v // dist * dist, (v ^ dist) // dist * dist  # first virtual rank of each range
        peer = fold.first_rank(v ^ dist)
        t.sendrecv_posted(blocks.span(out, fold.first_rank(mine), fold.first_rank(mine + dist)), peer,
                          blocks.span(out, fold.first_rank(theirs), fold.first_rank(theirs + dist)), peer, posted)
        dist *= 2
    if fold.has_extra(r):
        t.send(out, r + 1)
    t.complete_posted(posted)


@register("all_gather", "bruck",
          summary="ceil(lg p) steps on a rotated buffer, for any p; one rotation at the end",
          cost="ceil(lg p) a + (p-1)/p n b", scratch=lambda p, n: (n,) if p > 1 else ())
def bruck(t: Transport, out: torch.Tensor, inp: torch.Tensor, blocks: Blocks) -> None:
    r, p = t.rank, t.size
    if p == 1:
        _place_own(out, inp, blocks, r)
        return
    # Rotated layout: block i of `work` is the block of rank (r + i) % p.
    layout = blocks.rotated(r)
    work = scratch.empty_like("all_gather.bruck.work", out)
    layout.block(work, 0).copy_(inp)
    dist = 1
    posted: list = []  # a step receives past everything sent so far: the sends complete at the end
    while dist < p:
        count = min(dist, p - dist)
        t.sendrecv_posted(layout.span(work, 0, count), (r - dist) % p,
                          layout.span(work, dist, dist + count), (r + dist) % p, posted)
        dist *= 2
    rotate_(work, out, blocks.offsets[r])  # work starts with block r: shift it to offset of block r
    t.complete_posted(posted)
