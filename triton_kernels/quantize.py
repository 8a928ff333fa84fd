"""Block quantization for compressed wire formats: int8 or fp8 (e4m3) values with one scale per block.

Maths (identical in the Triton kernel and the torch reference, so they agree bit for bit):
- A tensor of n elements is cut into blocks of ``QBLOCK`` consecutive elements (the last may be shorter).
  Each block keeps ``absmax`` = max |x| over the block, in float32.
- Encode: ``y = (x / absmax) * QMAX`` (an IEEE division, then a multiplication; QMAX = 127 for int8, 448
  for e4m3; |y| <= QMAX exactly), then rounded to nearest even: int8 by ``torch.round`` (the kernel adds
  and subtracts 1.5 * 2^23, which rounds the same way for |y| < 2^22), e4m3 by torch's cast.
  A block of zeros has absmax 0 and encodes to zeros.
- Decode: ``x' = (q * absmax) * (1 / QMAX)`` in float32, optionally combined into an accumulator
  (``acc = op(acc, x')`` in float32, float64 for a float64 ``acc``, rounded once: the fused
  decode-and-reduce a compressed reduce-scatter needs).
- Non-finite inputs: a block holding inf or NaN stores absmax = NaN and decodes to NaN everywhere in
  the block, so an overflow is never turned into finite numbers silently.
- The int8 error per element is at most absmax / 254 (half a step).

Memory layout: ``x`` flat and contiguous (float32, float16, bfloat16 or float64; loaded as float32);
``q`` int8 (or float8_e4m3fn) of n elements; ``absmax`` float32 of ceil(n / QBLOCK) elements. In the
Triton kernels, program ``i`` owns blocks ``[i * ROWS, (i + 1) * ROWS)``.

On CUDA the int8 kernels are Triton; fp8 runs torch's own cast on every device (the Triton interpreter
rounds float8 casts wrongly near powers of two, so a Triton fp8 kernel could not be verified here).
"""

from __future__ import annotations

import torch

from pccl_torch.ops import ReduceOp
from pccl_torch.triton_kernels._backend import HAS_TRITON, interpreting, launching, wants_triton
from pccl_torch.triton_kernels.reduce import _OP_CODES, _TORCH_BINARY

QBLOCK = 256
"""Elements per scale: 1.6% of extra bytes for int8 of float32 (4 bytes of scale per 256 bytes)."""
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
QUANTIZED_DTYPES = tuple(QMAX)
#: Outputs the int8 decode kernel writes; the others run the reference on every path (bfloat16 stores would need
#: the hand rounding of reduce.py, float64 a float64 accumulator).
TRITON_DEQUANTIZE_DTYPES = (torch.float32, torch.float16)

if HAS_TRITON:
    import triton
    import triton.language as tl

    from pccl_torch.triton_kernels.reduce import _combine

    @triton.jit
    def _quantize_int8_kernel(
        x_ptr,  # *T: input, n elements
        q_ptr,  # *int8: output, n elements
        absmax_ptr,  # *fp32: output, one per block
        n,  # elements
        QBLOCK: tl.constexpr,  # elements per block (a power of two)
        ROWS: tl.constexpr,  # blocks per program
    ):
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        offsets = rows[:, None] * QBLOCK + tl.arange(0, QBLOCK)[None, :]
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        finite = tl.min(tl.where(tl.abs(x) < float("inf"), 1, 0), axis=1) > 0  # NaN compares False
        absmax = tl.where(finite, tl.max(tl.abs(x), axis=1), float("nan"))
        safe = tl.where(absmax > 0, absmax, 1.0)
        y = tl.math.div_rn(x, safe[:, None]) * 127.0
        q = (y + 12582912.0) - 12582912.0  # round to nearest even (1.5 * 2^23)
        q = tl.where(finite[:, None], q, 0.0)
        tl.store(q_ptr + offsets, q.to(tl.int8), mask=mask)
        tl.store(absmax_ptr + rows, absmax, mask=rows * QBLOCK < n)

    @triton.jit
    def _dequantize_int8_kernel(
        q_ptr,  # *int8: n elements
        absmax_ptr,  # *fp32: one per block
        out_ptr,  # *T: n elements; read too when ACCUMULATE
        n,  # elements
        inv_qmax,  # fp32: 1 / 127
        QBLOCK: tl.constexpr,
        ROWS: tl.constexpr,
        ACCUMULATE: tl.constexpr,  # out = op(out, decoded) instead of out = decoded
        OP: tl.constexpr,  # combining op code (as in reduce.py: 0 SUM, 1 PRODUCT, 2 MIN, 3 MAX)
    ):
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        offsets = rows[:, None] * QBLOCK + tl.arange(0, QBLOCK)[None, :]
        mask = offsets < n
        absmax = tl.load(absmax_ptr + rows, mask=rows * QBLOCK < n, other=0.0)
        q = tl.load(q_ptr + offsets, mask=mask, other=0).to(tl.float32)
        value = q * absmax[:, None] * inv_qmax
        if ACCUMULATE:
            value = _combine(tl.load(out_ptr + offsets, mask=mask, other=0.0).to(tl.float32), value, OP)
        tl.store(out_ptr + offsets, value.to(out_ptr.dtype.element_ty), mask=mask)


# _NO_FMA: both kernels launch with enable_fp_fusion=False. On GPUs Triton may contract a multiply followed by an
# add into one fma, rounded once (encode: y * 127 + 1.5 * 2^23; decode-accumulate: acc + q * absmax * (1/127)),
# where torch rounds after each operation. The 2026-12-04 H200 run failed the float32 SUM decode-accumulate
# test (bitwise against torch); an fma is the likely cause, not yet confirmed on a GPU.


def blocks_of(n: int) -> int:
    """Scales (blocks) for ``n`` elements."""
    return -(-n // QBLOCK)


def _as_blocks(x: torch.Tensor) -> torch.Tensor:
    """``x`` as float32 ``[blocks, QBLOCK]``, zero-padded at the end (a copy only when n % QBLOCK != 0 or
    the dtype is not float32)."""
    n = x.numel()
    x = x.float()
    if n % QBLOCK == 0:
        return x.view(-1, QBLOCK)
    padded = torch.zeros(blocks_of(n) * QBLOCK, dtype=torch.float32, device=x.device)
    padded[:n].copy_(x)
    return padded.view(-1, QBLOCK)


def quantize_reference(x: torch.Tensor, q: torch.Tensor, absmax: torch.Tensor) -> None:
    """Plain-torch twin of the kernel (see the module docstring): ``q`` and ``absmax`` are written."""
    n, qmax = x.numel(), QMAX[q.dtype]
    if n == 0:
        return
    v = _as_blocks(x)
    amax = v.abs().amax(dim=1)
    finite = torch.isfinite(amax)
    all_finite = bool(finite.all())
    if not all_finite:
        amax = torch.where(finite, amax, torch.full_like(amax, float("nan")))
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    y = torch.div(v, safe[:, None]).mul_(qmax)
    if q.dtype == torch.int8:
        y.round_()
    if not all_finite:
        y = torch.where(finite[:, None], y, torch.zeros_like(y))
    q.copy_(y.view(-1)[:n])  # int8: y is integral already; e4m3: torch's cast rounds to nearest even
    absmax.copy_(amax)


def dequantize_reference(q: torch.Tensor, absmax: torch.Tensor, out: torch.Tensor,
                         accumulate: ReduceOp | None = None) -> None:
    """Plain-torch twin of the kernel: ``out = decoded`` or ``out = op(out, decoded)``."""
    n = q.numel()
    if n == 0:
        return
    inv = torch.tensor(1.0 / QMAX[q.dtype], dtype=torch.float32, device=q.device)
    whole = n - n % QBLOCK
    direct = accumulate is None and out.dtype == torch.float32  # decode straight into out
    decoded = out if direct else torch.empty(n, dtype=torch.float32, device=q.device)
    if whole:
        torch.mul(q[:whole].view(-1, QBLOCK).float(), absmax[: whole // QBLOCK, None], out=decoded[:whole].view(-1, QBLOCK))
    if whole < n:
        torch.mul(q[whole:].float(), absmax[-1], out=decoded[whole:])
    decoded.mul_(inv)
    if direct:
        return
    if accumulate is None:
        out.copy_(decoded)
    elif out.dtype in (torch.float32, torch.float64):  # in place; a float64 accumulator stays float64
        _TORCH_BINARY[accumulate](out, decoded.to(out.dtype), out=out)
    else:
        out.copy_(_TORCH_BINARY[accumulate](out.float(), decoded))


def _check(x: torch.Tensor, q: torch.Tensor, absmax: torch.Tensor) -> None:
    if q.dtype not in QMAX:
        raise TypeError(f"cannot quantize to {q.dtype}: supported are {', '.join(map(str, QUANTIZED_DTYPES))}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"cannot quantize {x.dtype} tensors: block quantization is for floating-point tensors")
    if q.numel() != x.numel() or absmax.numel() != blocks_of(x.numel()) or absmax.dtype != torch.float32:
        raise ValueError(f"quantize: {x.numel()} elements need q of {x.numel()} and float32 absmax of "
                         f"{blocks_of(x.numel())}, got {q.numel()} and {absmax.numel()} ({absmax.dtype})")
    if not (x.is_contiguous() and q.is_contiguous() and absmax.is_contiguous()):
        raise ValueError("quantize: every operand must be contiguous")


def _rows(device_is_cuda: bool) -> int:
    # GPUs: 8 blocks (2048 elements) a program; the interpreter pays per program: 128 blocks.
    return 8 if device_is_cuda or not interpreting() else 128


def quantize(x: torch.Tensor, q: torch.Tensor, absmax: torch.Tensor) -> None:
    """Encode ``x`` into ``q`` (int8 or float8_e4m3fn) and its per-block ``absmax`` (float32)."""
    _check(x, q, absmax)
    if x.numel() == 0:
        return
    if q.dtype != torch.int8 or not wants_triton(x, "quantize"):
        quantize_reference(x, q, absmax)
        return
    rows = _rows(x.is_cuda)
    with launching():
        _quantize_int8_kernel[(-(-blocks_of(x.numel()) // rows),)](x, q, absmax, x.numel(), QBLOCK=QBLOCK, ROWS=rows,
                                                                   enable_fp_fusion=False)  # see _NO_FMA


def dequantize(q: torch.Tensor, absmax: torch.Tensor, out: torch.Tensor, accumulate: ReduceOp | None = None) -> None:
    """Decode ``q`` and ``absmax`` into ``out`` (any float dtype), or combine them into it with ``accumulate``
    (SUM, PRODUCT, MIN or MAX, computed in float32 and rounded once into ``out``)."""
    _check(out, q, absmax)
    if accumulate is not None and accumulate not in _OP_CODES:
        raise ValueError(f"cannot accumulate with {accumulate}: expected one of {[o.name for o in _OP_CODES]}")
    if q.numel() == 0:
        return
    kernel = "dequantize" if accumulate is None else "dequantize_acc"
    if q.dtype != torch.int8 or out.dtype not in TRITON_DEQUANTIZE_DTYPES or not wants_triton(out, kernel):
        dequantize_reference(q, absmax, out, accumulate)
        return
    rows = _rows(out.is_cuda)
    with launching():
        _dequantize_int8_kernel[(-(-blocks_of(q.numel()) // rows),)](
            q, absmax, out, q.numel(), 1.0 / QMAX[torch.int8], QBLOCK=QBLOCK, ROWS=rows,
            ACCUMULATE=accumulate is not None, OP=_OP_CODES.get(accumulate, 0),
            enable_fp_fusion=False)  # see _NO_FMA
