"""The wire-format kernels (block quantization, byte planes) on the Triton interpreter against their torch
references, over weird sizes, every float dtype and special values (NaN, inf, -0.0, subnormals)."""

from __future__ import annotations

import pytest
import torch

from pccl_torch.ops import ReduceOp
from pccl_torch.triton_kernels import QBLOCK, dequantize, merge_planes, quantize, split_planes, use_backend
from pccl_torch.triton_kernels.quantize import blocks_of

from .conftest import WEIRD_SIZES

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SIZES = WEIRD_SIZES + (QBLOCK, 3 * QBLOCK + 1)


def _values(n: int, dtype: torch.dtype, special: bool) -> torch.Tensor:
    # Made on the CPU with a CPU generator, then moved to the default device: the same values on every device
    # (a CPU generator cannot feed CUDA tensors, and a CUDA generator draws other numbers).
    x = (torch.randn(n, generator=torch.Generator(device="cpu").manual_seed(n), device="cpu") * 3).to(dtype)
    if special and n >= 8:
        info = torch.finfo(dtype)
        x[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, info.tiny / 4, -info.tiny],
                             device="cpu")
        x[-1] = info.max
    return x.to(torch.get_default_device())


def _both(fn):
    """Run ``fn`` on the torch path, then on Triton; return both results."""
    with use_backend("torch"):
        expected = fn()
    with use_backend("triton"):
        got = fn()
    return expected, got


def _encode(x: torch.Tensor, qdtype: torch.dtype):
    q = torch.empty(x.numel(), dtype=qdtype)
    absmax = torch.empty(blocks_of(x.numel()), dtype=torch.float32)
    quantize(x, q, absmax)
    return q, absmax


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_int8_quantize_kernel_matches_reference(triton_backend, dtype: torch.dtype, n: int) -> None:
    x = _values(n, dtype, special=False)
    before = x.clone()
    (q0, a0), (q1, a1) = _both(lambda: _encode(x, torch.int8))
    assert torch.equal(q0, q1) and torch.equal(a0, a1)
    assert torch.equal(x, before)
    out0, out1 = _both(lambda: _decoded(q0, a0, dtype))
    assert torch.equal(out0, out1)
    if n:  # half a step per element at most, block by block, plus the rounding into the output dtype
        step = a0.repeat_interleave(QBLOCK)[:n].double() / 254
        bound = step * 1.001 + x.double().abs() * torch.finfo(dtype).eps + 1e-30
        assert ((out0.double() - x.double()).abs() <= bound).all()


def _decoded(q: torch.Tensor, absmax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(q.numel(), dtype=dtype)
    dequantize(q, absmax, out)
    return out


def test_int8_non_finite_block_decodes_to_nan_and_others_survive(triton_backend) -> None:
    x = torch.ones(3 * QBLOCK)
    x[QBLOCK + 5] = float("inf")
    x[2 * QBLOCK + 7] = float("nan")
    x[:QBLOCK] = 0.0
    for backend in ("torch", "triton"):
        with use_backend(backend):
            q, absmax = _encode(x, torch.int8)
            out = _decoded(q, absmax, torch.float32)
        assert torch.equal(out[:QBLOCK], torch.zeros(QBLOCK))  # an all-zero block stays zero
        assert out[QBLOCK:].isnan().all(), backend


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_fused_dequantize_accumulate_matches_reference(triton_backend, op: ReduceOp, dtype: torch.dtype) -> None:
    n = 4231
    q, absmax = _encode(_values(n, torch.float32, special=False), torch.int8)
    acc = _values(n, dtype, special=False)

    def run() -> torch.Tensor:
        out = acc.clone()
        dequantize(q, absmax, out, accumulate=op)
        return out

    expected, got = _both(run)
    assert torch.equal(expected, got)
    plain = torch.empty(n, dtype=torch.float32)
    dequantize(q, absmax, plain)
    if op == ReduceOp.SUM:
        assert torch.equal(expected, (acc.float() + plain).to(dtype))


@pytest.mark.parametrize("n", (0, 1, 41, 4231))
def test_fp8_round_trip_is_within_one_e4m3_step(n: int) -> None:
    x = _values(n, torch.float32, special=False)
    q, absmax = _encode(x, torch.float8_e4m3fn)
    out = _decoded(q, absmax, torch.float32)
    if n:
        # e4m3 keeps 3 mantissa bits: relative error <= 2^-4, plus the smallest step near zero
        scale = absmax.repeat_interleave(QBLOCK)[:n]
        assert ((out - x).abs() <= x.abs() / 16 + scale / 448 * 2.0 ** -9 + 1e-12).all()


def test_quantize_rejects_what_it_cannot_encode() -> None:
    with pytest.raises(TypeError, match="floating-point"):
        quantize(torch.ones(4, dtype=torch.int32), torch.empty(4, dtype=torch.int8), torch.empty(1))
    with pytest.raises(ValueError, match="need q of 4"):
        quantize(torch.ones(4), torch.empty(3, dtype=torch.int8), torch.empty(1))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_byte_planes_kernel_round_trips_bit_exactly(triton_backend, dtype: torch.dtype, n: int) -> None:
    x = _values(n, dtype, special=True)
    k = x.element_size()

    def split():
        top, rest = torch.empty(n, dtype=torch.uint8), torch.empty(n * (k - 1), dtype=torch.uint8)
        split_planes(x, top, rest)
        return top, rest

    (t0, r0), (t1, r1) = _both(split)
    assert torch.equal(t0, t1) and torch.equal(r0, r1)
    assert torch.equal(t0, x.view(torch.uint8).view(-1, k)[:, -1])

    def merge():
        out = torch.empty(n, dtype=dtype)
        merge_planes(t0, r0, out)
        return out

    m0, m1 = _both(merge)
    assert torch.equal(m0.view(torch.uint8), x.view(torch.uint8))
    assert torch.equal(m1.view(torch.uint8), x.view(torch.uint8))
