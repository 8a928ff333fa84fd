"""Two-level compositions (DESIGN.md): the vendor library inside a node, an algorithm of the family
between nodes over the communicator of this rank's local-rank peers (so every node's NICs work at once).

P = N nodes x L ranks; global rank = node * L + local rank; n = elements per rank's block.
- reduce-scatter: pack [N, L, n] -> [L, N, n]; intra RS (block j: every node's chunk for local rank j);
  inter RS among local-rank peers. Only n*N per rank crosses nodes, already reduced inside the node.
- all-gather: inter AG among local-rank peers -> [N, n]; intra AG -> [L, N, n]; unpack to [N, L, n].
- all-reduce: intra RS to a 1/L shard; inter AR on the shard; intra AG.
- all-to-all (Tutel's 2D all-to-all, for any block sizes): inside the node, local rank l sends local rank k
  every block destined to local rank k of any node; between nodes, local rank k sends each peer node one
  message, what its node holds for that node's local rank k, and receives straight into the output (the
  blocks arrive in source-rank order). Each rank sends N-1 messages across the network instead of P-1. With
  uneven blocks the node's ranks first all-gather their send counts (P integers each, inside the node).

While a torch profiler records, each phase is a range nested in the call's (``pccl_torch.profiling.phase``):
``pccl:pack``, ``pccl:intra:<collective>``, ``pccl:inter:<collective>``, ``pccl:unpack``.

Every temporary comes from ``scratch`` and is counted by :func:`scratch_bytes` (what a CUDA call's worker finds
reserved at issue, ``pccl_torch.workspace``), but an uneven all-to-all's regrouped blocks, whose sizes the node's
count exchange gives.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pccl_torch import scratch, workspace
from pccl_torch.algorithms._layout import Blocks, transpose_blocks
from pccl_torch.algorithms.registry import Collective, Scratch
from pccl_torch.ops import ReduceOp
from pccl_torch.profiling import phase
from pccl_torch.transport.base import Transport
from pccl_torch.triton_kernels import permute_blocks


def all_gather(intra: Transport, inter: Transport, inter_all_gather: Callable[..., None],
               out: torch.Tensor, inp: torch.Tensor) -> None:
    nodes, local, n = inter.size, intra.size, inp.numel()
    from_nodes = scratch.empty("hierarchical.all_gather.from_nodes", nodes * n, inp.dtype, inp.device)
    with phase("pccl:inter:all_gather", from_nodes, inter):
        inter_all_gather(inter, from_nodes, inp, Blocks.even(nodes, n))
    by_local_rank = scratch.empty("hierarchical.all_gather.by_local_rank", local * nodes * n, inp.dtype, inp.device)
    with phase("pccl:intra:all_gather", by_local_rank, intra):
        intra.native_all_gather(by_local_rank, from_nodes)
    with phase("pccl:unpack", out):
        permute_blocks(by_local_rank, out, local, nodes, n)


def reduce_scatter(intra: Transport, inter: Transport, inter_reduce_scatter: Callable[..., None],
                   inp: torch.Tensor, out: torch.Tensor, op: ReduceOp) -> None:
    nodes, local, n = inter.size, intra.size, out.numel()
    packed = scratch.empty_like("hierarchical.reduce_scatter.packed", inp)
    with phase("pccl:pack", inp):
        permute_blocks(inp, packed, nodes, local, n)
    node_partial = scratch.empty("hierarchical.reduce_scatter.node_partial", nodes * n, inp.dtype, inp.device)
    with phase("pccl:intra:reduce_scatter", packed, intra):
        intra.native_reduce_scatter(node_partial, packed, op)
    with phase("pccl:inter:reduce_scatter", node_partial, inter):
        inter_reduce_scatter(inter, node_partial, out, Blocks.even(nodes, n), op)


def all_reduce(intra: Transport, inter: Transport, inter_all_reduce: Callable[..., None],
               buf: torch.Tensor, op: ReduceOp) -> None:
    local, n = intra.size, buf.numel()
    shard_len = -(-n // local)
    if shard_len * local == n:
        padded = buf
    else:  # the vendor reduce-scatter wants equal shards; the padding is discarded
        padded = scratch.empty("hierarchical.all_reduce.padded", shard_len * local, buf.dtype, buf.device)
        with phase("pccl:pack", padded):
            padded[:n].copy_(buf)
            padded[n:].zero_()
    shard = scratch.empty("hierarchical.all_reduce.shard", shard_len, buf.dtype, buf.device)
    with phase("pccl:intra:reduce_scatter", padded, intra):
        intra.native_reduce_scatter(shard, padded, op)
    with phase("pccl:inter:all_reduce", shard, inter):
        inter_all_reduce(inter, shard, op)
    with phase("pccl:intra:all_gather", padded, intra):
        intra.native_all_gather(padded, shard)
    if padded is not buf:
        with phase("pccl:unpack", buf):
            buf.copy_(padded[:n])


def all_to_all(intra: Transport, inter: Transport, inter_all_to_all: Callable[..., None], out: torch.Tensor,
               inp: torch.Tensor, send: Blocks, recv: Blocks, *, even: bool = False) -> None:
    """``even``: every rank of the call sends equal blocks (the node's send counts need no exchange)."""
    nodes, local, k = inter.size, intra.size, intra.rank
    if local == 1:
        with phase("pccl:inter:all_to_all", inp, inter):
            inter_all_to_all(inter, out, inp, send, recv)
        return
    counts = _node_send_counts(intra, send, even, inp.device)  # [l][m * local + j]: local rank l's for (m, j)
    mine = [[send.counts[m * local + j] for j in range(local)] for m in range(nodes)]
    packed = scratch.empty_like("hierarchical.all_to_all.packed", inp)
    with phase("pccl:pack", inp):
        transpose_blocks(inp, packed, mine)  # (node, local rank) -> (local rank, node)
    held = [[counts[l][m * local + k] for m in range(nodes)] for l in range(local)]  # from local rank l, for node m
    gathered = _regrouped("hierarchical.all_to_all.gathered", sum(map(sum, held)), inp.dtype, inp.device, even)
    with phase("pccl:intra:all_to_all", packed, intra):
        intra.native_all_to_all(gathered, packed, [sum(mine[m][j] for m in range(nodes)) for j in range(local)],
                                [sum(row) for row in held])
    outgoing = _regrouped("hierarchical.all_to_all.outgoing", gathered.numel(), inp.dtype, inp.device, even)
    with phase("pccl:pack", gathered):
        transpose_blocks(gathered, outgoing, held)  # (local rank, node) -> (node, local rank)
    to_nodes = Blocks.from_counts([sum(held[l][m] for l in range(local)) for m in range(nodes)])
    from_nodes = Blocks.from_counts([sum(recv.counts[m * local:(m + 1) * local]) for m in range(nodes)])
    with phase("pccl:inter:all_to_all", outgoing, inter):
        inter_all_to_all(inter, out, outgoing, to_nodes, from_nodes)


def scratch_bytes(collective: Collective, nodes: int, local: int, numel: int, itemsize: int, inter: Scratch, *,
                  even: bool = True) -> tuple[int, ...]:
    """Bytes of each temporary a two-level ``collective`` takes on N = ``nodes`` x L = ``local`` ranks, with
    ``inter`` the inter-node schedule's scratch; ``numel``: elements of the full buffer (all-to-all: the input).
    An uneven all-to-all (``even`` False) counts its send-count tables, not its regrouped blocks (unknown here)."""
    p = nodes * local
    if collective == "all_gather":
        n = numel // p
        elements = (nodes * n, numel) + inter(nodes, nodes * n)
    elif collective == "reduce_scatter":
        n = numel // p
        elements = (numel, nodes * n) + inter(nodes, nodes * n)
    elif collective == "all_reduce":
        shard = -(-numel // local)
        elements = ((shard * local,) if shard * local != numel else ()) + (shard,) + inter(nodes, shard)
    else:
        elements = () if local == 1 else (numel, numel, numel) if even else (numel,)
    counts = (p * 8, local * p * 8) if collective == "all_to_all" and local > 1 and not even else ()
    return tuple(e * itemsize for e in elements) + counts


def _regrouped(role: str, numel: int, dtype: torch.dtype, device: torch.device, even: bool) -> torch.Tensor:
    """An all-to-all's regrouped blocks: scratch, but where uneven on a worker's device, outside its workspace
    (their size comes from the node's count exchange, on the worker: ``workspace.unreserved``)."""
    if even or not workspace.serves(device):
        return scratch.empty(role, numel, dtype, device)
    return workspace.unreserved(numel, dtype, device)


def _node_send_counts(intra: Transport, send: Blocks, even: bool, device: torch.device) -> list[list[int]]:
    """Every node-mate's send counts (``[local rank][destination rank]``): this rank's repeated when ``even``,
    else all-gathered inside the node (on the level's control device; from pageable memory to a device, a copy
    the host waits for, as ``torch.tensor(..., device=...)``)."""
    if even:
        return [list(send.counts)] * intra.size
    control = intra.control_device(device)
    mine = scratch.empty("hierarchical.all_to_all.counts", len(send.counts), torch.int64, control)
    mine.copy_(torch.tensor(send.counts, dtype=torch.int64))
    table = scratch.empty("hierarchical.all_to_all.count_table", intra.size * mine.numel(), torch.int64, control)
    with phase("pccl:intra:counts", table, intra):
        intra.native_all_gather(table, mine)
    return table.view(intra.size, -1).tolist()
