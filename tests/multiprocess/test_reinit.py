"""``pccl_torch.init()`` after ``pccl_torch.shutdown()`` in one process (``reinit_driver.py``: three rounds of init,
an exact all-reduce, shutdown). Under torchrun the rendezvous store is the agent's and outlives the default group
that ``shutdown()`` destroys; a second default group made with torch's own names read the first group's stale
gloo addresses and hung (``torchrun --nnodes 2``: every time). Every rank's result and the exit status checked."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from .conftest import HERE, ROOT, check_exit, collect_ranks, launch_ranks, launcher_environment
from .rank_result import RESULT_DIR_ENV

CYCLES = 3


def _check(ranks: list[dict], topology: list[int], transport: str) -> None:
    for rank, result in enumerate(ranks):
        assert result["torch_rank"] == rank
        rounds = result["rounds"]
        assert len(rounds) == CYCLES, rounds
        for r in rounds:
            assert r["sum_ok"] and r["topology"] == topology and r["transport"] == transport, (rank, r)
            assert not r["torch_initialized_after_shutdown"], (rank, r)  # init() made the group, shutdown() ended it


@pytest.mark.multiprocess
def test_init_after_shutdown_under_torchrun_on_two_nodes(tmp_path) -> None:
    """`torchrun --nnodes 2` (static rendezvous on 127.0.0.1, 2 ranks a node), where the second init() failed
    (before: gloo connecting to the destroyed group's addresses, "Connection refused" or a hang). One node's
    torchrun passed before too, by luck of timing: the two-node launch is the one that shows it."""
    results = tmp_path / "ranks"
    results.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                                "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
                                str(HERE / "reinit_driver.py"), "--cycles", str(CYCLES)],
                               cwd=ROOT, env=launcher_environment(env={RESULT_DIR_ENV: str(results)}),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for node in (0, 1)]
    try:
        outputs = [agent.communicate(timeout=240) for agent in agents]
    except subprocess.TimeoutExpired:
        for agent in agents:
            agent.kill()
        pytest.fail("torchrun --nnodes 2 did not finish in 240 s (hang?)")
    processes = [subprocess.CompletedProcess(agent.args, agent.returncode, out, err)
                 for agent, (out, err) in zip(agents, outputs)]
    check_exit(processes[1], "torchrun node 1")
    run = collect_ranks(processes[0], 4, results, what="torchrun --nnodes 2 (node 0)")
    _check(run.ranks, [4, 2, 2], "torch:gloo")


@pytest.mark.multiprocess
def test_init_after_shutdown_under_mpiexec(tmp_path) -> None:
    run = launch_ranks("reinit_driver.py", 3, "--cycles", str(CYCLES), result_dir=tmp_path / "ranks", timeout_s=240)
    _check(run.ranks, [3, 1, 3], "mpi")
