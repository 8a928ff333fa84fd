"""A 2-rank pccl-bench run through its own launcher (-np): rows for every backend, nothing wrong."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pccl_torch.bench.report import CONFIRM_FIELDS, JSON_FIELDS

from .conftest import ROOT, launch


@pytest.mark.multiprocess
def test_pccl_bench_two_ranks(tmp_path) -> None:
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "pccl_torch.bench.cli", "-np", "2", "--local-size", "1", "-b", "1K", "-e",
               "64K", "-f", "8", "-n", "2", "-w", "1", "--backends", "pccl,pccl:hier:bruck,gloo,mpi", "--check",
               "--json", str(out), "--no-progress"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert {tuple(sorted(r)) for r in rows} == {tuple(sorted(JSON_FIELDS))}
    assert {(r["backend"], r["algorithm"]) for r in rows if r["collective"] == "all_gather"} >= {
        ("pccl", "hier:bruck"), ("gloo", "native"), ("mpi", "native")}
    assert {r["size_bytes"] for r in rows} == {1024, 8192, 65536}
    assert all(r["wrong"] == 0 and r["ranks"] == 2 and r["time_us"] > 0 for r in rows)
    assert "Out of bounds values : 0 OK" in result.stdout


@pytest.mark.multiprocess
def test_confirm_retimes_auto_against_the_fastest_fixed_and_reports_the_noise_floor(tmp_path) -> None:
    out = tmp_path / "confirm.json"
    command = [sys.executable, "-m", "pccl_torch.bench.cli", "-np", "3", "--local-size", "1", "-b", "4K", "-e", "4K",
               "-n", "2", "-w", "1", "-c", "all_reduce,all_gather", "--backends", "pccl,pccl:ring,pccl:mpi,mpi",
               "--confirm", "3", "--json", str(out), "--no-progress"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())
    auto = [r for r in rows if r["auto"]]
    assert len(auto) == 2 and all(set(r) == set(JSON_FIELDS) | set(CONFIRM_FIELDS) for r in auto)
    assert all(set(r) == set(JSON_FIELDS) for r in rows if not r["auto"])
    for r in auto:
        assert r["confirm_iters"] == 3 and r["confirm_fixed"] in ("ring", "mpi")
        assert r["auto_vs_best_fixed"] == pytest.approx(r["confirm_auto_us"] / r["confirm_fixed_us"])
        assert r["confirm_repeat_ratio"] >= 1.0
    assert "# Auto vs the fastest fixed algorithm, re-timed head to head (3 iterations)" in result.stdout
    assert "# Noise floor: the fastest fixed algorithm timed twice" in result.stdout


@pytest.mark.multiprocess
def test_check_counts_the_wrong_elements_of_a_broken_algorithm(tmp_path) -> None:
    """--check must see a wrong result: the flat ``ring`` schedule of every collective is broken on purpose
    (rank 0's first output element + 1, see bench_corrupt_driver.py). Its rows, and only its rows, count
    wrong elements, the footer says WRONG and pccl-bench exits 1."""
    out = tmp_path / "bench.json"
    result = launch("bench_corrupt_driver.py", 2, "--corrupt", "ring", "--", "--local-size", "1", "-b", "1K", "-e",
                    "4K", "-f", "4", "-n", "2", "-w", "1", "--backends", "pccl:ring,pccl:mpi,gloo,mpi", "--check",
                    "--json", str(out), "--no-progress", local_size=1, timeout_s=300)
    assert out.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())
    broken = [r for r in rows if r["backend"] == "pccl" and r["algorithm"] == "ring"]
    sound = [r for r in rows if r not in broken]
    assert {r["collective"] for r in broken} == {"all_gather", "reduce_scatter", "all_reduce"}, rows
    # one element of rank 0's output: all-reduce results are checked on both ranks, rank 0 wrong by 1
    assert all(r["wrong"] == 1 for r in broken), [(r["collective"], r["size_bytes"], r["wrong"]) for r in broken]
    assert sound and all(r["wrong"] == 0 for r in sound), [(r["label"], r["wrong"]) for r in sound]
    assert "WRONG" in result.stdout and "Out of bounds values : 0 OK" not in result.stdout
    assert result.returncode == 1, result.stderr[-3000:]
