"""The launcher's failure notice (``SIGUSR1``) reaches the watchdog thread while the main thread is blocked in C,
where a Python signal handler cannot run (``PCCL_WAIT=blocking``: MPI's blocking collective never returns)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# The main thread blocks SIGUSR1 and sleeps in libc, as a rank sits in MPI_Allreduce: the kernel hands the signal
# to the watcher thread, the interpreter's C-level handler runs there, and only the wakeup pipe carries the notice
# before the main thread's sleep ends. Run in a child: the signal disposition and wakeup fd are process-wide.
BLOCKED_MAIN_THREAD = textwrap.dedent("""
    import ctypes, os, signal, threading, time
    from pccl_torch import failure_notice

    assert failure_notice.install()
    seen = {}

    def watch():
        while not failure_notice.noticed():
            time.sleep(0.01)
        seen["noticed"] = time.monotonic()

    threading.Thread(target=watch, daemon=True).start()  # started before the mask: it takes the signal
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    start = time.monotonic()
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    ctypes.CDLL(None).sleep(2)  # blocked in C for 2 s, signal masked: no Python handler runs meanwhile
    back = time.monotonic()
    assert "noticed" in seen, "the watcher never noticed the signal while the main thread was in C"
    assert seen["noticed"] - start < 1.5 and seen["noticed"] < back, (seen, start, back)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    assert failure_notice.reported()
    print("ok")
""")

# An event loop (or any other library) that holds the wakeup fd keeps it: the notice then reaches Python code only.
SOMEONE_ELSES_WAKEUP_FD = textwrap.dedent("""
    import os, signal
    from pccl_torch import failure_notice

    read_fd, write_fd = os.pipe2(os.O_NONBLOCK)
    signal.set_wakeup_fd(write_fd)
    assert failure_notice.install()
    assert signal.set_wakeup_fd(-1) == write_fd, "install() took a wakeup fd it did not own"
    assert not failure_notice.noticed()
    print("ok")
""")


def _run(code: str) -> None:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PCCL_FAILURE_SIGNAL": "1"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_notice_reaches_the_watchdog_thread_while_the_main_thread_is_blocked_in_c() -> None:
    _run(BLOCKED_MAIN_THREAD)


def test_a_wakeup_fd_someone_else_holds_is_left_alone() -> None:
    _run(SOMEONE_ELSES_WAKEUP_FD)
