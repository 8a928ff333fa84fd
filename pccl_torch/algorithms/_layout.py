"""Shared geometry of the schedules: how a buffer splits into per-rank blocks, and the
non-power-of-two fold that lets recursive doubling/halving run on any rank count, and the regrouping of
blocks an all-to-all needs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from pccl_torch.triton_kernels import permute_blocks


@dataclass(frozen=True, slots=True)
class Blocks:
    """A flat buffer cut into ``len(counts)`` consecutive blocks, block ``i`` owned by rank ``i``."""

    counts: tuple[int, ...]
    offsets: tuple[int, ...]  # len(counts) + 1 entries; offsets[-1] is the total

    @classmethod
    def from_counts(cls, counts: list[int] | tuple[int, ...]) -> "Blocks":
        offsets = [0]
        for c in counts:
            offsets.append(offsets[-1] + c)
        return cls(tuple(counts), tuple(offsets))

    @staticmethod
    def even(num_blocks: int, count: int) -> "Blocks":
        """``num_blocks`` blocks of ``count`` elements (all-gather and reduce-scatter layouts); the same
        immutable object for the same arguments (every flat all-gather and reduce-scatter asks)."""
        return _even(num_blocks, count)

    @classmethod
    def balanced(cls, total: int, num_blocks: int) -> "Blocks":
        """``total`` elements over ``num_blocks`` blocks differing by at most one (all-reduce shards)."""
        base, extra = divmod(total, num_blocks)
        return cls.from_counts([base + (i < extra) for i in range(num_blocks)])

    @property
    def total(self) -> int:
        return self.offsets[-1]

    @property
    def max_count(self) -> int:
        return max(self.counts, default=0)

    def block(self, buf: torch.Tensor, i: int) -> torch.Tensor:
        """Block ``i`` of ``buf`` (a view)."""
        return buf[self.offsets[i] : self.offsets[i + 1]]

    def span(self, buf: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """Blocks ``first .. last - 1`` of ``buf`` as one contiguous view."""
        return buf[self.offsets[first] : self.offsets[last]]

    def rotated(self, shift: int) -> "Blocks":
        """The layout whose block ``i`` is this layout's block ``(i + shift) % p`` (Bruck's order)."""
        p = len(self.counts)
        return Blocks.from_counts([self.counts[(i + shift) % p] for i in range(p)])


@functools.lru_cache(maxsize=256)
def _even(num_blocks: int, count: int) -> Blocks:
    return Blocks.from_counts([count] * num_blocks)


@dataclass(frozen=True, slots=True)
class Fold:
    """Fold-in of ``p`` ranks onto the largest power of two ``pof2 <= p``.

    The first ``2 * rem`` ranks (``rem = p - pof2``) pair up: even rank ``2i`` stays active as virtual
    rank ``i`` and also stands for odd rank ``2i + 1``, which sits out the power-of-two phase. Ranks from
    ``2 * rem`` on are virtual rank ``r - rem``. Virtual ranks own consecutive original blocks, so any
    range of virtual ranks is one contiguous range of original blocks.
    """

    p: int
    pof2: int
    rem: int

    @classmethod
    def of(cls, p: int) -> "Fold":
        pof2 = 1 << (p.bit_length() - 1)
        return cls(p, pof2, p - pof2)

    def is_extra(self, rank: int) -> bool:
        """True for the odd ranks that sit out the power-of-two phase."""
        return rank < 2 * self.rem and rank % 2 == 1

    def has_extra(self, rank: int) -> bool:
        """True for the even ranks that stand for an extra rank (``rank + 1``)."""
        return rank < 2 * self.rem and rank % 2 == 0

    def virtual(self, rank: int) -> int:
        """Virtual rank of an active ``rank``."""
        return rank // 2 if rank < 2 * self.rem else rank - self.rem

    def first_rank(self, v: int) -> int:
        """The original rank (and block) that virtual rank ``v`` starts at; ``first_rank(pof2) == p``."""
        return 2 * v if v < self.rem else v + self.rem


def transpose_blocks(src: torch.Tensor, dst: torch.Tensor, sizes: list[list[int]]) -> torch.Tensor:
    """Write ``src``, consecutive blocks in order ``(i, j)`` with ``sizes[i][j]`` elements, into ``dst`` in order
    ``(j, i)`` (the regrouping of a hierarchical all-to-all). Equal blocks take the pack kernel
    (``permute_blocks``); uneven ones one concatenation of views. Returns ``dst``."""
    rows, cols = len(sizes), len(sizes[0]) if sizes else 0
    first = sizes[0][0] if rows and cols else 0
    if all(size == first for row in sizes for size in row):
        return permute_blocks(src, dst, rows, cols, first)
    offsets, start = [], 0
    for row in sizes:
        offsets.append([])
        for size in row:
            offsets[-1].append(start)
            start += size
    views = [src[offsets[i][j]:offsets[i][j] + sizes[i][j]] for j in range(cols) for i in range(rows)]
    return torch.cat(views, out=dst)
