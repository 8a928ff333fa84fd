"""One rank of a flight-recorder trial (run by ``test_trace.py`` under ``mpiexec -disable-auto-cleanup -n 4``,
``PCCL_LOCAL_SIZE=2``, ``PCCL_WAIT=bounded``, ``PCCL_TRACE_DIR`` set).

Kinds: ``late`` (after a few hierarchical all-reduces the last rank sleeps past the timeout before the next one:
the others time out and dump; the late rank dumps on the launcher's failure notice, before it ever makes the
call), ``mismatch`` (with checking on, the last rank's all-reduce has other sizes: every rank catches
``PcclMismatchError`` and calls ``pccl_torch.dump_trace()``). Each rank writes ``rank<r>.json`` with what it saw.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import torch

import pccl_torch as pc
from pccl_torch.errors import PcclError

WARM_CALLS = 3
"""Calls every rank completes before the faulty one (its number is ``WARM_CALLS + 1``)."""


def late(comm: pc.Communicator, victim: int, timeout_s: float) -> dict:
    for _ in range(WARM_CALLS):
        pc.all_reduce(torch.ones(4096), algorithm="hier:ring")
    if comm.topology.rank == victim:
        time.sleep(timeout_s + 3)  # alive but late: the others give up, then the launcher's notice comes
    try:
        pc.all_reduce(torch.ones(4096), algorithm="hier:ring")
        return {"error": None}
    except PcclError as exc:
        return {"error": str(exc), "type": type(exc).__name__}


def mismatch(comm: pc.Communicator, victim: int) -> dict:
    for _ in range(WARM_CALLS):
        pc.all_reduce(torch.ones(1024))
    try:
        pc.all_reduce(torch.ones(1000 if comm.topology.rank == victim else 1024))
        seen = {"error": None}
    except PcclError as exc:
        seen = {"error": str(exc), "type": type(exc).__name__}
    seen["dump"] = str(pc.dump_trace())
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=("late", "mismatch"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args()
    comm = pc.init(timeout=datetime.timedelta(seconds=args.timeout), check=args.kind == "mismatch")
    rank, victim = comm.topology.rank, comm.topology.world_size - 1
    seen = late(comm, victim, args.timeout) if args.kind == "late" else mismatch(comm, victim)
    (args.out / f"rank{rank}.json").write_text(json.dumps(seen))
    pc.shutdown()


if __name__ == "__main__":
    main()
