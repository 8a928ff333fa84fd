"""All-to-all schedules: pairwise exchange, for any p and any block sizes (zero included)."""

from __future__ import annotations

import torch

from pccl_torch.algorithms._layout import Blocks
from pccl_torch.algorithms.registry import register
from pccl_torch.transport.base import Transport


def exchange(t: Transport, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int) -> None:
    """Send ``send`` to ``dest`` while receiving ``recv`` from ``source``; an empty side is skipped (its peer
    skips it too: a rank's count for a peer is the peer's count for it)."""
    if send.numel() and recv.numel():
        t.sendrecv(send, dest, recv, source)
    elif send.numel():
        t.send(send, dest)
    elif recv.numel():
        t.recv(recv, source)


def place_own(t: Transport, out: torch.Tensor, inp: torch.Tensor, send: Blocks, recv: Blocks) -> None:
    """This rank's block to itself, copied (nothing crosses a link)."""
    mine = recv.block(out, t.rank)
    if mine.numel():
        mine.copy_(send.block(inp, t.rank))


@register("all_to_all", "pairwise",
          summary="p-1 steps, step k sending to rank+k while receiving from rank-k (MPICH's large-message rule)",
          cost="(p-1) a + (p-1)/p n b")
def pairwise(t: Transport, out: torch.Tensor, inp: torch.Tensor, send: Blocks, recv: Blocks) -> None:
    r, p = t.rank, t.size
    place_own(t, out, inp, send, recv)
    for step in range(1, p):
        dest, source = (r + step) % p, (r - step) % p
        exchange(t, send.block(inp, dest), dest, recv.block(out, source), source)
