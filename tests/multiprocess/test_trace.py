"""The flight recorder under real ``mpiexec`` launches (4 ranks, 2 emulated nodes x 2, ``PCCL_WAIT=bounded``):
the dumps every rank leaves, read by ``pccl-trace`` and by the analyzer torch ships (``fr_trace``, not a copy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import HERE, ROOT, mpiexec

pytestmark = pytest.mark.multiprocess
RANKS = 4
LATE_CALL = 4
"""The faulty call's number: the driver's ``WARM_CALLS + 1``."""


def _launch(kind: str, out: Path) -> Path:
    dumps = out / "dumps"
    env = dict(os.environ, PCCL_WAIT="bounded", PCCL_TRACE_DIR=str(dumps), PYTHONPATH=str(ROOT))
    env.pop("PCCL_ALGO", None)
    subprocess.run([mpiexec(), "-disable-auto-cleanup", "-n", str(RANKS), "-env", "PCCL_LOCAL_SIZE", "2",
                    sys.executable, str(HERE / "trace_driver.py"), kind, "--out", str(out)],
                   env=env, timeout=120, capture_output=True, text=True)
    return dumps


def _launch_torchrun(kind: str, out: Path) -> Path:
    """The same trial under torchrun (levels over torch groups, no MPI): when the others fail, torchrun's agent
    ends the late rank with SIGTERM, on which it dumps."""
    dumps = out / "dumps"
    env = dict(os.environ, PCCL_WAIT="bounded", PCCL_TRACE_DIR=str(dumps), PYTHONPATH=str(ROOT), PCCL_LOCAL_SIZE="2")
    env.pop("PCCL_ALGO", None)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS),
                    str(HERE / "trace_driver.py"), kind, "--out", str(out)],
                   env=env, timeout=120, capture_output=True, text=True)
    return dumps


def _tool(*args: str) -> str:
    """Run a module under this interpreter; its whole output (it must succeed)."""
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_late_rank_is_named_by_both_tools(tmp_path) -> None:
    dumps = _launch("late", tmp_path)
    assert sorted(p.name for p in dumps.iterdir()) == [f"pccl_trace_rank_{r}" for r in range(RANKS)]
    report = _tool("pccl_torch.trace_report", str(dumps))
    assert f"BEHIND: rank 3 never started call #{LATE_CALL} (all_reduce #{LATE_CALL}, hier:ring)" in report
    assert "in phase pccl:" in report and "waiting for rank(s)" in report
    data = json.loads(_tool("pccl_torch.trace_report", "--json", str(dumps)))
    assert list(data["groups"]["0"]["behind"]) == ["3"]
    torch_says = _tool("torch.distributed.flight_recorder.fr_trace", str(dumps))
    assert f"Not all ranks joining collective, sequence number: {LATE_CALL}" in torch_says
    assert "missing ranks: {3}" in torch_says and "nccl:all_reduce" in torch_says


def test_late_rank_under_torchrun_dumps_on_sigterm_and_is_named_by_both_tools(tmp_path) -> None:
    """torchrun has no failure notice: the late rank's record comes from its SIGTERM handler (without it, torch's
    analyzer stops at 'Missing dump files from ranks {3}')."""
    dumps = _launch_torchrun("late", tmp_path)
    assert sorted(p.name for p in dumps.iterdir()) == [f"pccl_trace_rank_{r}" for r in range(RANKS)]
    report = _tool("pccl_torch.trace_report", str(dumps))
    assert f"BEHIND: rank 3 never started call #{LATE_CALL} (all_reduce #{LATE_CALL}, hier:ring)" in report
    torch_says = _tool("torch.distributed.flight_recorder.fr_trace", str(dumps))
    assert f"Not all ranks joining collective, sequence number: {LATE_CALL}" in torch_says
    assert "missing ranks: {3}" in torch_says


def test_mismatched_call_is_named_by_both_tools(tmp_path) -> None:
    dumps = _launch("mismatch", tmp_path)
    assert len(list(dumps.iterdir())) == RANKS
    report = _tool("pccl_torch.trace_report", str(dumps))
    assert f"MISMATCH at #{LATE_CALL}: rank 3 called all_reduce (mpi) Float in [[1000]]" in report
    torch_says = _tool("torch.distributed.flight_recorder.fr_trace", str(dumps))
    assert f"Collective sequence number: {LATE_CALL} has errors" in torch_says
    assert "SIZE_OR_SYNTAX_MISMATCH" in torch_says and "[[1000]]" in torch_says


SIGNAL_SCRIPT = """
import os, signal, sys, time
import torch
import pccl_torch as pc
pc.init()
for _ in range(3):
    pc.all_reduce(torch.ones(8))
os.kill(os.getpid(), signal.SIGUSR2)
deadline = time.monotonic() + 20
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
pc.shutdown()
"""


def test_a_signal_dumps_a_running_rank_without_stopping_it(tmp_path) -> None:
    """SIGUSR2 (``PCCL_TRACE_SIGNAL``) writes the rank's dump and the rank goes on: the file holds its 3 calls,
    completed (without the handler SIGUSR2 would end the process)."""
    dumps = tmp_path / "dumps"
    env = dict(os.environ, PCCL_TRACE_DIR=str(dumps), PYTHONPATH=str(ROOT))
    done = subprocess.run([mpiexec(), "-n", "1", sys.executable, "-c", SIGNAL_SCRIPT,
                           str(dumps / "pccl_trace_rank_0")], env=env, timeout=120, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    import pickle

    data = pickle.loads((dumps / "pccl_trace_rank_0").read_bytes())
    calls = [e for e in data["entries"] if e["profiling_name"] == "nccl:all_reduce"]
    assert len(calls) == 3 and all(e["state"] == "completed" for e in calls), data["entries"]
