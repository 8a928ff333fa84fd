"""Local reductions: ``acc = op(acc, other)`` and the scale used by AVG and PREMUL_SUM.

16-bit floats are combined in float32 and rounded once per call, as NCCL does per step.
Element-wise float ``op(a, b) == op(b, a)`` bitwise for SUM, PRODUCT, MIN and MAX, which is what lets
the pairwise-exchange algorithms leave identical results on every rank.
"""

from __future__ import annotations

from typing import Callable

import torch

from pccl_torch.ops import ReduceOp

_LOW_PRECISION = (torch.float16, torch.bfloat16)

_BINARY: dict[ReduceOp, Callable[..., torch.Tensor]] = {
    ReduceOp.SUM: torch.add,
    ReduceOp.PRODUCT: torch.mul,
    ReduceOp.MIN: torch.minimum,
    ReduceOp.MAX: torch.maximum,
}


def _check_pair(acc: torch.Tensor, other: torch.Tensor) -> None:
    if acc.dtype != other.dtype:
        raise TypeError(f"cannot reduce: dtypes differ ({acc.dtype} vs {other.dtype})")
    if acc.shape != other.shape:
        raise ValueError(f"cannot reduce: shapes differ ({tuple(acc.shape)} vs {tuple(other.shape)})")
    if acc.device != other.device:
        raise ValueError(f"cannot reduce: devices differ ({acc.device} vs {other.device})")


def reduce_(acc: torch.Tensor, other: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    """In place ``acc = op(acc, other)``; ``op`` is one of SUM, PRODUCT, MIN, MAX. Returns ``acc``."""
    _check_pair(acc, other)
    fn = _BINARY.get(op)
    if fn is None:
        raise ValueError(f"cannot reduce with {op}: the combining op must be one of {[o.name for o in _BINARY]}")
    if acc.numel() == 0:
        return acc
    if acc.dtype in _LOW_PRECISION:
        acc.copy_(fn(acc.float(), other.float()))
    else:
        fn(acc, other, out=acc)
    return acc


def scale_(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """In place ``tensor *= factor`` (computed in float32 for 16-bit floats, rounded once)."""
    if not tensor.dtype.is_floating_point:
        raise TypeError(f"cannot scale a {tensor.dtype} tensor: scaling is for floating-point tensors")
    if tensor.numel() == 0:
        return tensor
    if tensor.dtype in _LOW_PRECISION:
        tensor.copy_(tensor.float() * factor)
    else:
        tensor.mul_(factor)
    return tensor
