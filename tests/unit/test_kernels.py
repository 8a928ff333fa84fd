"""The kernel layer's torch paths against plain-torch references, over weird shapes and every dtype."""

from __future__ import annotations

import pytest
import torch

from pccl_torch.ops import ReduceOp, SUPPORTED_DTYPES
from pccl_torch.triton_kernels import permute_blocks, reduce_, rotate_, scale_

SHAPES = [(1, 1, 0), (1, 1, 1), (2, 3, 9), (3, 5, 41), (5, 2, 341), (8, 1, 7), (3, 3, 1)]


@pytest.mark.parametrize("a,b,c", SHAPES)
def test_permute_blocks_matches_transpose(a: int, b: int, c: int) -> None:
    src = torch.arange(a * b * c, dtype=torch.float32)
    dst = torch.empty_like(src)
    permute_blocks(src, dst, a, b, c)
    assert torch.equal(dst, src.view(a, b, c).transpose(0, 1).reshape(-1))
    back = torch.empty_like(src)
    permute_blocks(dst, back, b, a, c)
    assert torch.equal(back, src)


@pytest.mark.parametrize("numel,shift", [(0, 3), (1, 5), (9, 0), (9, 4), (41, 41), (41, -3), (4231, 1000)])
def test_rotate_matches_roll(numel: int, shift: int) -> None:
    src = torch.arange(numel, dtype=torch.int64)
    dst = torch.empty_like(src)
    rotate_(src, dst, shift)
    assert torch.equal(dst, torch.roll(src, shift))


def test_pack_errors_are_clear() -> None:
    x = torch.zeros(6)
    with pytest.raises(ValueError, match="expected 8 elements"):
        permute_blocks(x, torch.zeros(6), 2, 2, 2)
    with pytest.raises(ValueError, match="in place"):
        permute_blocks(x, x, 2, 3, 1)
    with pytest.raises(TypeError, match="dtypes differ"):
        rotate_(x, torch.zeros(6, dtype=torch.int32), 1)
    with pytest.raises(ValueError, match="contiguous"):
        permute_blocks(torch.zeros(3, 2).t().reshape(-1)[:6].view(2, 3).t(), torch.zeros(6), 2, 3, 1)


def _reference(a: torch.Tensor, b: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    wide = torch.float64 if a.dtype.is_floating_point else torch.int64
    x, y = a.to(wide), b.to(wide)
    out = {ReduceOp.SUM: x + y, ReduceOp.PRODUCT: x * y, ReduceOp.MIN: torch.minimum(x, y),
           ReduceOp.MAX: torch.maximum(x, y)}[op]
    return out.to(a.dtype)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES)
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX])
@pytest.mark.parametrize("numel", [0, 1, 9, 341])
def test_reduce_matches_reference(dtype: torch.dtype, op: ReduceOp, numel: int) -> None:
    g = torch.Generator().manual_seed(numel)
    a = (torch.randn(numel, generator=g) * 8).to(dtype)
    b = (torch.randn(numel, generator=g) * 8).to(dtype)
    acc = a.clone()
    reduce_(acc, b, op)
    # One correctly rounded result: identical to the float64 result rounded once.
    assert torch.equal(acc, _reference(a, b, op))
    other = b.clone()
    reduce_(other, a, op)
    assert torch.equal(acc.view(torch.uint8), other.view(torch.uint8)), "op(a, b) != op(b, a) bitwise"


def test_reduce_rejects_mismatches_and_bad_ops() -> None:
    with pytest.raises(TypeError, match="dtypes differ"):
        reduce_(torch.zeros(2), torch.zeros(2, dtype=torch.float64), ReduceOp.SUM)
    with pytest.raises(ValueError, match="shapes differ"):
        reduce_(torch.zeros(2), torch.zeros(3), ReduceOp.SUM)
    with pytest.raises(ValueError, match="combining op"):
        reduce_(torch.zeros(2), torch.zeros(2), ReduceOp.AVG)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_scale(dtype: torch.dtype) -> None:
    x = torch.arange(9, dtype=torch.float64)
    t = x.to(dtype, copy=True)
    scale_(t, 0.25)
    assert torch.equal(t, (x * 0.25).to(dtype))
    with pytest.raises(TypeError, match="floating-point"):
        scale_(torch.ones(2, dtype=torch.int32), 2.0)
