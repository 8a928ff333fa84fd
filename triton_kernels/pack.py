"""Block permutations of flat buffers: the pack/unpack steps of the hierarchical collectives.

``permute_blocks`` views a flat buffer as ``[A, B, C]`` (A x B chunks of C elements) and writes the
``[B, A, C]`` transpose: the reduce-scatter pack (global order ``[node, local, chunk]`` to
``[local, node, chunk]``) and the all-gather unpack (the inverse). ``rotate_`` is Bruck's final
rotation. Both write into a separate output: the input is never modified.
"""

from __future__ import annotations

import torch


def _check(src: torch.Tensor, dst: torch.Tensor, numel: int, what: str) -> None:
    if src.dtype != dst.dtype:
        raise TypeError(f"cannot {what}: dtypes differ ({src.dtype} vs {dst.dtype})")
    if not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError(f"cannot {what}: input and output must be contiguous")
    if src.numel() != numel or dst.numel() != numel:
        raise ValueError(f"cannot {what}: expected {numel} elements, got input {src.numel()}, output {dst.numel()}")
    if src.numel() and src.data_ptr() == dst.data_ptr():
        raise ValueError(f"cannot {what} in place: input and output must be different buffers")


def permute_blocks(src: torch.Tensor, dst: torch.Tensor, a: int, b: int, c: int) -> torch.Tensor:
    """Write ``src`` viewed as ``[a, b, c]`` into ``dst`` as ``[b, a, c]``. Returns ``dst``."""
    if min(a, b, c) < 0:
        raise ValueError(f"cannot permute: block counts must be >= 0, got a={a}, b={b}, c={c}")
    _check(src, dst, a * b * c, "permute blocks")
    if src.numel():
        dst.view(b, a, c).copy_(src.view(a, b, c).transpose(0, 1))
    return dst


def rotate_(src: torch.Tensor, dst: torch.Tensor, shift: int) -> torch.Tensor:
    """Element ``i`` of ``src`` goes to element ``(i + shift) % N`` of ``dst`` (``N = src.numel()``).

    Bruck's all-gather ends with its buffer rotated so that it starts with this rank's block; this
    moves it back to rank order in two contiguous copies. Returns ``dst``.
    """
    _check(src, dst, src.numel(), "rotate")
    total = src.numel()
    if total == 0:
        return dst
    cut = (total - shift % total) % total  # src[cut:] lands at the front of dst
    dst[: total - cut].copy_(src[cut:])
    dst[total - cut :].copy_(src[:cut])
    return dst
