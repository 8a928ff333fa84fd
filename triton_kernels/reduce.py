"""Local reductions: ``out = op(in_0, ..., in_{k-1})`` (k = 1..8), ``acc = op(acc, other)``, and the
scale used by AVG and PREMUL_SUM, optionally fused into the reduction's store.

Maths: element-wise, combined left to right, ``((in_0 op in_1) op in_2) ...``, in an accumulator of
``float32`` for 16-bit floats (rounded once, at the store), of the tensor's own dtype otherwise. Then
``out = acc * scale`` when a scale is given. Float ``op(a, b) == op(b, a)`` bitwise for SUM, PRODUCT,
MIN and MAX, which is what lets pairwise-exchange algorithms leave identical results on every rank.
MIN and MAX propagate NaN, as ``torch.minimum``/``torch.maximum`` do.

Memory layout: every tensor is flat and contiguous with the same number of elements; program ``i`` of
the Triton kernel owns elements ``[i * BLOCK, (i + 1) * BLOCK)`` of every operand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from pccl_torch import workspace
from pccl_torch.ops import ReduceOp, SUPPORTED_DTYPES
from pccl_torch.triton_kernels._backend import HAS_TRITON, block_size, grid_for, launching, wants_triton

MAX_INPUTS = 8
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_OP_CODES = {ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.MIN: 2, ReduceOp.MAX: 3}

_TORCH_BINARY: dict[ReduceOp, Callable[..., torch.Tensor]] = {
    ReduceOp.SUM: torch.add,
    ReduceOp.PRODUCT: torch.mul,
    ReduceOp.MIN: torch.minimum,
    ReduceOp.MAX: torch.maximum,
}

if HAS_TRITON:
    import triton
    import triton.language as tl

    _ACCUMULATOR = {
        torch.float32: tl.float32, torch.float16: tl.float32, torch.bfloat16: tl.float32,
        torch.float64: tl.float64, torch.int32: tl.int32, torch.int64: tl.int64,
    }

    @triton.jit
    def _combine(a, b, OP: tl.constexpr):
        # OP: 0 SUM, 1 PRODUCT, 2 MIN, 3 MAX (NaN-propagating, as torch.minimum/maximum)
        if OP == 0:
            result = a + b
        elif OP == 1:
            result = a * b
        elif OP == 2:
            result = tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
        else:
            result = tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
        return result

    @triton.jit
    def _round_to_bfloat16(x):
        # fp32 -> bf16 round-to-nearest-even on the bits, identical on GPUs and in the interpreter (whose
        # own fp32 -> bf16 conversion truncates): add 0x7FFF plus the lowest kept bit, keep the top 16
        # bits; NaN stays a quiet NaN of the same sign.
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        quiet_nan = (bits >> 16) | 0x0040
        return tl.where(x != x, quiet_nan, rounded).to(tl.uint16).to(tl.bfloat16, bitcast=True)

    @triton.jit
    def _reduce_kernel(
        out_ptr,  # *T: output, n_elements; may be the same buffer as in0_ptr (in-place accumulate)
        in0_ptr, in1_ptr, in2_ptr, in3_ptr,  # *T: inputs; only the first K are read, the others are None
        in4_ptr, in5_ptr, in6_ptr, in7_ptr,  # (a constexpr: no pointer to specialize at each launch)
        n_elements,  # elements in every operand
        scale,  # fp32 multiplier applied before the store when HAS_SCALE
        K: tl.constexpr,  # number of inputs, 1..8
        OP: tl.constexpr,  # combining op code (see _combine)
        ACC: tl.constexpr,  # accumulator dtype: fp32 for 16-bit floats, else the tensor dtype
        HAS_SCALE: tl.constexpr,  # multiply by `scale` (AVG, PREMUL_SUM) fused into the store
        OUT_BF16: tl.constexpr,  # round the fp32 accumulator to bfloat16 by hand (see _round_to_bfloat16)
        BLOCK: tl.constexpr,  # elements per program
    ):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n_elements
        acc = tl.load(in0_ptr + offsets, mask=mask).to(ACC)
        if K > 1:
            acc = _combine(acc, tl.load(in1_ptr + offsets, mask=mask).to(ACC), OP)
        if K > 2:
            acc = _combine(acc, tl.load(in2_ptr + offsets, mask=mask).to(ACC), OP)
        if K > 3:
            acc = _combine(acc, tl.load(in3_ptr + offsets, mask=mask).to(ACC), OP)
        if K > 4:
            acc = _combine(acc, tl.load(in4_ptr + offsets, mask=mask).to(ACC), OP)
        if K > 5:
            acc = _combine(acc, tl.load(in5_ptr + offsets, mask=mask).to(ACC), OP)
        if K > 6:
            acc = _combine(acc, tl.load(in6_ptr + offsets, mask=mask).to(ACC), OP)
        if K > 7:
            acc = _combine(acc, tl.load(in7_ptr + offsets, mask=mask).to(ACC), OP)
        if HAS_SCALE:
            acc = acc * scale
        if OUT_BF16:
            tl.store(out_ptr + offsets, _round_to_bfloat16(acc), mask=mask)
        else:
            tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=mask)


def reduce_reference(out: torch.Tensor, inputs: Sequence[torch.Tensor], op: ReduceOp,
                     scale: float | None = None) -> torch.Tensor:
    """Plain-torch twin of the Triton kernel: same order, same accumulator, same single rounding.

    ``out`` may be ``inputs[0]`` (accumulate in place) but no other input. Full-precision dtypes are
    combined straight into ``out`` with no temporary (fresh CPU allocations cost page faults). 16-bit floats
    go through two float32 temporaries, the workspace's lanes on a worker (``pccl_torch.workspace``: piece by
    piece where a lane is smaller; element-wise, so the result is the same), else fresh tensors.
    """
    fn = _TORCH_BINARY[op]
    if out.dtype in _LOW_PRECISION:
        n, flat = out.numel(), [t.view(-1) for t in (out, *inputs)]
        acc_room = workspace.lane(0, n, torch.float32, out.device)
        other_room = workspace.lane(1, n, torch.float32, out.device) if len(inputs) > 1 else acc_room
        step = max(min(acc_room.numel(), other_room.numel()), 1)
        for start in range(0, n, step):
            acc, other = acc_room[:min(step, n - start)], other_room[:min(step, n - start)]
            acc.copy_(flat[1][start:start + step])
            for source in flat[2:]:
                fn(acc, other.copy_(source[start:start + step]), out=acc)
            if scale is not None:
                acc.mul_(scale)
            flat[0][start:start + step].copy_(acc)
        return out
    if len(inputs) == 1:
        if out.data_ptr() != inputs[0].data_ptr():
            out.copy_(inputs[0])
    else:
        fn(inputs[0], inputs[1], out=out)
        for other in inputs[2:]:
            fn(out, other, out=out)
    if scale is not None:
        out.mul_(scale)
    return out


def _check(out: torch.Tensor, inputs: Sequence[torch.Tensor], op: ReduceOp, scale: float | None) -> None:
    if not 1 <= len(inputs) <= MAX_INPUTS:
        raise ValueError(f"cannot reduce {len(inputs)} inputs: between 1 and {MAX_INPUTS} are supported")
    if op not in _OP_CODES:
        raise ValueError(f"cannot reduce with {op}: the combining op must be one of {[o.name for o in _OP_CODES]}")
    if out.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"cannot reduce {out.dtype} tensors: supported dtypes are {SUPPORTED_DTYPES}")
    if scale is not None and not out.dtype.is_floating_point:
        raise TypeError(f"cannot scale a {out.dtype} tensor: scaling is for floating-point tensors")
    for i, t in enumerate(inputs):
        if t.dtype != out.dtype:
            raise TypeError(f"cannot reduce: dtypes differ (input {i} is {t.dtype}, output is {out.dtype})")
        if t.shape != out.shape:
            raise ValueError(f"cannot reduce: shapes differ (input {i} is {tuple(t.shape)}, output is {tuple(out.shape)})")
        if t.device != out.device:
            raise ValueError(f"cannot reduce: devices differ (input {i} is on {t.device}, output on {out.device})")
        if not t.is_contiguous():
            raise ValueError(f"cannot reduce: input {i} is not contiguous")
    if not out.is_contiguous():
        raise ValueError("cannot reduce: output is not contiguous")


def reduce_n(out: torch.Tensor, inputs: Sequence[torch.Tensor], op: ReduceOp,
             scale: float | None = None) -> torch.Tensor:
    """``out = op(inputs[0], ..., inputs[k-1]) [* scale]`` for k = 1..8; ``out`` may be ``inputs[0]``."""
    _check(out, inputs, op, scale)
    if out.numel() == 0:
        return out
    if not wants_triton(out, reduce_kernel_name(len(inputs))) or (scale is not None and out.dtype == torch.float64):
        # float64 scales: Triton passes a Python float as float32, which would round the factor
        return reduce_reference(out, inputs, op, scale)
    block = block_size(out)
    padded = (*inputs, *(None,) * (MAX_INPUTS - len(inputs)))  # unused inputs: None, never read
    with launching():
        _reduce_kernel[grid_for(out.numel(), block, "reduce")](
            out, *padded, out.numel(), 1.0 if scale is None else float(scale),
            K=len(inputs), OP=_OP_CODES[op], ACC=_ACCUMULATOR[out.dtype], HAS_SCALE=scale is not None,
            OUT_BF16=out.dtype == torch.bfloat16, BLOCK=block,
        )
    return out


def reduce_kernel_name(k: int) -> str:
    """The dispatch table's name for a k-way reduce: ``reduce_2`` for k <= 2 (one torch launch for full-precision
    dtypes), ``reduce_8`` for k >= 3 (k - 1 torch launches; measured at k = 8)."""
    return "reduce_2" if k <= 2 else "reduce_8"


def reduce_(acc: torch.Tensor, other: torch.Tensor, op: ReduceOp, scale: float | None = None) -> torch.Tensor:
    """In place ``acc = op(acc, other) [* scale]``; ``op`` is SUM, PRODUCT, MIN or MAX. Returns ``acc``."""
    return reduce_n(acc, (acc, other), op, scale)


def scale_(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """In place ``tensor *= factor`` (computed in float32 for 16-bit floats, rounded once)."""
    if not tensor.dtype.is_floating_point:
        raise TypeError(f"cannot scale a {tensor.dtype} tensor: scaling is for floating-point tensors")
    return reduce_n(tensor, (tensor,), ReduceOp.SUM, scale=factor)
