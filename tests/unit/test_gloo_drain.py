"""``drain_gloo_workers``: at exit, wait while a gloo worker thread still runs (one that may yet take the GIL to
drop a tensor's Python object), and not at all while they wait for work."""

from __future__ import annotations

import ctypes
import datetime
import sys
import threading
import time

import pytest
import torch.distributed as dist

from pccl_torch.gloo_exit import GLOO_WORKER, TASKS, _gloo_workers, drain_gloo_workers

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not TASKS.is_dir(), reason="reads /proc")


def _named_thread(seconds: float, started: threading.Event) -> threading.Thread:
    """A thread named as gloo's workers, busy in Python for ``seconds``."""

    def run() -> None:
        ctypes.CDLL(None).prctl(15, GLOO_WORKER.encode())  # PR_SET_NAME: this thread's name in /proc
        started.set()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(5)
    return thread


def test_no_gloo_workers_no_wait() -> None:
    start = time.monotonic()
    assert drain_gloo_workers()
    assert time.monotonic() - start < 0.05


def test_idle_workers_of_a_gloo_group_end_the_wait_at_once(tmp_path) -> None:
    group = dist.ProcessGroupGloo(dist.FileStore(str(tmp_path / "store"), 1), 0, 1, datetime.timedelta(seconds=30))
    named_by = time.monotonic() + 5.0  # a worker names itself once it runs: on a loaded machine, some time after start
    while len(_gloo_workers()) < 2 and time.monotonic() < named_by:
        time.sleep(0.01)
    assert len(_gloo_workers()) >= 2, "torch 2.13 names gloo's worker threads pt_gloo_runloop"
    start = time.monotonic()
    assert drain_gloo_workers()
    assert time.monotonic() - start < 0.5
    del group


def test_a_running_worker_is_waited_for() -> None:
    thread = _named_thread(0.3, threading.Event())
    start = time.monotonic()
    assert drain_gloo_workers(timeout_s=5.0)
    assert time.monotonic() - start >= 0.25  # it waited for the busy thread
    thread.join()


def test_the_wait_is_bounded() -> None:
    thread = _named_thread(1.5, threading.Event())
    start = time.monotonic()
    assert not drain_gloo_workers(timeout_s=0.3)
    assert 0.3 <= time.monotonic() - start < 1.2
    thread.join()
