"""Byte planes of floats, for lossless coding: the top byte of every element apart from the rest.

The top byte of an IEEE float (little-endian: its last byte) holds the sign and the high exponent bits,
which take few distinct values in weights and gradients and compress well; the lower bytes are mostly
mantissa noise and are sent as they are (ZipNN's observation).

- ``split_planes(x, top, rest)``: ``top[i]`` = byte ``k - 1`` of element ``i`` (k = element size);
  ``rest[i * (k - 1) + j]`` = byte ``j`` of element ``i``, j < k - 1.
- ``merge_planes(top, rest, out)``: the inverse, bit-exact for every value (NaN payloads, -0.0, inf,
  subnormals: bytes are moved, never interpreted).

Memory layout: every operand flat and contiguous; ``x``/``out`` are read and written as uint8 views.
In the Triton kernels, program ``i`` owns elements ``[i * BLOCK, (i + 1) * BLOCK)``.
"""

from __future__ import annotations

import torch

from pccl_torch.triton_kernels._backend import HAS_TRITON, block_size, grid_for, launching, wants_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _split_kernel(x_ptr, top_ptr, rest_ptr, n, K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr):
        # x_ptr: *uint8 of n * K bytes; top_ptr: *uint8, n; rest_ptr: *uint8, n * (K - 1).
        # KP: K rounded up to a power of two (the byte index range; bytes j >= K are masked off).
        e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        j = tl.arange(0, KP)
        inside = (e < n)[:, None] & (j < K)[None, :]
        b = tl.load(x_ptr + e[:, None] * K + j[None, :], mask=inside, other=0)
        tl.store(top_ptr + e[:, None] + j[None, :] * 0, b, mask=inside & (j == K - 1)[None, :])
        tl.store(rest_ptr + e[:, None] * (K - 1) + j[None, :], b, mask=inside & (j < K - 1)[None, :])

    @triton.jit
    def _merge_kernel(top_ptr, rest_ptr, out_ptr, n, K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr):
        e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        j = tl.arange(0, KP)
        inside = (e < n)[:, None] & (j < K)[None, :]
        is_top = (j == K - 1)[None, :]
        low = tl.load(rest_ptr + e[:, None] * (K - 1) + j[None, :], mask=inside & ~is_top, other=0)
        high = tl.load(top_ptr + e[:, None] + j[None, :] * 0, mask=inside & is_top, other=0)
        tl.store(out_ptr + e[:, None] * K + j[None, :], tl.where(is_top, high, low), mask=inside)


def _bytes(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8).view(-1, x.element_size())


def split_reference(x: torch.Tensor, top: torch.Tensor, rest: torch.Tensor) -> None:
    b = _bytes(x)
    top.copy_(b[:, -1])
    rest.view(-1, x.element_size() - 1).copy_(b[:, :-1])


def merge_reference(top: torch.Tensor, rest: torch.Tensor, out: torch.Tensor) -> None:
    b = _bytes(out)
    b[:, -1].copy_(top)
    b[:, :-1].copy_(rest.view(-1, out.element_size() - 1))


def _check(x: torch.Tensor, top: torch.Tensor, rest: torch.Tensor) -> None:
    k, n = x.element_size(), x.numel()
    if k < 2:
        raise TypeError(f"byte planes need elements of 2 bytes or more, got {x.dtype}")
    if top.dtype != torch.uint8 or rest.dtype != torch.uint8 or top.numel() != n or rest.numel() != n * (k - 1):
        raise ValueError(f"byte planes of {n} {x.dtype} elements need uint8 top of {n} and rest of {n * (k - 1)}, "
                         f"got {top.dtype} {top.numel()} and {rest.dtype} {rest.numel()}")
    if not (x.is_contiguous() and top.is_contiguous() and rest.is_contiguous()):
        raise ValueError("byte planes: every operand must be contiguous")


def _launch(kernel, x: torch.Tensor, *args: torch.Tensor) -> None:
    k = x.element_size()
    block = block_size(x) // 4
    with launching():
        kernel[grid_for(x.numel(), block, "byte planes")](*args, x.numel(), K=k, KP=triton.next_power_of_2(k), BLOCK=block)


def split_planes(x: torch.Tensor, top: torch.Tensor, rest: torch.Tensor) -> None:
    """Write the top byte of every element of ``x`` into ``top`` and the other bytes into ``rest``."""
    _check(x, top, rest)
    if x.numel() == 0:
        return
    if not wants_triton(x, "split_planes"):
        split_reference(x, top, rest)
        return
    _launch(_split_kernel, x, x.view(torch.uint8), top, rest)


def merge_planes(top: torch.Tensor, rest: torch.Tensor, out: torch.Tensor) -> None:
    """Rebuild ``out`` from its planes (the inverse of :func:`split_planes`, bit-exact)."""
    _check(out, top, rest)
    if out.numel() == 0:
        return
    if not wants_triton(out, "merge_planes"):
        merge_reference(top, rest, out)
        return
    _launch(_merge_kernel, out, top, rest, out.view(torch.uint8))
