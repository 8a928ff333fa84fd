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

A Python signal handler runs on the main thread between bytecodes, so while that thread is blocked inside MPI's
blocking collective (``PCCL_WAIT=blocking``) the notice would reach nobody until the call returned, which it never
does. So ``install`` also points Python's signal wakeup fd at a pipe (where nobody else, an event loop say, holds it):
the interpreter's C-level handler writes the signal's number there at once, and the watchdog thread reads it
(:func:`noticed`). Under load the blocking kill trials otherwise ended at the 3 s timeout, not at the notice.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable

ENV = "PCCL_FAILURE_SIGNAL"
_noticed_at: float | None = None
listeners: list[Callable[[], None]] = []
"""Called once, on the first notice (the flight recorder's dump: ``pccl_torch.trace_dump``), on whichever thread
saw it; an error in one is swallowed (a notice must never raise)."""
_wakeup_read: int | None = None
"""Read end of the signal wakeup pipe, when ``install`` could take the wakeup fd."""


def _record(signum: int, frame: object) -> None:
    global _noticed_at
    if _noticed_at is None:
        _noticed_at = time.monotonic()
        for listener in list(listeners):
            with contextlib.suppress(Exception):
                listener()


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
    _take_wakeup_fd()
    return True


def _take_wakeup_fd() -> None:
    """Point the signal wakeup fd at a pipe of ours, unless someone else already holds it (then give it back)."""
    global _wakeup_read
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        previous = None
    if previous == -1:
        _wakeup_read = read_fd  # both ends stay open for the life of the process
        return
    if previous is not None:
        signal.set_wakeup_fd(previous)
    os.close(read_fd)
    os.close(write_fd)


def _ignore_from_now_on() -> None:
    """At exit (before MPI is finalized): a late notice can change nothing, and must not kill the rank."""
    if signal.getsignal(signal.SIGUSR1) is _record:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def reported() -> bool:
    """True once the launcher reported that a process of the job failed (as seen by the main thread)."""
    return _noticed_at is not None


def noticed() -> bool:
    """:func:`reported`, from any thread: also reads the signal numbers the wakeup pipe holds, so a notice counts
    while the main thread is blocked in C (one ``read`` a call: for the watchdog's tick, not for a polling loop)."""
    if _noticed_at is None and _wakeup_read is not None:
        try:
            while data := os.read(_wakeup_read, 256):
                if signal.SIGUSR1 in data:
                    _record(signal.SIGUSR1, None)
        except OSError:  # BlockingIOError: drained
            pass
    return _noticed_at is not None
