"""What the command-line tools share: byte sizes as people write them (``4K``, ``16M``, ``1G``, ``1.5KiB``,
``512``), help text without reST markup, usage errors reported as argparse reports them, and text tables."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence

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


_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``|`([^`]+)`")


def plain(text: str) -> str:
    """``text`` (a docstring) without reST markup: roles as reST shows them (``:func:`~pkg.f``` -> ``f``), literals
    and interpreted text without their backticks."""
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return _LITERAL.sub(lambda m: m.group(1) or m.group(2), text)


def tool_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """The parser of a command-line tool described by its module docstring ``doc`` (shown as written, in plain text)."""
    return argparse.ArgumentParser(prog=prog, description=plain(doc), formatter_class=argparse.RawDescriptionHelpFormatter)


class UsageError(ValueError):
    """Input a tool cannot use, found after its arguments were parsed (reported by :func:`run_command`)."""


def usage_error(parser: argparse.ArgumentParser, error: Exception | str) -> int:
    """Report ``error`` as argparse reports a bad argument (the usage line, then ``<prog>: error: <message>``, on
    stderr) and return its exit status, 2."""
    parser.print_usage(sys.stderr)
    print(f"{parser.prog}: error: {error}", file=sys.stderr)
    return 2


def run_command(parser: argparse.ArgumentParser, command: Callable[[], int | None],
                errors: tuple[type[Exception], ...] = ()) -> int:
    """``command()``'s exit status (None: 0); a ``ValueError`` (bad input) or one of ``errors`` it raises is a
    usage error (:func:`usage_error`), not a traceback."""
    try:
        return command() or 0
    except (ValueError, *errors) as exc:
        return usage_error(parser, exc)


def table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> list[str]:
    """``header`` and ``rows`` as lines of columns two blanks apart, each as wide as its widest cell; ``align``
    has one ``<`` (left) or ``>`` (right) per column."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(f"{cell:{side}{width}}" for cell, side, width in zip(line, align, widths)).rstrip()
            for line in (header, *rows)]
