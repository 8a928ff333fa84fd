"""``native``: the transport's own collective (the MPI library's, or NCCL/gloo's for a torch group)."""

from __future__ import annotations

import torch

from pccl_torch import scratch
from pccl_torch.algorithms._layout import Blocks
from pccl_torch.algorithms.registry import register
from pccl_torch.ops import ReduceOp
from pccl_torch.transport.base import Transport

_COST = "the library's own choice"


def _require_even(blocks: Blocks, what: str) -> None:
    if blocks.counts and blocks.total != blocks.counts[0] * len(blocks.counts):
        raise ValueError(f"native {what} needs equal blocks, got counts {blocks.counts}")


@register("all_gather", "native", summary="the transport's own all-gather", cost=_COST,
          scratch=lambda p, n: (n // p,))  # the input's copy, taken in place only
def all_gather(t: Transport, out: torch.Tensor, inp: torch.Tensor, blocks: Blocks) -> None:
    _require_even(blocks, "all-gather")
    if inp.numel() and inp.data_ptr() == out.data_ptr() + blocks.offsets[t.rank] * out.element_size():
        inp = scratch.empty_like("native.all_gather.input", inp).copy_(inp)  # the library wants distinct buffers
    t.native_all_gather(out, inp)


@register("reduce_scatter", "native", summary="the transport's own reduce-scatter", cost=_COST)
def reduce_scatter(t: Transport, inp: torch.Tensor, out: torch.Tensor, blocks: Blocks, op: ReduceOp) -> None:
    _require_even(blocks, "reduce-scatter")
    t.native_reduce_scatter(out, inp, op)


@register("all_reduce", "native", summary="the transport's own all-reduce", cost=_COST)
def all_reduce(t: Transport, buf: torch.Tensor, op: ReduceOp) -> None:
    t.native_all_reduce(buf, op)


@register("all_to_all", "native", summary="the transport's own all-to-all (MPI's Alltoallv, gloo's or NCCL's)",
          cost=_COST)
def all_to_all(t: Transport, out: torch.Tensor, inp: torch.Tensor, send: Blocks, recv: Blocks) -> None:
    t.native_all_to_all(out, inp, send.counts, recv.counts)
