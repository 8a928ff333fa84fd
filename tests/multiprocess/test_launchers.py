"""pccl launched as users launch training: torchrun, DeepSpeed's own launcher and accelerate, with no mpiexec
(pccl's levels are then torch groups: ``pccl_torch.launcher``). The torch transport under mpiexec, every collective:
test_collectives_mpi.py's ``test_triton_interpreter_kernels_over_torch_groups_under_mpiexec``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pccl_torch.algorithms import COLLECTIVES

from .conftest import HERE, check_exit, collect_ranks, launcher_environment, run_checked, torchrun_ranks
from .rank_result import RESULT_DIR_ENV

KINDS = ("all_gather", "reduce_scatter", "all_reduce")


@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks,local_size", [(3, 1), (4, 2), (6, 3)], ids=["n3-L1", "n4-L2", "n6-L3"])
def test_torchrun_every_algorithm_ddp_and_fsdp2(ranks: int, local_size: int, tmp_path) -> None:
    """`torchrun` + `dist.init_process_group("pccl")`: every CPU algorithm against gloo (bitwise), each wire
    format, DDP and FSDP2 with clip_grad_norm_ giving gloo's losses, all through pccl over torch groups."""
    run = torchrun_ranks("launcher_driver.py", ranks, result_dir=tmp_path / "ranks", local_size=local_size,
                         env={"PCCL_PIPELINE_CHUNKS": "3"}, same=("topology",))  # pipelined plans in several chunks
    for r, entry in enumerate(run.ranks):  # exit status 0 and every rank's result, written after its teardown
        assert entry["failures"] == [] and entry["passed"] == 1, f"rank {r}: {entry['failures']}"
        assert set(entry["transport"]) == {"torch:gloo"}, entry["transport"]
        assert entry["topology"] == [ranks // local_size, local_size, 1]
        assert min(entry["calls"].get(kind, 0) for kind in KINDS) > 0, entry["calls"]
        assert entry["bypassed"] == {}


def _deepspeed_command(launcher: str, ranks: int, *args: str) -> list[str]:
    script = str(HERE / "deepspeed_driver.py")
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), script,
                *args]
    deepspeed = Path(sys.executable).parent / "deepspeed"
    if not deepspeed.exists():
        pytest.skip("DeepSpeed's launcher is not installed beside this Python")
    from .test_deepspeed import _free_port

    return [str(deepspeed), "--num_gpus", str(ranks), "--master_port", str(_free_port()), script, *args]


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_deepspeed_zero3_without_mpiexec(launcher: str, tmp_path) -> None:
    """ZeRO-3 with --comm_backend pccl under torchrun and under `deepspeed --num_gpus 4` (its local launcher, no
    --launcher mpich): gloo's losses and parameters, every AG/RS/AR through pccl over torch groups."""
    pytest.importorskip("deepspeed")
    from .test_deepspeed import EXTENSIONS, gloo_baseline

    def zero3(launcher: str, backend: str):  # deepspeed_driver.py writes every rank's result after its teardown
        results = tmp_path / f"{launcher}-{backend}"
        results.mkdir()
        command = _deepspeed_command(launcher, 4, "--comm_backend", backend, "--stages", "3")
        process = run_checked(command, launcher_environment(2, {**EXTENSIONS, RESULT_DIR_ENV: str(results)}), 900)
        return collect_ranks(process, 4, results, same=("default_group",), what=f"{launcher} {backend}")

    # gloo's run is the same whichever launcher started it (same seed, data and ranks): test_deepspeed's at 4 ranks
    # under mpiexec, launched once a session for it and both launchers here.
    gloo_ranks = gloo_baseline(4, tmp_path)
    for r, (pccl, gloo) in enumerate(zip(zero3(launcher, "pccl").ranks, gloo_ranks, strict=True)):
        assert pccl["default_group"] == "PcclProcessGroup", (r, pccl["default_group"])
        assert pccl["transport"] == {"torch:gloo": pccl["pccl_groups"]}, (r, pccl["transport"])
        assert min(pccl["stages"]["3"]["pccl_calls"].get(kind, 0) for kind in KINDS) > 0, (r, pccl["stages"]["3"])
        assert pccl["bypassed"] == {}, (r, pccl["bypassed"])
        assert pccl["stages"]["3"]["losses"] == pytest.approx(gloo["stages"]["3"]["losses"], rel=1e-5, abs=1e-6), r
        assert pccl["stages"]["3"]["params"] == pytest.approx(gloo["stages"]["3"]["params"], rel=1e-5, abs=1e-6), r


@pytest.mark.multiprocess
def test_accelerate_launch(tmp_path) -> None:
    """`accelerate launch` (which starts torchrun) with the process group made pccl before the Accelerator:
    gloo's losses, the prepared model's all-reduces through pccl."""
    pytest.importorskip("accelerate")
    accelerate = Path(sys.executable).parent / "accelerate"
    results = {}
    for backend in ("gloo", "pccl"):
        out = tmp_path / f"{backend}.json"
        command = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "4", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
                   str(HERE / "accelerate_driver.py"), "--backend", backend, "--json", str(out)]
        process = run_checked(command, launcher_environment(2), 600)
        check_exit(process, f"accelerate launch ({backend})")  # every rank, teardown included
        assert out.exists(), f"accelerate launch ({backend}) wrote no result:\n{process.stderr[-4000:]}"
        results[backend] = json.loads(out.read_text())  # rank 0's (accelerate_driver.py writes no per-rank result)
    assert results["pccl"]["default_group"] == "PcclProcessGroup"
    assert results["pccl"]["transport"] == {"torch:gloo": 1}
    assert results["pccl"]["calls"].get("all_reduce", 0) > 0, results["pccl"]["calls"]
    assert results["pccl"]["losses"] == pytest.approx(results["gloo"]["losses"], rel=1e-5, abs=1e-6)


@pytest.mark.multiprocess
def test_pccl_bench_under_torchrun(tmp_path) -> None:
    """pccl-bench run by torchrun (no MPI): results checked, every row over torch groups."""
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
               "-m", "pccl_torch.bench.cli", "-b", "4K", "-e", "256K", "-f", "8", "--backends", "pccl,gloo,pccl:all",
               "--iters", "2", "--warmup", "1", "--check", "--no-progress", "--json", str(out)]
    result = run_checked(command, launcher_environment(2), 600)
    check_exit(result, "pccl-bench under torchrun")  # every rank, teardown included (the rows are rank 0's)
    rows = json.loads(out.read_text())
    assert rows and all(row["wrong"] == 0 for row in rows)
    assert {row["transport"] for row in rows} == {"torch:gloo"}
    assert {row["collective"] for row in rows} == set(COLLECTIVES)  # the all-to-all over torch groups too


@pytest.mark.multiprocess
def test_the_mpi_baseline_is_refused_without_mpi() -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "pccl_torch.bench.cli", "-b", "4K", "-e", "4K", "--backends", "pccl,mpi", "--no-progress"]
    result = run_checked(command, launcher_environment(), 300)
    assert result.returncode != 0
    assert "the mpi baseline calls the MPI library directly and needs an MPI launch" in result.stderr
