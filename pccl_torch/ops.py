"""Reduction operators and the dtypes each one is defined for.

pccl_torch accepts its own :class:`ReduceOp`, the matching ``torch.distributed.ReduceOp`` values,
or :func:`premul_sum` (multiply every input by a factor, then sum: what FSDP uses for custom
gradient scaling). Everything is normalised to a :class:`Reduction` before any communication.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "ReduceOp",
    "Reduction",
    "premul_sum",
    "as_reduction",
    "SUPPORTED_DTYPES",
    "FLOAT_DTYPES",
    "INT_DTYPES",
]

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INT_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = FLOAT_DTYPES + INT_DTYPES


class ReduceOp(enum.Enum):
    """Element-wise reduction applied across ranks."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    PREMUL_SUM = "premul_sum"


# Ops whose combining step is not a plain binary op: AVG and PREMUL_SUM are SUM plus a scale.
_FLOAT_ONLY = (ReduceOp.AVG, ReduceOp.PREMUL_SUM)


@dataclass(frozen=True, slots=True)
class Reduction:
    """A normalised reduction: the binary combining op plus the scaling it implies.

    ``combine`` is what every local reduction step applies (SUM, PRODUCT, MIN or MAX);
    ``pre_scale`` multiplies the inputs before combining (PREMUL_SUM); ``divide_by_world``
    divides the result by the number of ranks (AVG).
    """

    op: ReduceOp
    combine: ReduceOp
    pre_scale: float | None = None
    divide_by_world: bool = False

    def check_dtype(self, dtype: torch.dtype) -> None:
        """Raise ``TypeError`` if this reduction is not defined for ``dtype``."""
        if dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"unsupported dtype {dtype}: pccl_torch reduces {', '.join(map(str, SUPPORTED_DTYPES))}"
            )
        if self.op in _FLOAT_ONLY and not dtype.is_floating_point:
            raise TypeError(
                f"ReduceOp.{self.op.name} is defined for floating-point tensors only, got {dtype}: "
                "use ReduceOp.SUM and scale the result yourself"
            )


def premul_sum(factor: float) -> Reduction:
    """PREMUL_SUM: multiply each rank's input by ``factor``, then sum (as NCCL's ncclRedOpCreatePreMulSum)."""
    if isinstance(factor, torch.Tensor):
        if factor.numel() != 1:
            raise ValueError(f"premul_sum factor must be a scalar, got a tensor of shape {tuple(factor.shape)}")
        factor = float(factor.item())
    return Reduction(ReduceOp.PREMUL_SUM, ReduceOp.SUM, pre_scale=float(factor))


_BY_NAME = {op.name: op for op in ReduceOp}


def _torch_name(op: Any) -> str | None:
    """The name of a ``torch.distributed.ReduceOp`` (or its RedOpType), e.g. ``"SUM"``, or None."""
    name = getattr(op, "name", None)
    if name is None:
        # torch.distributed.ReduceOp instances are not hashable; their RedOpType lives in `.op`.
        inner = getattr(op, "op", None)
        name = getattr(inner, "name", None)
    if name is None:
        text = str(op)
        name = text.rsplit(".", 1)[-1] if "ReduceOp" in text or "RedOpType" in text else None
    return name


_PLAIN = {op: Reduction(op, op) for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX)}
_SUM = _PLAIN[ReduceOp.SUM]


def torch_premul_factor(op: Any) -> Any:
    """The factor of torch's PREMUL_SUM ReduceOp (``dist._make_nccl_premul_sum(f)``: a float or a one-element
    tensor), or None. Read from the op's pickled state, ``(RedOpType, factor)``, which torch's ReduceOp has long
    had; its ``factor`` property is recent (torch 2.11, on the GPU machine, had none: "needs a factor")."""
    state = getattr(op, "__getstate__", None)
    try:
        found = state() if state is not None else None
    except (RuntimeError, TypeError):
        found = None
    if isinstance(found, tuple) and len(found) == 2:
        return found[1]
    try:
        return getattr(op, "factor", None)
    except (RuntimeError, TypeError):  # torch raises when the op carries no factor
        return None


def as_reduction(op: Any) -> Reduction:
    """Normalise ``op`` (ours, torch's, a name such as ``"sum"``, or a Reduction) to a Reduction."""
    if op is ReduceOp.SUM:  # the default, on nearly every call: no enum hashing
        return _SUM
    if isinstance(op, Reduction):
        return op
    if isinstance(op, ReduceOp) and op in _PLAIN:  # the common case, on every call: no allocation
        return _PLAIN[op]
    if isinstance(op, str):
        found = _BY_NAME.get(op.upper())
    elif isinstance(op, ReduceOp):
        found = op
    else:
        found = _BY_NAME.get(_torch_name(op) or "")
    if found is None:
        shown = _torch_name(op) if not isinstance(op, str) and _torch_name(op) else repr(op)
        raise ValueError(
            f"unsupported reduction {shown}: expected one of {', '.join(_BY_NAME)} "
            "(pccl_torch.ReduceOp, torch.distributed.ReduceOp or a name), or pccl_torch.premul_sum(factor)"
        )
    if found is ReduceOp.PREMUL_SUM:
        factor = torch_premul_factor(op)  # torch's dist._make_nccl_premul_sum(factor) carries its factor
        if factor is None:
            raise ValueError("ReduceOp.PREMUL_SUM needs a factor: pass pccl_torch.premul_sum(factor)")
        return premul_sum(factor)
    if found is ReduceOp.AVG:
        return Reduction(ReduceOp.AVG, ReduceOp.SUM, divide_by_world=True)
    return Reduction(found, found)
