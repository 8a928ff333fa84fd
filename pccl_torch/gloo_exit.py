"""At exit, wait while a gloo worker thread may still take the GIL: a workaround for an abort of torch 2.13's gloo.

A ``ProcessGroupGloo`` worker thread that drops the last reference to a tensor with a Python object (its finished
work's tensors) takes the GIL in the tensor's destructor. If the interpreter is finalizing by then, Python ends the
thread and the unwinding stops at the destructor's ``noexcept``: "terminate called without an active exception",
after the script had finished. Groups that outlive the script's own teardown (DeepSpeed's, which it holds past
``destroy_process_group``; the world group of a script that never destroys it, as the Hugging Face Trainer's; gloo's
``shutdown`` stops nothing in torch 2.13) still have their workers when the interpreter finalizes, and a worker
descheduled just before dropping its last work (seen under load on 2 shared cores) aborts the process. ``import
pccl_torch`` registers :func:`drain_gloo_workers` at exit (:func:`register`), so every run that uses pccl, over gloo
levels or beside gloo groups, waits for such a worker while the interpreter is whole.
"""

from __future__ import annotations

import atexit
import time
from pathlib import Path

GLOO_WORKER = "pt_gloo_runloop"
"""The name torch gives each worker thread of a ``ProcessGroupGloo`` (``c10::setThreadName``)."""
TASKS = Path("/proc/self/task")


def _gloo_workers() -> dict[str, tuple[str, str]]:
    """This process's gloo worker threads: thread id -> (scheduler state, ``schedstat``), from ``/proc``."""
    workers = {}
    try:
        tasks = list(TASKS.iterdir())
    except OSError:  # no /proc (not Linux): nothing to wait for
        return workers
    for task in tasks:
        try:
            if (task / "comm").read_text().strip() != GLOO_WORKER:
                continue
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            workers[task.name] = (state, (task / "schedstat").read_text())
        except (OSError, IndexError):  # the thread ended meanwhile
            continue
    return workers


def drain_gloo_workers(timeout_s: float = 2.0, quiet_s: float = 0.005) -> bool:
    """Wait, the GIL released, until no gloo worker thread of this process has run for ``quiet_s`` (none runnable,
    none scheduled in between), at most ``timeout_s``; returns whether they went quiet. Registered at exit.

    Workers waiting for work (or blocked in a collective) do not run and end the wait at once: a few
    milliseconds where gloo groups exist, nothing otherwise (the module docstring says why it waits)."""
    deadline = time.monotonic() + timeout_s
    before = _gloo_workers()
    quiet_since = time.monotonic()
    while before:
        time.sleep(0.001)
        now = _gloo_workers()
        if now != before or any(state in "RD" for state, _ in now.values()):
            quiet_since, before = time.monotonic(), now
        elif time.monotonic() - quiet_since >= quiet_s:
            return True
        if time.monotonic() >= deadline:
            return False
    return True


_registered = False


def register() -> None:
    """Register :func:`drain_gloo_workers` at exit, once a process."""
    global _registered
    if not _registered:
        _registered = True
        atexit.register(drain_gloo_workers)
