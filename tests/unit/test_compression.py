"""Compressed wire formats and the collectives that carry them, on the in-process transport (p = 1..6)
against references built from the formats themselves: what every rank must hold, bit for bit."""

from __future__ import annotations

import functools

import pytest
import torch

from pccl_torch.algorithms import COLLECTIVES
from pccl_torch.algorithms import Blocks
from pccl_torch.compression import FORMATS, get
from pccl_torch.compression import pipelined as compressed_pipelined
from pccl_torch.compression import schedules
from pccl_torch.compression.config import env_formats, for_call
from pccl_torch.ops import ReduceOp
from pccl_torch.transport import ThreadedWorld

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
RANKS = [1, 2, 3, 4, 5, 6]
OPS = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]


def values(n: int, dtype: torch.dtype, seed: int, special: bool = False) -> torch.Tensor:
    x = (torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 2).to(dtype)
    if special and n >= 7:
        info = torch.finfo(dtype)
        x[:7] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, info.tiny / 2, info.max, 0.0])
    return x


def formats_for(dtype: torch.dtype) -> list[str]:
    return [name for name, fmt in FORMATS.items() if fmt.applies_to(dtype)]


# --- formats -----------------------------------------------------------------------------------------------

LOSSLESS_SIZES = [0, 1, 2, 7, 255, 4097, (1 << 20) + 3]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", LOSSLESS_SIZES)
def test_lossless_round_trip_is_bit_exact(dtype: torch.dtype, n: int) -> None:
    fmt = get("lossless")
    for x in (values(n, dtype, n, special=True), torch.zeros(n, dtype=dtype), torch.full((n,), -0.0, dtype=dtype)):
        before = x.clone()
        wire = fmt.encode(x)
        assert wire.dtype == torch.uint8 and wire.numel() % 8 == 0
        out = torch.full_like(x, 3.0)
        fmt.decode(wire, out)
        assert torch.equal(out.view(torch.uint8), before.view(torch.uint8))
        assert torch.equal(x.view(torch.uint8), before.view(torch.uint8)), "input modified"


def test_lossless_random_bytes_round_trip_and_compresses_structured_values() -> None:
    fmt = get("lossless")
    noise = torch.randint(0, 256, (4 * 50_001,), dtype=torch.uint8).view(torch.float32)  # every bit pattern
    out = torch.empty_like(noise)
    fmt.decode(fmt.encode(noise), out)
    assert torch.equal(out.view(torch.uint8), noise.view(torch.uint8))
    weights = values(1 << 16, torch.float32, 1) * 0.02  # exponents of weights cluster
    assert fmt.encode(weights).numel() < 0.9 * weights.numel() * 4


def test_lossless_rejects_truncated_wire() -> None:
    fmt = get("lossless")
    x = values(4096, torch.float32, 2) * 0.01
    wire = fmt.encode(x)
    broken = wire.clone()
    size = int(broken[:8].view(torch.int64)[0])
    assert size > 0
    broken[16:16 + size] = 0
    with pytest.raises(Exception):
        fmt.decode(broken, torch.empty_like(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_bf16_is_round_to_nearest_even(dtype: torch.dtype) -> None:
    x = values(1000, dtype, 3, special=True)
    got = get("bf16").round_trip(x)
    expected = x.to(torch.bfloat16).to(dtype)
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got[~got.isnan()], expected[~expected.isnan()])


@pytest.mark.parametrize("name", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_block_quantized_error_is_bounded(name: str, dtype: torch.dtype) -> None:
    x = values(3000, dtype, 4)
    got = get(name).round_trip(x).double()
    blocks = x.double().view(-1)[: 3000 - 3000 % 256].view(-1, 256).abs().amax(1)
    amax = torch.cat([blocks, x.double()[-(3000 % 256):].abs().amax()[None]]).repeat_interleave(256)[:3000]
    step = amax / 254 if name == "int8" else x.double().abs() / 16 + amax / 448 * 2 ** -9
    assert ((got - x.double()).abs() <= step * 1.001 + x.double().abs() * torch.finfo(dtype).eps).all()


def test_formats_name_what_they_do_not_apply_to() -> None:
    with pytest.raises(TypeError, match=r"'bf16' does not apply to torch.bfloat16.*torch.float32"):
        get("bf16").check_dtype(torch.bfloat16)
    with pytest.raises(TypeError, match="'int8' does not apply to torch.int64"):
        get("int8").check_dtype(torch.int64)
    with pytest.raises(ValueError, match="unknown compression 'zip'.*bf16, int8, fp8, lossless"):
        get("zip")


# --- configuration -----------------------------------------------------------------------------------------


def test_env_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PCCL_COMPRESSION", "all_gather:int8, reduce_scatter:bf16")
    assert env_formats() == {"all_gather": "int8", "reduce_scatter": "bf16"}
    monkeypatch.setenv("PCCL_COMPRESSION", "bf16")
    assert env_formats() == dict.fromkeys(COLLECTIVES, "bf16")
    monkeypatch.setenv("PCCL_COMPRESSION", "none")
    assert env_formats() == {}
    monkeypatch.setenv("PCCL_COMPRESSION", "all_gather:zip")
    with pytest.raises(ValueError, match="unknown compression 'zip'"):
        env_formats()
    monkeypatch.setenv("PCCL_COMPRESSION", "allgather:int8")
    with pytest.raises(ValueError, match="must look like 'all_gather:int8'"):
        env_formats()


def test_explicit_format_must_apply_but_the_environment_falls_back_to_exact() -> None:
    env = {"all_reduce": "bf16"}
    assert for_call("all_reduce", None, env, torch.float32) == "bf16"
    assert for_call("all_reduce", None, env, torch.bfloat16) is None  # documented: exact
    assert for_call("all_reduce", None, env, torch.int64) is None
    assert for_call("all_gather", None, env, torch.float32) is None
    assert for_call("all_gather", "int8", env, torch.float16) == "int8"
    with pytest.raises(TypeError, match="does not apply"):
        for_call("all_reduce", "bf16", env, torch.bfloat16)


# --- schedules ---------------------------------------------------------------------------------------------

CASES = [(name, dtype) for dtype in FLOATS for name in formats_for(dtype)]


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("name,dtype", CASES, ids=str)
def test_compressed_all_gather_gives_every_rank_the_same_decoded_blocks(p: int, name: str, dtype: torch.dtype) -> None:
    fmt, world = get(name), ThreadedWorld(p)
    for n in (0, 1, 300, 1031):
        inputs = [values(n, dtype, 10 * p + r + n) for r in range(p)]
        expected = torch.cat([fmt.round_trip(x) for x in inputs])

        def rank_fn(t, n=n, inputs=inputs):
            out = torch.full((p * n,), 7.0, dtype=dtype)
            mine = inputs[t.rank].clone()
            schedules.all_gather(fmt, t, out, mine, Blocks.even(p, n))
            assert torch.equal(mine, inputs[t.rank])
            return out

        for out in world.run(rank_fn):
            assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8))


def reference_reduce_scatter(fmt, inputs: list[torch.Tensor], rank: int, n: int, op: ReduceOp) -> torch.Tensor:
    """Rank order, float32 (float64) accumulator, own block exact, the others decoded."""
    acc_dtype = torch.float64 if inputs[0].dtype == torch.float64 else torch.float32
    fn = {ReduceOp.SUM: torch.add, ReduceOp.PRODUCT: torch.mul, ReduceOp.MIN: torch.minimum, ReduceOp.MAX: torch.maximum}[op]
    acc = None
    for i, x in enumerate(inputs):
        block = x[rank * n:(rank + 1) * n]
        if i == rank:
            part = block.to(acc_dtype)
        else:  # decoded straight into the accumulator's dtype
            part = torch.empty(n, dtype=acc_dtype)
            fmt.decode(fmt.encode(block), part)
        acc = part if acc is None else fn(acc, part)
    return acc.to(inputs[0].dtype)


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("name,dtype", CASES, ids=str)
def test_compressed_reduce_scatter_matches_the_ordered_reference(p: int, name: str, dtype: torch.dtype) -> None:
    fmt, world = get(name), ThreadedWorld(p)
    for n, op in ((0, ReduceOp.SUM), (1, ReduceOp.MAX), (517, ReduceOp.SUM), (300, OPS[p % 4])):
        inputs = [values(p * n, dtype, 7 * p + r + n) for r in range(p)]

        def rank_fn(t, n=n, op=op, inputs=inputs):
            out = torch.full((n,), 7.0, dtype=dtype)
            mine = inputs[t.rank].clone()
            schedules.reduce_scatter(fmt, t, mine, out, Blocks.even(p, n), op)
            assert torch.equal(mine, inputs[t.rank])
            return out

        for rank, out in enumerate(world.run(rank_fn)):
            assert torch.equal(out, reference_reduce_scatter(fmt, inputs, rank, n, op)), (rank, n, op)


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("name,dtype", CASES, ids=str)
def test_compressed_all_reduce_is_bitwise_identical_and_close(p: int, name: str, dtype: torch.dtype) -> None:
    fmt, world = get(name), ThreadedWorld(p)
    for n in (0, 1, 5, 1000, 2053):
        inputs = [values(n, dtype, 3 * p + r + n) for r in range(p)]

        def rank_fn(t, inputs=inputs):
            buf = inputs[t.rank].clone()
            schedules.all_reduce(fmt, t, buf, ReduceOp.SUM)
            return buf

        results = world.run(rank_fn)
        for out in results[1:]:
            assert torch.equal(out.view(torch.uint8), results[0].view(torch.uint8))
        if n:
            exact = torch.stack([x.double() for x in inputs]).sum(0)
            scale = torch.stack([x.double().abs() for x in inputs]).sum(0).max()
            tolerance = {"lossless": 1e-6, "bf16": 2 ** -7, "int8": 2 / 127, "fp8": 2 ** -3}[name]
            tolerance = max(tolerance, 4 * torch.finfo(dtype).eps)
            assert (results[0].double() - exact).abs().max() <= tolerance * scale * 1.01


def test_lossless_all_reduce_equals_the_ordered_float32_sum() -> None:
    p, n = 3, 999
    fmt, world = get("lossless"), ThreadedWorld(p)
    inputs = [values(n, torch.float32, r) for r in range(p)]
    results = world.run(lambda t: _all_reduced(fmt, t, inputs[t.rank].clone()))
    assert torch.equal(results[0], (inputs[0] + inputs[1]) + inputs[2])


def _all_reduced(fmt, t, buf: torch.Tensor) -> torch.Tensor:
    schedules.all_reduce(fmt, t, buf, ReduceOp.SUM)
    return buf


# --- two-level forms (encoded bytes forwarded inside the node) --------------------------------------------

GRIDS = [(1, 1), (1, 3), (3, 1), (2, 2), (3, 2), (2, 3)]


@pytest.mark.parametrize("nodes,local", GRIDS)
@pytest.mark.parametrize("name", ["bf16", "int8", "fp8"])
def test_hierarchical_compressed_all_gather_decodes_every_block_in_global_order(nodes: int, local: int, name: str) -> None:
    from tests.unit.test_hierarchical import run_grid

    p, fmt = nodes * local, get(name)
    for n in (0, 1, 300):
        inputs = [values(n, torch.float32, 5 * p + g + n) for g in range(p)]
        expected = torch.cat([fmt.round_trip(x) for x in inputs])

        def fn(intra_t, inter_t, g, n=n, inputs=inputs):
            out = torch.full((p * n,), 7.0)
            schedules.hierarchical_all_gather(fmt, intra_t, inter_t, out, inputs[g].clone())
            return out

        for out in run_grid(nodes, local, fn):
            assert torch.equal(out, expected)


@pytest.mark.parametrize("nodes,local", GRIDS)
@pytest.mark.parametrize("name", ["bf16", "int8", "fp8"])
def test_hierarchical_compressed_all_reduce_is_identical_everywhere_and_close(nodes: int, local: int,
                                                                              name: str) -> None:
    from tests.unit.test_hierarchical import run_grid

    p, fmt = nodes * local, get(name)
    tolerance = {"bf16": 2 ** -7, "int8": 2 / 127, "fp8": 2 ** -3}[name]
    for n in (1, 5, 1000, 2053):
        inputs = [values(n, torch.float32, 3 * p + g + n) for g in range(p)]

        def fn(intra_t, inter_t, g, inputs=inputs):
            buf = inputs[g].clone()
            schedules.hierarchical_all_reduce(fmt, intra_t, inter_t, buf, ReduceOp.SUM)
            return buf

        results = run_grid(nodes, local, fn)
        for out in results[1:]:
            assert torch.equal(out, results[0])
        exact = torch.stack([x.double() for x in inputs]).sum(0)
        scale = torch.stack([x.double().abs() for x in inputs]).sum(0).max()
        assert (results[0].double() - exact).abs().max() <= tolerance * scale


# --- pipelined two-level forms (compression.pipelined) -------------------------------------------------

PIPELINE_CHUNKS = [1, 2, 5]


@pytest.mark.parametrize("nodes,local", GRIDS)
@pytest.mark.parametrize("name", ["bf16", "int8", "fp8"])
def test_pipelined_compressed_all_gather_equals_the_round_trip_of_every_block(nodes: int, local: int,
                                                                              name: str) -> None:
    from tests.unit.test_hierarchical import run_grid

    p, fmt = nodes * local, get(name)
    for n, chunks in ((0, 2), (1, 3), (300, 2), (1031, 5), (600, 1)):  # chunks start at multiples of 256
        inputs = [values(n, torch.float32, 11 * p + g + n, special=True) for g in range(p)]
        expected = torch.cat([fmt.round_trip(x) for x in inputs])

        def fn(intra_t, inter_t, g, n=n, chunks=chunks, inputs=inputs):
            out = torch.full((p * n,), 7.0)
            mine = inputs[g].clone()
            compressed_pipelined.all_gather(fmt, intra_t, inter_t, out, mine, chunks)
            assert torch.equal(mine.view(torch.uint8), inputs[g].view(torch.uint8))
            return out

        for out in run_grid(nodes, local, fn):
            assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8)), (n, chunks)


@pytest.mark.parametrize("nodes,local", GRIDS)
@pytest.mark.parametrize("name,dtype", [("bf16", torch.float32), ("int8", torch.float32), ("fp8", torch.float64),
                                        ("int8", torch.float64)], ids=str)
def test_pipelined_compressed_reduce_scatter_equals_the_unpipelined_one(nodes: int, local: int, name: str,
                                                                        dtype: torch.dtype) -> None:
    """Bit for bit the same as the exact intra-node reduce-scatter followed by the compressed one between nodes."""
    from pccl_torch.algorithms import hierarchical
    from tests.unit.test_hierarchical import run_grid

    p, fmt = nodes * local, get(name)
    for n, op in ((1, ReduceOp.MAX), (300, ReduceOp.SUM), (777, OPS[p % 4])):
        inputs = [values(p * n, dtype, 13 * p + g + n) for g in range(p)]

        def unpipelined(intra_t, inter_t, g, n=n, op=op, inputs=inputs):
            out = torch.empty(n, dtype=dtype)
            between = functools.partial(schedules.reduce_scatter, fmt)
            hierarchical.reduce_scatter(intra_t, inter_t, between, inputs[g].clone(), out, op)
            return out

        expected = run_grid(nodes, local, unpipelined)
        for chunks in PIPELINE_CHUNKS:
            def fn(intra_t, inter_t, g, n=n, op=op, inputs=inputs, chunks=chunks):
                out = torch.full((n,), 7.0, dtype=dtype)
                mine = inputs[g].clone()
                compressed_pipelined.reduce_scatter(fmt, intra_t, inter_t, mine, out, op, chunks)
                assert torch.equal(mine, inputs[g])
                return out

            for g, out in enumerate(run_grid(nodes, local, fn)):
                assert torch.equal(out, expected[g]), (g, n, op, chunks)


@pytest.mark.parametrize("nodes,local", GRIDS)
@pytest.mark.parametrize("name,dtype", [("bf16", torch.float32), ("int8", torch.float32), ("fp8", torch.float32),
                                        ("int8", torch.bfloat16)], ids=str)
def test_pipelined_compressed_all_reduce_is_identical_everywhere_and_close(nodes: int, local: int, name: str,
                                                                           dtype: torch.dtype) -> None:
    from tests.unit.test_hierarchical import run_grid

    p, fmt = nodes * local, get(name)
    tolerance = {"bf16": 2 ** -7, "int8": 2 / 127, "fp8": 2 ** -3}[name]
    tolerance = max(tolerance, 4 * torch.finfo(dtype).eps)
    for n, chunks in ((0, 2), (1, 1), (5, 3), (1000, 2), (2053, 5)):
        inputs = [values(n, dtype, 17 * p + g + n) for g in range(p)]

        def fn(intra_t, inter_t, g, inputs=inputs, chunks=chunks):
            buf = inputs[g].clone()
            compressed_pipelined.all_reduce(fmt, intra_t, inter_t, buf, ReduceOp.SUM, chunks)
            return buf

        results = run_grid(nodes, local, fn)
        for out in results[1:]:
            assert torch.equal(out.view(torch.uint8), results[0].view(torch.uint8)), (n, chunks)
        if n:
            exact = torch.stack([x.double() for x in inputs]).sum(0)
            scale = torch.stack([x.double().abs() for x in inputs]).sum(0).max()
            assert (results[0].double() - exact).abs().max() <= tolerance * scale * 1.01, (n, chunks)


# --- framework adapters ------------------------------------------------------------------------------------


def test_fsdp_compression_per_collective() -> None:
    from pccl_torch.integrations.fsdp import per_collective

    assert per_collective(None) == {"all_gather": None, "reduce_scatter": None}
    assert per_collective("bf16") == {"all_gather": "bf16", "reduce_scatter": "bf16"}
    assert per_collective({"all_gather": "int8"}) == {"all_gather": "int8", "reduce_scatter": None}
    with pytest.raises(ValueError, match="'all_gather' and/or 'reduce_scatter'.*all_reduce"):
        per_collective({"all_reduce": "bf16"})


def test_ddp_compressed_hook_checks_its_format_when_made() -> None:
    from pccl_torch.integrations.ddp import compressed_allreduce_hook

    assert compressed_allreduce_hook("bf16").keywords == {"compression": "bf16"}
    with pytest.raises(ValueError, match="unknown compression 'bf12'"):
        compressed_allreduce_hook("bf12")
