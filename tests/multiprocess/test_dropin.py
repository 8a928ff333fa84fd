"""The ``pccl`` backend as a drop-in (issues 33 and 36): ``init_process_group`` with no init_method under mpiexec,
``python -m pccl_torch.run`` forcing pccl on a gloo script under mpiexec and torchrun, every dtype and op a gloo
group accepts, and the FSDP adapter's errors at the call. One launch per case, every rank's result and the
launch's exit status checked (``dropin_driver.py``)."""

from __future__ import annotations

import sys

import pytest

from .conftest import HERE, RankLaunch, collect_ranks, launch_ranks, launcher_environment, run_checked
from .rank_result import RESULT_DIR_ENV

DRIVER = str(HERE / "dropin_driver.py")
DROP_IN_CHECKS = {
    "all_reduce on the default group", "all_reduce: every dtype and op gloo accepts",
    "all_gather, reduce_scatter: every dtype gloo accepts", "all_reduce: layouts pccl does not take",
    "PREMUL_SUM with a factor", "other collectives", "the same calls again",
    "bypasses counted and logged once per kind", "fsdp: fully_shard without init raises at the call",
    "fsdp: use_pccl on a plain module raises TypeError", "fsdp: communicator by the tensors' device",
    "fsdp: fully_shard over the pccl group",
}


def _passed(run: RankLaunch, checks: set[str]) -> None:
    for rank, result in enumerate(run.ranks):
        assert result["failures"] == [], f"rank {rank}:\n" + "\n".join(result["failures"])
        assert set(result["passed"]) == checks, f"rank {rank} ran {result['passed']}"
        assert result["torch_rank"] == rank and result["world_size"] == len(run.ranks), result


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["pccl", "gloo", "cpu:gloo,cuda:pccl"])
def test_init_process_group_without_init_method_under_mpiexec(backend: str, tmp_path) -> None:
    """`dist.init_process_group(backend)` as a torchrun script calls it, under `mpiexec -n 3` (no RANK, WORLD_SIZE,
    MASTER_ADDR or MASTER_PORT): rank, size and rendezvous from MPI, and an all-reduce on the default group."""
    run = launch_ranks("dropin_driver.py", 3, "--backend", backend, result_dir=tmp_path / "ranks", timeout_s=300)
    _passed(run, {"all_reduce on the default group"})
    for result in run.ranks:
        assert result["backend"] == backend and not result["had_rank"], result


@pytest.mark.multiprocess
def test_the_pccl_backend_takes_everything_a_gloo_group_does(tmp_path) -> None:
    """On 3 ranks: every dtype and op a gloo group accepts gives gloo's result on the pccl group, what pccl does not
    implement is counted per kind (`bypassed`) and logged once per kind, PREMUL_SUM multiplies by its factor,
    other collectives work, and the FSDP adapter fails at the call where pccl cannot serve it."""
    run = launch_ranks("dropin_driver.py", 3, "--drop-in", result_dir=tmp_path / "ranks", timeout_s=600)
    _passed(run, DROP_IN_CHECKS)
    for result in run.ranks:
        assert result["bypassed"]["allreduce:dtype uint8"] > 0 and result["bypassed"]["allreduce:op BAND"] > 0
        assert "allreduce:dtype float32" not in result["bypassed"]


def _forced(run: RankLaunch) -> None:
    """Every rank of a gloo script run by `python -m pccl_torch.run` got pccl, said so, and ran its all-reduce."""
    _passed(run, {"all_reduce on the default group"})
    for result in run.ranks:
        assert result["backend"] == "pccl" and result["group"] == "PcclProcessGroup", result
        assert result["calls"].get("all_reduce", 0) >= 1, result["calls"]
        assert result["switched"] == ["pccl_torch.run: init_process_group(backend='gloo') runs with backend 'pccl'"]


@pytest.mark.multiprocess
def test_run_forces_pccl_on_a_gloo_script_under_mpiexec(tmp_path) -> None:
    run = launch_ranks("-m", 3, "pccl_torch.run", DRIVER, "--backend", "gloo", result_dir=tmp_path / "ranks",
                       timeout_s=300)
    _forced(run)


@pytest.mark.multiprocess
def test_run_forces_pccl_on_a_gloo_script_under_torchrun(tmp_path) -> None:
    results = tmp_path / "ranks"
    results.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "pccl_torch.run", DRIVER, "--backend", "gloo"]
    process = run_checked(command, launcher_environment(env={RESULT_DIR_ENV: str(results)}), 300)
    _forced(collect_ranks(process, 2, results, what="torchrun -m pccl_torch.run"))
