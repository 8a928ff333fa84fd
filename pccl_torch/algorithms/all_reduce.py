"""All-reduce schedules: ring and Rabenseifner (a reduce-scatter then an all-gather of balanced
shards) and recursive doubling (any p, by folding). All leave bitwise identical results on every rank:
each shard is reduced on one rank then copied, or each pair combines with a commutative op.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pccl_torch import scratch
from pccl_torch.algorithms import all_gather, reduce_scatter
from pccl_torch.algorithms._layout import Blocks, Fold
from pccl_torch.algorithms.registry import Scratch, get, register
from pccl_torch.ops import ReduceOp
from pccl_torch.transport.base import Transport
from pccl_torch.triton_kernels import reduce_


def _reduce_scatter_then_all_gather(
    rs: Callable[..., None], ag: Callable[..., None]
) -> Callable[[Transport, torch.Tensor, ReduceOp], None]:
    def run(t: Transport, buf: torch.Tensor, op: ReduceOp) -> None:
        blocks = Blocks.balanced(buf.numel(), t.size)
        shard = scratch.empty("all_reduce.two_phase.shard", blocks.counts[t.rank], buf.dtype, buf.device)
        rs(t, buf, shard, blocks, op)
        ag(t, buf, shard, blocks)

    return run


def _two_phase_scratch(rs: str) -> Scratch:
    """The shard, then what the reduce-scatter ``rs`` takes over the whole buffer (the all-gathers take none)."""
    return lambda p, n: (-(-n // p),) + get("reduce_scatter", rs).scratch(p, n)


register("all_reduce", "ring", summary="ring reduce-scatter then ring all-gather (bandwidth-optimal)",
         cost="2(p-1) a + 2(p-1)/p n b + (p-1)/p n g", scratch=_two_phase_scratch("ring"))(
    _reduce_scatter_then_all_gather(reduce_scatter.ring, all_gather.ring))

register("all_reduce", "rabenseifner",
         summary="recursive-halving reduce-scatter then recursive-doubling all-gather",
         cost="2 lg p a + 2(p-1)/p n b + (p-1)/p n g", scratch=_two_phase_scratch("recursive_halving"))(
    _reduce_scatter_then_all_gather(reduce_scatter.recursive_halving, all_gather.recursive_doubling))


@register("all_reduce", "recursive_doubling",
          summary="lg p steps exchanging the whole buffer with rank^2^k (latency-optimal); any p by folding",
          cost="lg p (a + n b + n g) (+2 steps if p is not a power of two)", scratch=lambda p, n: (n,))
def recursive_doubling(t: Transport, buf: torch.Tensor, op: ReduceOp) -> None:
    r, p = t.rank, t.size
    fold = Fold.of(p)
    if fold.is_extra(r):
        t.send(buf, r - 1)
        t.recv(buf, r - 1)
        return
    incoming = scratch.empty_like("all_reduce.recursive_doubling.incoming", buf)
    if fold.has_extra(r):
        t.recv(incoming, r + 1)
        reduce_(buf, incoming, op)
    v = fold.virtual(r)
    dist = 1
    while dist < fold.pof2:
        peer = fold.first_rank(v ^ dist)
        t.sendrecv(buf, peer, incoming, peer)
        reduce_(buf, incoming, op)
        dist *= 2
    if fold.has_extra(r):
        t.send(buf, r + 1)
