"""The launcher's notice that a process of the job failed, so waits end at once instead of at the timeout.

MPICH's ``mpiexec -disable-auto-cleanup`` keeps the other ranks running when one dies and sends each of
them ``SIGUSR1`` (whose default action would kill them silently). pccl records the notice instead, and a
transport waiting on a peer then gives up at once with a clear error (polling MPI on, after a peer died,
can make MPICH abort the whole job before the error is reported). Without that flag
``mpiexec`` kills the whole job as soon as one rank dies, which never hangs either. The handler is installed
only over the default disposition (an application's own handler is left alone), from the main thread, and
not at all with ``PCCL_FAILURE_SIGNAL=0``.

At interpreter exit the notice is ignored from then on: Hydra also sends ``SIGUSR1`` to the ranks still tearing
down after ``MPI_Finalize`` when another rank of the job exits first, and Python restores the default disposition
(death by the signal) for the handlers it set before MPI is finalized, so a rank that finished its work would be
reported killed by signal 10 (seen in one launch in three of the 4-rank mismatch trials).
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time

ENV = "PCCL_FAILURE_SIGNAL"
_noticed_at: float | None = None


def _record(signum: int, frame: object) -> None:
    global _noticed_at
    if _noticed_at is None:
        _noticed_at = time.monotonic()


def install() -> bool:
    """Handle ``SIGUSR1`` as the failure notice when nobody else does; True when installed (or already)."""
    if os.environ.get(ENV, "1") == "0" or threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGUSR1)
    if current is _record:
        return True
    if current is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGUSR1, _record)
    atexit.register(_ignore_from_now_on)
    return True


def _ignore_from_now_on() -> None:
    """At exit (before MPI is finalized): a late notice can change nothing, and must not kill the rank."""
    if signal.getsignal(signal.SIGUSR1) is _record:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def reported() -> bool:
    """True once the launcher reported that a process of the job failed."""
    return _noticed_at is not None
