"""Mismatch detection: before a checked collective, the ranks agree on what is being called.

Calling different collectives, sizes, dtypes, ops or algorithms at the same point of the sequence is the
classic way to hang a job or silently corrupt its data. With checking on (``PCCL_DEBUG=check``), every rank
all-gathers a 6-integer signature of its call over MPI (one small collective, ~tens of microseconds) and
every rank raises the same :class:`~pccl_torch.errors.PcclMismatchError` naming the ranks and the fields
that differ, before any data moves.
"""

from __future__ import annotations

import zlib
from functools import cache
from typing import TYPE_CHECKING, NamedTuple

import torch

from pccl_torch.algorithms import COLLECTIVES
from pccl_torch.errors import PcclMismatchError
from pccl_torch.ops import SUPPORTED_DTYPES, ReduceOp
from pccl_torch.plan import valid_names

if TYPE_CHECKING:
    from pccl_torch.communicator import Communicator

FIELDS = ("sequence", "collective", "algorithm", "dtype", "numel", "op")
_OPS = ("none", *(op.value for op in ReduceOp))


def _crc(name: str) -> int:
    return zlib.crc32(name.encode())


@cache
def _algorithm_names() -> dict[int, str]:
    return {_crc(name): name for c in COLLECTIVES for name in valid_names(c)}


class Signature(NamedTuple):
    """What one rank is about to call: the fields every rank must agree on. (A NamedTuple: every call
    builds one, and a frozen dataclass costs 5x more to build.)"""

    collective: str
    algorithm: str
    dtype: torch.dtype
    numel: int
    """Elements of the full buffer (all-gather output, reduce-scatter input, all-reduce buffer)."""
    op: str = "none"

    def encode(self, sequence: int) -> torch.Tensor:
        return torch.tensor([sequence, COLLECTIVES.index(self.collective), _crc(self.algorithm),
                             SUPPORTED_DTYPES.index(self.dtype), self.numel, _OPS.index(self.op)], dtype=torch.int64)


def _decode(row: list[int]) -> dict[str, object]:
    """A signature row as readable values (unknown codes shown as numbers)."""
    def pick(table, i):
        return table[i] if 0 <= i < len(table) else i
    return {
        "sequence": row[0],
        "collective": pick(COLLECTIVES, row[1]),
        "algorithm": _algorithm_names().get(row[2], row[2]),
        "dtype": str(pick(SUPPORTED_DTYPES, row[3])).removeprefix("torch."),
        "numel": row[4],
        "op": pick(_OPS, row[5]),
    }


def describe(rows: list[list[int]]) -> str:
    """Which fields differ, and each group of ranks with the values it called with."""
    decoded = [_decode(row) for row in rows]
    differing = [f for f in FIELDS if len({str(d[f]) for d in decoded}) > 1]
    groups: dict[str, list[int]] = {}
    for rank, d in enumerate(decoded):
        groups.setdefault(", ".join(f"{f}={d[f]}" for f in FIELDS), []).append(rank)
    calls = "; ".join(f"ranks {ranks}: {call}" for call, ranks in groups.items())
    return f"ranks called different collectives (fields that differ: {', '.join(differing)}): {calls}"


def agree(comm: "Communicator", signature: Signature, sequence: int) -> None:
    """All-gather every rank's signature; raise :class:`PcclMismatchError` on every rank if any differs."""
    mine = signature.encode(sequence).reshape(-1)
    rows = torch.empty(comm.topology.world_size, mine.numel(), dtype=torch.int64)
    comm.control.native_all_gather(rows.view(-1), mine)
    if bool((rows != mine).any()):
        raise PcclMismatchError(f"pccl {signature.collective} #{sequence} not run: {describe(rows.tolist())}")


def agree_splits(comm: "Communicator", send_counts: tuple[int, ...], recv_counts: tuple[int, ...]) -> None:
    """All-gather every rank's all-to-all counts; raise :class:`PcclMismatchError` on every rank where a rank's
    count for a peer is not the peer's count from it (the data would be cut short or hang)."""
    p = comm.topology.world_size
    mine = torch.tensor([*send_counts, *recv_counts], dtype=torch.int64)
    table = torch.empty(p * 2 * p, dtype=torch.int64)
    comm.control.native_all_gather(table, mine)
    rows = table.view(p, 2 * p).tolist()
    wrong = [(i, j) for i in range(p) for j in range(p) if rows[i][j] != rows[j][p + i]]
    if wrong:
        shown = "; ".join(f"rank {i} sends rank {j} {rows[i][j]} elements but rank {j} expects {rows[j][p + i]} "
                          f"from it" for i, j in wrong[:4])
        more = f" (and {len(wrong) - 4} more pairs)" if len(wrong) > 4 else ""
        senders = sorted({i for i, _ in wrong})
        raise PcclMismatchError(f"pccl all_to_all not run: split sizes disagree across ranks: ranks {senders} "
                                f"send what their peers do not expect: {shown}{more}; rank i's "
                                "input_split_sizes[j] must equal rank j's output_split_sizes[i]")
