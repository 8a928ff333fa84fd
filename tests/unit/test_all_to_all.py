"""The all-to-all schedules on in-process transports: flat (every registered schedule), two-level (N nodes x L
ranks, any inter-node schedule, equal and uneven blocks with zeros), and the compressed exchange; each against a
reference built block by block from what every rank sends."""

from __future__ import annotations

import functools

import pytest
import torch

from pccl_torch import compression
from pccl_torch.algorithms import Blocks, get, hierarchical
from pccl_torch.algorithms._layout import transpose_blocks
from pccl_torch.compression import schedules as compressed
from pccl_torch.plan import family
from pccl_torch.transport import ThreadedWorld
from tests.unit.test_hierarchical import GRIDS, run_grid

SCHEDULES = family("all_to_all") + ["native"]


def split_table(p: int, pattern: str, seed: int) -> list[list[int]]:
    """``table[i][j]``: elements rank ``i`` sends rank ``j``. ``even``: 3 each; ``uneven``: 0..4, zeros included,
    rows and columns of different sums; ``zeros``: everything 0 but one pair."""
    if pattern == "even":
        return [[3] * p for _ in range(p)]
    if pattern == "zeros":
        return [[int(i == 0 and j == p - 1) * 5 for j in range(p)] for i in range(p)]
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 5, (p, p), generator=g).tolist()


def inputs_for(table: list[list[int]], dtype: torch.dtype = torch.int64) -> list[torch.Tensor]:
    """Rank ``i``'s input: its blocks for every rank, each element naming (source, destination, index)."""
    p = len(table)
    return [torch.cat([torch.tensor([1000 * i + 10 * j + k for k in range(table[i][j])], dtype=torch.int64)
                       for j in range(p)]).to(dtype) for i in range(p)]


def expected_for(table: list[list[int]], inputs: list[torch.Tensor], me: int) -> torch.Tensor:
    """What rank ``me`` must receive: every rank's block for it, in source order (sliced from the inputs)."""
    out = []
    for i, row in enumerate(table):
        start = sum(row[:me])
        out.append(inputs[i][start:start + row[me]])
    return torch.cat(out)


def layouts(table: list[list[int]], me: int) -> tuple[Blocks, Blocks]:
    return Blocks.from_counts(table[me]), Blocks.from_counts([row[me] for row in table])


@pytest.mark.parametrize("p", [1, 2, 3, 5, 6])
@pytest.mark.parametrize("pattern", ["even", "uneven", "zeros"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_flat(p: int, pattern: str, schedule: str) -> None:
    table = split_table(p, pattern, seed=p)
    inputs = inputs_for(table)
    world = ThreadedWorld(p)

    def fn(t, me):
        send, recv = layouts(table, me)
        inp = inputs[me].clone()
        out = torch.full((recv.total,), -1, dtype=torch.int64)
        get("all_to_all", schedule).fn(t, out, inp, send, recv)
        assert torch.equal(inp, inputs[me]), "the input was modified"
        return out

    for me, out in enumerate(world.run(fn, [(r,) for r in range(p)])):
        assert torch.equal(out, expected_for(table, inputs, me))


@pytest.mark.parametrize("nodes,local", GRIDS)
@pytest.mark.parametrize("pattern", ["even", "uneven", "zeros"])
@pytest.mark.parametrize("inter", SCHEDULES)
def test_hierarchical(nodes: int, local: int, pattern: str, inter: str) -> None:
    p = nodes * local
    table = split_table(p, pattern, seed=7 * p)
    inputs = inputs_for(table)

    def fn(intra_t, inter_t, g):
        send, recv = layouts(table, g)
        out = torch.full((recv.total,), -1, dtype=torch.int64)
        hierarchical.all_to_all(intra_t, inter_t, get("all_to_all", inter).fn, out, inputs[g], send, recv,
                                even=pattern == "even")
        return out

    for g, out in enumerate(run_grid(nodes, local, fn)):
        assert torch.equal(out, expected_for(table, inputs, g))


@pytest.mark.parametrize("fmt", compression.NAMES)
@pytest.mark.parametrize("nodes,local", [(1, 3), (3, 1), (2, 2), (3, 2)])
@pytest.mark.parametrize("pattern", ["even", "uneven"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compressed(fmt: str, nodes: int, local: int, pattern: str, dtype: torch.dtype) -> None:
    """What crosses nodes goes through the format, each source block on its own (lossless: bit-exact); what stays
    inside a node is exact; two-level and flat plans move the same bytes."""
    p = nodes * local
    wire = compression.get(fmt)
    if not wire.applies_to(dtype):
        pytest.skip(f"{fmt} does not apply to {dtype}")
    table = split_table(p, pattern, seed=11 * p)
    g = torch.Generator().manual_seed(p)
    inputs = [(torch.randn(sum(row), generator=g) * 10 ** torch.randint(-2, 3, (1,), generator=g)).to(dtype)
              for row in table]
    flat_worlds = ThreadedWorld(p)

    def announce(t, sizes):
        told = torch.empty(t.size, dtype=torch.int64)
        t.native_all_to_all(told, torch.tensor(sizes), [1] * t.size, [1] * t.size)
        return told.tolist()

    def two_level(intra_t, inter_t, me):
        send, recv = layouts(table, me)
        out = torch.empty(recv.total, dtype=dtype)
        world_t = flat_worlds.transports[me]
        compressed.all_to_all(wire, lambda o, i, s, r: hierarchical.all_to_all(intra_t, inter_t,
                                                                                get("all_to_all", "pairwise").fn,
                                                                                o, i, s, r),
                              functools.partial(announce, world_t), out, inputs[me], send, recv, me, local)
        return out

    for me, out in enumerate(run_grid(nodes, local, two_level)):
        recv = layouts(table, me)[1]
        expected = expected_for(table, inputs, me)
        for source in range(p):
            block, exact = recv.block(out, source), recv.block(expected, source)
            if source // local == me // local or wire.lossless:
                assert torch.equal(block, exact), (fmt, source, me)
            else:
                assert torch.equal(block, wire.round_trip(exact)), (fmt, source, me)


@pytest.mark.parametrize("sizes", [[[2, 0, 1], [3, 1, 0]], [[2, 2], [2, 2], [2, 2]], [[0]], [[4]]])
def test_transpose_blocks(sizes: list[list[int]]) -> None:
    total = sum(map(sum, sizes))
    src = torch.arange(total)
    dst = torch.empty(total, dtype=torch.int64)
    transpose_blocks(src, dst, sizes)
    blocks, start = {}, 0
    for i, row in enumerate(sizes):
        for j, size in enumerate(row):
            blocks[i, j] = src[start:start + size]
            start += size
    expected = torch.cat([blocks[i, j] for j in range(len(sizes[0])) for i in range(len(sizes))])
    assert torch.equal(dst, expected)


FIXED_SIZE_CASES = [(name, dtype) for name in compression.NAMES if compression.get(name).fixed_size
                    for dtype in (torch.float32, torch.bfloat16) if compression.get(name).applies_to(dtype)]


@pytest.mark.parametrize("fmt,dtype", FIXED_SIZE_CASES, ids=[f"{f}-{str(d)[6:]}" for f, d in FIXED_SIZE_CASES])
@pytest.mark.parametrize("nodes,local", [(2, 2), (3, 2), (5, 1)])
@pytest.mark.parametrize("chunks", [1, 3, 4])
@pytest.mark.parametrize("pattern", ["even", "uneven"])
def test_compressed_chunked(fmt: str, dtype: torch.dtype, nodes: int, local: int, chunks: int, pattern: str) -> None:
    """The chunked exchange over a flat transport: bit for bit what the one-piece exchange gives (pieces cut on
    QBLOCK boundaries keep every scale), blocks of up to ~1,300 elements, zeros included, and empty pieces."""
    p = nodes * local
    wire = compression.get(fmt)
    table = [[row * 300 + 17 for row in r] for r in split_table(p, pattern, seed=5 * p)]
    if pattern == "uneven":
        table[0][p - 1] = 0
    g = torch.Generator().manual_seed(p + chunks)
    inputs = [(torch.randn(sum(row), generator=g) * 10 ** torch.randint(-2, 3, (sum(row),), generator=g)).to(dtype)
              for row in table]
    world = ThreadedWorld(p)

    def fn(t, me):
        send, recv = layouts(table, me)
        out = torch.full((recv.total,), float("nan"), dtype=dtype)
        inp = inputs[me].clone()
        compressed.chunked_all_to_all(wire, t, out, inp, send, recv, me, local, chunks)
        assert torch.equal(inp, inputs[me]), "the input was modified"
        return out

    for me, out in enumerate(world.run(fn, [(r,) for r in range(p)])):
        recv = layouts(table, me)[1]
        expected = expected_for(table, inputs, me)
        for source in range(p):
            block, exact = recv.block(out, source), recv.block(expected, source)
            want = exact if source // local == me // local else wire.round_trip(exact)
            assert torch.equal(block, want), (fmt, source, me)


def test_chunk_count() -> None:
    """Pieces of 256 KiB of a rank's buffer, at least one, at most MAX_CHUNKS, on slow links only (unmeasured: one)."""
    slow = compressed.SLOW_LINK_BYTES_PER_S
    assert [compressed.chunk_count(n, slow) for n in (0, 1, 256 << 10, (256 << 10) + 1, 1 << 20, 1 << 40)] == \
        [1, 1, 1, 2, 4, compressed.MAX_CHUNKS]
    assert compressed.chunk_count(1 << 20, 25e6) == 4
    assert compressed.chunk_count(1 << 20, 119e6) == 1 and compressed.chunk_count(1 << 20, None) == 1


@pytest.mark.parametrize("given", ["send", "recv"])
def test_start_all_to_all_takes_both_counts_or_neither(given: str) -> None:
    """One count list alone is refused before anything moves, naming what is missing."""
    from pccl_torch.transport.threaded import ThreadedTransport

    transport = ThreadedTransport(ThreadedWorld(2), 0)
    counts = {"send_counts": [1, 1]} if given == "send" else {"recv_counts": [1, 1]}
    missing = "recv_counts" if given == "send" else "send_counts"
    with pytest.raises(ValueError, match=f"got {given}_counts without {missing}; give both"):
        transport.start_all_to_all(torch.zeros(2), torch.ones(2), **counts)
