"""One rank of a fault trial (run by ``faults.py`` under ``mpiexec -disable-auto-cleanup -n 4``).

Kinds: ``kill`` (the last rank SIGKILLs itself in the middle of large all-reduces), ``skip`` (the last
rank never calls the collective), ``mismatch`` (with checking on, ranks call different collectives, sizes,
dtypes, ops or algorithms). Every rank writes what it saw to ``<out>/rank<r>.json``; the harness checks it.

What else each rank leaves in ``<out>``, so that the harness can tell how it ended (``faults.py``):
``rank<r>.started`` once its communicator is up; ``rank<r>.json`` when its call returned or raised (any
exception, with its type: only the expected one passes); ``rank<r>.done`` once ``shutdown()`` returned;
``rank<r>.crash`` with the traceback of any exception that escaped; ``rank<r>.fatal`` (faulthandler) with
the stacks of a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL); ``rank<r>.signal`` when it was
asked to stop (SIGTERM, SIGINT, SIGHUP). A rank with none of the last four and no ``.done`` was killed
outright (SIGKILL) or left through the MPI library's own exit.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

import pccl_torch as pc
from pccl_torch.errors import CommunicatorBrokenError, PcclMismatchError, PcclTimeoutError

KILL_AFTER_S = 0.5
LARGE = 4 << 20  # float32 elements: 16 MiB, several hundred ms per all-reduce on 4 ranks of 2 cores


def _record(out: Path, rank: int, **fields) -> None:
    (out / f"rank{rank}.json").write_text(json.dumps(fields))


def _after_failure(error: Exception, start: float) -> dict:
    """What a survivor reports: the error, when it came, and that the communicator now fails fast."""
    seen = {"error": str(error), "type": type(error).__name__, "elapsed_s": time.monotonic() - start}
    t = time.monotonic()
    try:
        pc.all_reduce(torch.ones(4))
        seen["after"] = "no error"
    except CommunicatorBrokenError as exc:
        seen["after"] = type(exc).__name__
    seen["after_s"] = time.monotonic() - t
    return seen


def kill(out: Path, rank: int, victim: int, algorithm: str | None) -> None:
    buf = torch.ones(LARGE)
    if rank == victim:
        threading.Timer(KILL_AFTER_S, os.kill, (os.getpid(), signal.SIGKILL)).start()
    start = time.monotonic()
    try:
        for _ in range(1000):
            pc.all_reduce(buf, algorithm=algorithm)
        _record(out, rank, error=None)
    except PcclTimeoutError as exc:
        _record(out, rank, **_after_failure(exc, start))
    except Exception as exc:  # noqa: BLE001 - any other error is recorded (and fails the trial), not hidden
        _record(out, rank, error=str(exc), type=type(exc).__name__, elapsed_s=time.monotonic() - start)


def skip(out: Path, rank: int, victim: int, algorithm: str | None, timeout_s: float) -> None:
    if rank == victim:
        time.sleep(timeout_s + 3)  # alive but not calling: the others must time out, not wait for it
    start = time.monotonic()
    try:
        pc.all_reduce(torch.ones(1024), algorithm=algorithm)
        _record(out, rank, error=None)
    except PcclTimeoutError as exc:  # the late rank fails too: its peers have given up and left
        _record(out, rank, **_after_failure(exc, start))
    except Exception as exc:  # noqa: BLE001 - recorded with its type: the harness fails the trial
        _record(out, rank, error=str(exc), type=type(exc).__name__, elapsed_s=time.monotonic() - start)


def _mismatches(rank: int, victim: int) -> list[tuple[str, callable]]:
    """(name, this rank's call) for each way of calling something different on the victim."""
    odd = rank == victim
    world = pc.default_communicator().topology.world_size

    def all_reduce(numel=1024, dtype=torch.float32, op="sum", algorithm=None):
        return lambda: pc.all_reduce(torch.ones(numel, dtype=dtype), op, algorithm=algorithm)

    def all_gather(numel=1024):
        return lambda: pc.all_gather_into_tensor(torch.empty(world * numel), torch.ones(numel))

    def all_to_all(recv, send):
        """Rank ``r`` sends ``send[j]`` rows to rank j and expects ``recv[i]`` from rank i (None: 2 each, no sizes)."""
        sends, recvs = send or [2] * world, recv or [2] * world
        return lambda: pc.all_to_all_single(torch.empty(sum(recvs)), torch.ones(sum(sends)), recv,
                                            send if send is not None else (None if recv is None else sends))

    return [
        ("collective", all_gather(256) if odd else all_reduce(world * 256)),
        ("numel", all_reduce(1000 if odd else 1024)),
        ("dtype", all_reduce(dtype=torch.float16 if odd else torch.float32)),
        ("op", all_reduce(op="max" if odd else "sum")),
        ("algorithm", all_reduce(algorithm="ring" if odd else "recursive_doubling")),
        ("collective+numel", all_reduce(7) if odd else all_gather(5)),
        ("numel-empty", all_reduce(0 if odd else 3)),
        ("dtype-int", all_reduce(dtype=torch.int32 if odd else torch.int64)),
        ("op-min", all_reduce(op="min" if odd else "max")),
        ("algorithm-hier", all_reduce(algorithm="mpi" if odd else "hier:ring")),
        ("all_to_all splits", all_to_all([2] * world, [3 if j == 0 else 2 for j in range(world)] if odd else None)),
        ("all_to_all sizes on one rank only", all_to_all([2] * world, [2] * world) if odd else all_to_all(None, None)),
    ]


def mismatch(out: Path, rank: int, victim: int) -> None:
    trials = []
    for name, call in _mismatches(rank, victim):
        start = time.monotonic()
        try:
            call()
            trials.append({"case": name, "error": None})
        except PcclMismatchError as exc:
            trials.append({"case": name, "error": str(exc), "type": type(exc).__name__,
                           "elapsed_s": time.monotonic() - start})
    buf = torch.full((64,), float(rank))
    pc.all_reduce(buf)  # a matching call afterwards still works: detection moved no data
    _record(out, rank, trials=trials, sound_after=bool((buf == sum(range(world_size()))).all()))


def world_size() -> int:
    return pc.default_communicator().topology.world_size


def _watch_the_end(out: Path, rank: int) -> None:
    """Leave evidence of how this process ends (see the module docstring)."""
    fatal = open(out / f"rank{rank}.fatal", "w")  # noqa: SIM115 - open until the process ends
    faulthandler.enable(file=fatal, all_threads=True)

    def asked_to_stop(signum, _frame) -> None:
        (out / f"rank{rank}.signal").write_text(signal.Signals(signum).name)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, asked_to_stop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=("kill", "skip", "mismatch"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--algorithm", default=None)
    args = parser.parse_args()
    launched = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
    if launched >= 0:
        _watch_the_end(args.out, launched)
    try:
        comm = pc.init(timeout=datetime.timedelta(seconds=args.timeout), check=args.kind == "mismatch")
        rank, victim = comm.topology.rank, comm.topology.world_size - 1
        if launched < 0:
            _watch_the_end(args.out, rank)
        comm.world.comm.Barrier()
        (args.out / f"rank{rank}.started").write_text("")
        if args.kind == "kill":
            kill(args.out, rank, victim, args.algorithm)
        elif args.kind == "skip":
            skip(args.out, rank, victim, args.algorithm, args.timeout)
        else:
            mismatch(args.out, rank, victim)
        start = time.monotonic()
        pc.shutdown()
    except BaseException:
        (args.out / f"rank{launched}.crash").write_text(traceback.format_exc())
        raise
    (args.out / f"rank{rank}.done").write_text(f"{time.monotonic() - start:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
