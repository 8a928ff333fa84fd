"""The watchdog of blocking MPI calls (``PCCL_WAIT=blocking``; ``auto``, the default, where every rank has a core).

MPI's blocking collectives are the fastest way to run a small collective (MPICH's ``MPI_Allgather`` of
1-16 KiB took 90-120 us on the 4-rank testbed where the non-blocking ``MPI_Iallgather`` polled to completion
took 160-210 us), but a blocking call cannot time out. As NCCL's watchdog does for PyTorch, a daemon thread
watches every blocking call: when one outlives the communicator's timeout, or the launcher reports a failed
process, it prints what was stuck and aborts the MPI job (``MPI_Abort``: ``mpiexec`` then ends every rank),
so a dead or missing rank never hangs the others. ``PCCL_WAIT=bounded`` keeps every wait non-blocking and
polled instead: slower for small messages, but each survivor raises ``PcclTimeoutError`` and can go on.

Arming costs a clock read and a dict store: the thread never touches the caller's path.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time

from pccl_torch import failure_notice

_TICK_S = 0.1
_ABORT_GRACE_S = 2.0
_watched: dict[int, tuple[float, float, str]] = {}
"""token -> (deadline, start, what) of every blocking call in progress in this process."""
_tokens = itertools.count()
_thread: threading.Thread | None = None
_lock = threading.Lock()


def arm(timeout_s: float, what: str) -> int:
    """Watch a blocking call named ``what`` for ``timeout_s`` seconds; returns the token for :func:`disarm`."""
    if _thread is None:
        _start()
    token = next(_tokens)
    now = time.monotonic()
    _watched[token] = (now + timeout_s, now, what)
    return token


def disarm(token: int) -> None:
    """The call of ``token`` returned."""
    _watched.pop(token, None)


def _start() -> None:
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_watch, name="pccl-watchdog", daemon=True)
            _thread.start()


def _watch() -> None:
    while True:
        time.sleep(_TICK_S)
        now = time.monotonic()
        for deadline, start, what in list(_watched.values()):
            if now >= deadline:
                _abort(f"{what} did not complete within {deadline - start:g} s: a peer died, hangs, or never "
                       "made this call")
            if failure_notice.reported():
                _abort(f"{what} was waiting when mpiexec reported a failed process")


def _abort(reason: str) -> None:
    """Say what happened and end the whole job (the blocked call can neither return nor raise)."""
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "?"
    sys.stderr.write(f"pccl (rank {rank}): {reason}. Aborting the MPI job (PCCL_WAIT=blocking; "
                     "PCCL_WAIT=bounded makes each rank raise PcclTimeoutError instead).\n")
    sys.stderr.flush()
    # MPI_Abort may itself wait on a launcher that is already gone (mpiexec -disable-auto-cleanup after a
    # failure): leave after a grace period whatever it does.
    threading.Timer(_ABORT_GRACE_S, os._exit, (1,)).start()
    try:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
    finally:
        os._exit(1)
