"""What every launched rank writes last: its own result, one JSON file per rank, read by
``conftest.collect_ranks`` (which also checks the launch's exit status, so a rank that crashed, or died in
its teardown, fails the test instead of hiding behind rank 0's summary).

A rank writes after its teardown (``pc.shutdown()``, ``destroy_process_group()``): the file exists only
if that returned. Nothing is written when ``PCCL_TEST_RESULT_DIR`` is unset (a run by hand)."""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path

RESULT_DIR_ENV = "PCCL_TEST_RESULT_DIR"


def launched_rank() -> int:
    """This process's rank from the launcher's variables (MPICH, Open MPI, torchrun), else MPI's."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


def write(result: dict, rank: int | None = None) -> Path | None:
    """Write ``result`` (plus ``"rank"``) to ``$PCCL_TEST_RESULT_DIR/rank<r>.json`` atomically."""
    directory = os.environ.get(RESULT_DIR_ENV)
    if not directory:
        return None
    rank = launched_rank() if rank is None else rank
    path = Path(directory) / f"rank{rank}.json"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({**result, "rank": rank}))
    temporary.replace(path)
    return path


class Checks:
    """A rank's checks: each runs, counts as passed or records its failure with a traceback, and the rank goes on
    to the next one (every rank runs every collective, so one wrong result does not hang the others)."""

    def __init__(self, rank: int = 0, *, frames: int = 3) -> None:
        self.rank, self.passed, self.failures, self._frames = rank, 0, [], frames

    def check(self, name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
            self.passed += 1
        except Exception:  # recorded with its traceback; the rank goes on to the next check
            self.failures.append(f"{name}: {traceback.format_exc(limit=self._frames)}")
