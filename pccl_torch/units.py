"""Byte sizes as people write them on command lines: ``4K``, ``16M``, ``1G``, ``1.5KiB``, ``512``."""

from __future__ import annotations

import argparse
import re

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """``"4K"`` -> 4096 (binary multiples, as nccl-tests); ``ValueError`` naming the accepted forms."""
    if isinstance(text, int):
        return text
    match = _PATTERN.match(text)
    if not match:
        raise ValueError(f"cannot read size {text!r}: expected a number with an optional K, M, G or T suffix")
    return int(float(match.group(1)) * _SUFFIX[match.group(2).upper()])


def size_argument(text: str) -> int:
    """``parse_size`` for argparse's ``type=``: a bad size is a usage error naming the accepted forms."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_size_range(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``-b/-e/-f`` as ``size_range`` takes them, else a usage error (exit 2) saying what is wrong."""
    try:
        size_range(args.minbytes, args.maxbytes, args.stepfactor)
    except ValueError as exc:
        parser.error(str(exc))


def size_list_argument(text: str) -> list[int]:
    """A comma list of sizes (``1M,16M``) for argparse's ``type=``."""
    return [size_argument(part) for part in text.split(",") if part.strip()]


def format_size(nbytes: int) -> str:
    """4096 -> ``"4K"``; exact binary multiples only, else the plain number."""
    for suffix in ("T", "G", "M", "K"):
        unit = _SUFFIX[suffix]
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)


def size_range(minbytes: int, maxbytes: int, factor: float) -> list[int]:
    """``minbytes, minbytes * factor, ...`` up to ``maxbytes`` (nccl-tests' -b/-e/-f)."""
    if minbytes <= 0 or maxbytes < minbytes or factor <= 1:
        raise ValueError(f"need 0 < minbytes <= maxbytes and factor > 1, got {minbytes}, {maxbytes}, {factor}")
    sizes, size = [], float(minbytes)
    while size <= maxbytes:
        sizes.append(int(size))
        size *= factor
    return sizes
