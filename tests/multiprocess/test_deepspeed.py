"""DeepSpeed ZeRO-1/2/3 with --comm_backend pccl (and through the zero-code route) against gloo."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import HERE, ROOT, collect_ranks, launch_ranks
from .rank_result import RESULT_DIR_ENV

pytest.importorskip("deepspeed", reason="make test installs the [deepspeed] extra")

# DeepSpeed compiles its CPU shared-memory extension once (~30 s); keep it between runs.
EXTENSIONS = {"TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions")),
              "DS_ACCELERATOR": "cpu"}


def _run(ranks: int, local_size: int, tmp_path, name: str, *args: str, zero_code: bool = False) -> list[dict]:
    """Every rank's result (exit status 0 checked, each rank's result written after its
    destroy_process_group()); the final parameters of each stage equal on every rank."""
    out, results = tmp_path / f"{name}.json", tmp_path / f"{name}-ranks"
    env = {**EXTENSIONS, "MASTER_PORT": str(_free_port())}  # DeepSpeed's MPI discovery would take 29500
    if zero_code:  # python -m pccl_torch.run driver.py ... : the script asks for gloo, pccl is forced
        run = launch_ranks("-m", ranks, "pccl_torch.run", str(HERE / "deepspeed_driver.py"), *args, "--json", str(out),
                           result_dir=results, local_size=local_size, env=env, timeout_s=900)
    else:
        run = launch_ranks("deepspeed_driver.py", ranks, *args, "--json", str(out), result_dir=results,
                           local_size=local_size, env=env, timeout_s=900)
    assert not any(r["shm_left"] for r in run.ranks), f"{name}: DeepSpeed's /dev/shm segments left behind"
    for stage in run[0]["stages"]:
        params = [r["stages"][stage]["params"] for r in run.ranks]
        assert all(p == pytest.approx(params[0], rel=1e-6, abs=1e-7) for p in params), f"{name}: ZeRO-{stage} ranks differ"
    return run.ranks


_GLOO: dict[int, list[dict]] = {}
"""gloo's ZeRO-1/2/3 runs of this session, by rank count (every rank's result, checked by :func:`_run`)."""


def gloo_baseline(ranks: int, tmp_path) -> list[dict]:
    """gloo's ZeRO-1/2/3 on ``ranks`` ranks under mpiexec, launched once a session: the same seed, data and ranks give
    the same run whatever launched it or emulated nodes (gloo does not read PCCL_LOCAL_SIZE), so the tests against
    gloo here and test_launchers' under torchrun and DeepSpeed's launcher share it instead of a launch each."""
    if ranks not in _GLOO:
        _GLOO[ranks] = _run(ranks, 1, tmp_path, "gloo", "--comm_backend", "gloo")
    return _GLOO[ranks]


@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks,local_size,zero_code", [(2, 1, True), (4, 2, False)], ids=["n2-L1-zero-code", "n4-L2"])
def test_zero_stages_with_pccl_match_gloo(ranks: int, local_size: int, zero_code: bool, tmp_path) -> None:
    """ZeRO-1/2/3 through pccl give gloo's losses and parameters. At 4 ranks the script asks for pccl
    (``--comm_backend pccl``); at 2 the zero-code route (``python -m pccl_torch.run driver.py --comm_backend gloo``)
    makes the unchanged script, which asks for gloo, run on pccl: everything below then holds of that route too."""
    gloo_ranks = gloo_baseline(ranks, tmp_path)
    backend = "gloo" if zero_code else "pccl"
    pccl_ranks = _run(ranks, local_size, tmp_path, "pccl", "--comm_backend", backend, zero_code=zero_code)
    for rank, (g, q) in enumerate(zip(gloo_ranks, pccl_ranks)):  # every rank's own losses, pccl against gloo
        for stage in ("1", "2", "3"):
            assert q["stages"][stage]["losses"] == pytest.approx(g["stages"][stage]["losses"], rel=1e-5, abs=1e-6), \
                (rank, stage)
        assert q["default_group"] == "PcclProcessGroup" and q["bypassed"] == {}, (rank, q["bypassed"])
    gloo, pccl = gloo_ranks[0], pccl_ranks[0]
    assert pccl["default_group"] == "PcclProcessGroup" and gloo["default_group"] != "PcclProcessGroup"
    calls = pccl["pccl_calls"]  # summed over every pccl group: the world group and DeepSpeed's own groups
    assert min(calls.get(c, 0) for c in ("all_gather", "reduce_scatter", "all_reduce")) > 0, calls
    assert pccl["pccl_groups"] >= 2, "DeepSpeed's data-parallel group should be a pccl group too"
    assert pccl["bypassed"] == {}, pccl["bypassed"]  # no AG/RS/AR of any pccl group reached the vendor library
    # What each stage issues (DeepSpeed 0.19.8 on CPU): ZeRO-1/2 all-reduce gradients and all-gather the
    # updated partitions; ZeRO-3 all-gathers parameters, reduce-scatters gradients, all-reduces norms.
    issued = {"1": ("all_reduce", "all_gather"), "2": ("all_reduce", "all_gather"),
              "3": ("all_reduce", "all_gather", "reduce_scatter")}
    for stage, kinds in issued.items():
        stage_calls = pccl["stages"][stage]["pccl_calls"]
        assert min(stage_calls.get(c, 0) for c in kinds) > 0, f"ZeRO-{stage} through pccl: {stage_calls}"
    for stage in ("1", "2", "3"):
        assert pccl["stages"][stage]["losses"] == pytest.approx(gloo["stages"][stage]["losses"], rel=1e-5, abs=1e-6)
        assert pccl["stages"][stage]["params"] == pytest.approx(gloo["stages"][stage]["params"], rel=1e-5, abs=1e-6)


@pytest.mark.multiprocess
def test_deepspeed_launcher_with_its_mpich_runner(tmp_path) -> None:
    """`deepspeed --launcher mpich ... train.py --comm_backend pccl`: DeepSpeed's own launcher starts the
    ranks through mpirun (the MPI launch pccl needs) and the script trains on pccl."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "deepspeed").exists() or not (bin_dir / "mpirun").exists():
        pytest.skip("the deepspeed launcher or mpirun is not installed beside this Python")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    out = tmp_path / "launcher.json"
    command = [str(bin_dir / "deepspeed"), "--hostfile", str(hostfile), "--force_multi", "--launcher", "mpich",
               "--no_ssh_check", "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
               str(HERE / "deepspeed_driver.py"), "--comm_backend", "pccl", "--stages", "3", "--json", str(out)]
    results = tmp_path / "ranks"
    results.mkdir()
    env = {**os.environ, **EXTENSIONS, "PATH": _beside_this_ninja(bin_dir, tmp_path / "ninja"),
           "PYTHONWARNINGS": "ignore::FutureWarning", RESULT_DIR_ENV: str(results)}
    env.pop("PCCL_ALGO", None)
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    ranks = collect_ranks(result, 2, results, what="deepspeed --launcher mpich").ranks  # exit 0, both ranks' results
    assert out.exists(), f"no result (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    report = json.loads(out.read_text())
    assert all(r["default_group"] == "PcclProcessGroup" and r["bypassed"] == {} for r in ranks)
    assert report["default_group"] == "PcclProcessGroup"
    calls = report["stages"]["3"]["pccl_calls"]
    assert min(calls.get(c, 0) for c in ("all_gather", "reduce_scatter", "all_reduce")) > 0, calls
    assert report["bypassed"] == {}
    assert result.returncode == 0, result.stderr[-3000:]


def _beside_this_ninja(bin_dir: Path, link_dir: Path) -> str:
    """PATH with ``bin_dir`` (its mpirun, for DeepSpeed's runner) first, but the ``ninja`` the rest of the session
    finds ahead of it: DeepSpeed's ranks JIT-load their CPU op with whichever ninja is first on PATH, and a ninja of
    another version than the one that wrote the build log (here bin_dir's 1.13 after the system's 1.11) compiles it
    again, ~30 s here and ~30 s more in the next DeepSpeed test, for the same library."""
    path = os.environ.get("PATH", "")
    ninja = shutil.which("ninja", path=path)
    if ninja is None:
        return f"{bin_dir}{os.pathsep}{path}"
    link_dir.mkdir()
    (link_dir / "ninja").symlink_to(ninja)
    return os.pathsep.join((str(link_dir), str(bin_dir), path))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
