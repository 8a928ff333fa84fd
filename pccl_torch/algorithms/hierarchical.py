"""Two-level compositions (DESIGN.md): the vendor library inside a node, an algorithm of the family
between nodes over the communicator of this rank's local-rank peers (so every node's NICs work at once).

P = N nodes x L ranks; global rank = node * L + local rank; n = elements per rank's block.
- reduce-scatter: pack [N, L, n] -> [L, N, n]; intra RS (block j: every node's chunk for local rank j);
  inter RS among local-rank peers. Only n*N per rank crosses nodes, already reduced inside the node.
- all-gather: inter AG among local-rank peers -> [N, n]; intra AG -> [L, N, n]; unpack to [N, L, n].
- all-reduce: intra RS to a 1/L shard; inter AR on the shard; intra AG.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pccl_torch.algorithms._layout import Blocks
from pccl_torch.ops import ReduceOp
from pccl_torch.transport.base import Transport
from pccl_torch.triton_kernels import permute_blocks


def all_gather(intra: Transport, inter: Transport, inter_all_gather: Callable[..., None],
               out: torch.Tensor, inp: torch.Tensor) -> None:
    nodes, local, n = inter.size, intra.size, inp.numel()
    from_nodes = torch.empty(nodes * n, dtype=inp.dtype, device=inp.device)
    inter_all_gather(inter, from_nodes, inp, Blocks.even(nodes, n))
    by_local_rank = torch.empty(local * nodes * n, dtype=inp.dtype, device=inp.device)
    intra.native_all_gather(by_local_rank, from_nodes)
    permute_blocks(by_local_rank, out, local, nodes, n)


def reduce_scatter(intra: Transport, inter: Transport, inter_reduce_scatter: Callable[..., None],
                   inp: torch.Tensor, out: torch.Tensor, op: ReduceOp) -> None:
    nodes, local, n = inter.size, intra.size, out.numel()
    packed = torch.empty_like(inp)
    permute_blocks(inp, packed, nodes, local, n)
    node_partial = torch.empty(nodes * n, dtype=inp.dtype, device=inp.device)
    intra.native_reduce_scatter(node_partial, packed, op)
    inter_reduce_scatter(inter, node_partial, out, Blocks.even(nodes, n), op)


def all_reduce(intra: Transport, inter: Transport, inter_all_reduce: Callable[..., None],
               buf: torch.Tensor, op: ReduceOp) -> None:
    local, n = intra.size, buf.numel()
    shard_len = -(-n // local)
    if shard_len * local == n:
        padded = buf
    else:  # the vendor reduce-scatter wants equal shards; the padding is discarded
        padded = torch.zeros(shard_len * local, dtype=buf.dtype, device=buf.device)
        padded[:n].copy_(buf)
    shard = torch.empty(shard_len, dtype=buf.dtype, device=buf.device)
    intra.native_reduce_scatter(shard, padded, op)
    inter_all_reduce(inter, shard, op)
    intra.native_all_gather(padded, shard)
    if padded is not buf:
        buf.copy_(padded[:n])
