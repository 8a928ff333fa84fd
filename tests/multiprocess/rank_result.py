"""What every launched rank writes last: its own result, one JSON file per rank, read by
``conftest.collect_ranks`` (which also checks the launch's exit status, so a rank that crashed, or died in
its teardown, fails the test instead of hiding behind rank 0's summary).

A rank writes after its teardown (``pc.shutdown()``, ``destroy_process_group()``): the file exists only
if that returned. Nothing is written when ``PCCL_TEST_RESULT_DIR`` is unset (a run by hand)."""

from __future__ import annotations

import json
import os
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
