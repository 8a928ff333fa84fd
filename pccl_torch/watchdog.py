"""The watchdog of blocking MPI calls (``PCCL_WAIT=blocking``; ``auto``, the default, where every rank has a core).

MPI's blocking collectives are the fastest way to run a small collective (MPICH's ``MPI_Allgather`` of
1-16 KiB took 90-120 us on the 4-rank testbed where the non-blocking ``MPI_Iallgather`` polled to completion
took 160-210 us), but a blocking call cannot time out. As NCCL's watchdog does for PyTorch, a daemon thread
watches every blocking call: when one outlives the communicator's timeout, or the launcher reports a failed
process, it prints what was stuck and aborts the MPI job (``MPI_Abort``: ``mpiexec`` then ends every rank),
so a dead or missing rank never hangs the others. ``PCCL_WAIT=bounded`` keeps every wait non-blocking and
polled instead: slower for small messages, but each survivor raises ``PcclTimeoutError`` and can go on.

Arming costs a clock read and an attribute store (:class:`Watch`): the thread never touches the caller's path.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref

from pccl_torch import failure_notice, trace_dump

_TICK_S = 0.1
_ABORT_GRACE_S = 2.0
_thread: threading.Thread | None = None
_lock = threading.Lock()


class Watch:
    """The watch of one kind of blocking call (a transport's all-reduce, say): :attr:`since` is set to
    ``time.perf_counter()`` before the call and to 0.0 after it, one attribute store each, so a call bound once
    (``pccl_torch.calls``) pays ~0.1 us for its watch; the thread reads every live watch each tick."""

    __slots__ = ("since", "timeout_s", "what", "__weakref__")

    def __init__(self, timeout_s: float, what: str) -> None:
        self.since = 0.0
        """``time.perf_counter()`` when the watched call started; 0.0 while none is in progress."""
        self.timeout_s = timeout_s
        self.what = what
        _watches.add(self)
        if _thread is None:
            _start()


_watches: weakref.WeakSet[Watch] = weakref.WeakSet()


def _start() -> None:
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_watch, name="pccl-watchdog", daemon=True)
            _thread.start()


def _watch() -> None:
    while True:
        time.sleep(_TICK_S)
        now = time.perf_counter()
        waiting = [(watch, since) for watch in list(_watches) if (since := watch.since)]
        if waiting and failure_notice.noticed():  # one look at the notice a tick, however many calls wait
            _abort(f"{waiting[0][0].what} was waiting when mpiexec reported a failed process")
        for watch, since in waiting:
            if now - since >= watch.timeout_s:
                _abort(f"{watch.what} did not complete within {watch.timeout_s:g} s: a peer died, hangs, or never "
                       "made this call")


def _abort(reason: str) -> None:
    """Say what happened and end the whole job (the blocked call can neither return nor raise)."""
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "?"
    sys.stderr.write(f"pccl (rank {rank}): {reason}. Aborting the MPI job (PCCL_WAIT=blocking; "
                     "PCCL_WAIT=bounded makes each rank raise PcclTimeoutError instead).\n")
    sys.stderr.flush()
    trace_dump.dump_on_failure(f"watchdog: {reason}")
    # MPI_Abort may itself wait on a launcher that is already gone (mpiexec -disable-auto-cleanup after a
    # failure): leave after a grace period whatever it does.
    threading.Timer(_ABORT_GRACE_S, os._exit, (1,)).start()
    try:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
    finally:
        os._exit(1)
