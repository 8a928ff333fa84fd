"""The flight recorder under real ``mpiexec`` launches (4 ranks, 2 emulated nodes x 2, ``PCCL_WAIT=bounded``):
the dumps every rank leaves, read by ``pccl-trace`` and by the analyzer torch ships (``fr_trace``, not a copy).
The killed-rank trial runs on the testbed (``pccl-testbed``: 2 network namespaces joined by shaped links), skipped
where network namespaces cannot be made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pccl_torch.testbed import TestbedConfig, mpiexec_command, run_environment

from .conftest import HERE, ROOT, bring_up_testbed, mpiexec, run_checked

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


KILL_PREFIX = "pccltestk"
KILL_RATE = "100mbit"
"""The links of the killed-rank trial: the driver's 8 MiB blocks take ~1.4 s to cross them (16 MiB each way a
link), so the victim, which dies 0.1 s into that phase, dies with data in flight."""
PER_NODE = 2


@pytest.fixture(scope="module")
def testbed() -> Iterator[TestbedConfig]:
    """The killed-rank trial's testbed, its own prefix, always removed after."""
    with bring_up_testbed(TestbedConfig(nodes=2, rate=KILL_RATE, prefix=KILL_PREFIX)) as config:
        yield config


def _peer(rank: int, level: str) -> int:
    """Who ``rank`` exchanges with on ``level`` with 2 nodes of 2: the other node's rank of its local rank
    (inter), or its node's other rank (intra)."""
    node, local = divmod(rank, PER_NODE)
    return (1 - node) * PER_NODE + local if level == "inter" else node * PER_NODE + (1 - local)


def test_rank_killed_in_the_inter_node_phase_is_named_by_the_survivors_dumps(testbed, tmp_path) -> None:
    """Issue 57's trial (c): across 2 testbed nodes, rank 3 SIGKILLs itself 0.1 s into the inter-node phase of a
    large ``hier:ring`` all-gather (its own recorder says when: ``trace_driver.py kill``). The survivors stop on
    mpiexec's failure notice (``-disable-auto-cleanup``), not at the 10 s timeout, and dump at that notice, before
    any error is raised: their dumps still name the phase and the peer each was waiting for, rank 3's inter-node
    peer (rank 1) naming rank 3. ``pccl-trace`` says so, and torch's analyzer reads the dumps, naming rank 3 as
    the rank without a dump.

    Rank 2, on rank 3's node, dumps only when it wins a race: hydra's proxy SIGKILLs every process of its node once
    one died by a signal (``-disable-auto-cleanup`` or not), at its next event, often before rank 2 has run its
    handler. So its dump is checked where it exists; ranks 0 and 1, on the other node, must dump."""
    dumps = tmp_path / "dumps"
    program = [sys.executable, str(HERE / "trace_driver.py"), "kill", "--out", str(tmp_path), "--timeout", "10"]
    command = mpiexec_command(testbed, ["-disable-auto-cleanup", *program], nprocs=RANKS, per_node=PER_NODE)
    env = {**run_environment(testbed), "PCCL_WAIT": "bounded", "PCCL_TRACE_DIR": str(dumps), "PYTHONPATH": str(ROOT)}
    env.pop("PCCL_ALGO", None)
    launch = run_checked(command, env, timeout_s=150)  # a survivor that hangs fails here
    output = f"exit {launch.returncode}\nstdout:\n{launch.stdout[-3000:]}\nstderr:\n{launch.stderr[-3000:]}"
    victim = tmp_path / "victim.json"
    assert victim.exists(), f"rank 3 never reached the inter-node phase of call #{LATE_CALL}\n{output}"
    assert json.loads(victim.read_text()) == {"seq": LATE_CALL, "phase": "pccl:inter:all_gather",
                                              "completed": False}, output
    dumped = sorted(int(p.name.removeprefix("pccl_trace_rank_")) for p in dumps.iterdir()) if dumps.exists() else []
    assert dumped in ([0, 1], [0, 1, 2]), output
    for result in tmp_path.glob("rank*.json"):  # hydra may end a survivor before it wrote one
        assert json.loads(result.read_text())["type"] == "PcclTimeoutError", result.read_text()

    data = json.loads(_tool("pccl_torch.trace_report", "--json", str(dumps)))
    assert set(data["reasons"].values()) == {"the launcher reported a failed process"}, data["reasons"]
    group = data["groups"]["0"]
    assert group["no_dump"] == sorted(set(range(RANKS)) - set(dumped)) and group["behind"] == {}, group
    for rank in dumped:
        where = group["per_rank"][str(rank)]["first_incomplete"]
        assert where is not None, group["per_rank"]
        assert (where["collective"], where["seq"], where["algorithm"], where["state"]) == (
            "all_gather", LATE_CALL, "hier:ring", "started"), where
        # Ranks 0 and 2 exchange with each other between nodes; one that got through first waits inside its node.
        assert where["level"] in ("inter", "intra") and where["phase"] == f"pccl:{where['level']}:all_gather", where
        assert where["peers"] == [_peer(rank, where["level"])], where
    peer_of_victim = group["per_rank"]["1"]["first_incomplete"]
    assert (peer_of_victim["phase"], peer_of_victim["level"], peer_of_victim["step"], peer_of_victim["peers"]) == (
        "pccl:inter:all_gather", "inter", -1, [3])  # step -1: hier:ring is not pipelined, the phase has no chunks
    assert group["waiting_on_no_dump"]["1"] == [3]
    report = _tool("pccl_torch.trace_report", str(dumps))
    assert f"no dump from rank(s) {group['no_dump']}" in report
    assert (f"rank 1: last completed all_gather #{LATE_CALL - 1}; first incomplete: all_gather #{LATE_CALL} "
            "(hier:ring) started, in phase pccl:inter:all_gather, waiting for rank(s) [3]") in report
    assert (f"WAITING: rank 1 waits for rank(s) [3], which left no dump (killed or dead), in all_gather #{LATE_CALL}, "
            "phase pccl:inter:all_gather") in report

    missing = set(range(RANKS)) - set(dumped)
    torch_says = _tool("torch.distributed.flight_recorder.fr_trace", "--allow-incomplete-ranks", str(dumps))
    assert f"missed FR dumps from ranks ({missing})" in torch_says, torch_says
    strict = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dumps)],
                            capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert strict.returncode != 0 and f"Missing dump files from ranks {missing}" in strict.stderr, strict.stderr[-2000:]
