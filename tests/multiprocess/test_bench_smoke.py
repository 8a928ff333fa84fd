"""pccl-bench runs through its own launcher (-np): rows for every backend, nothing wrong (2 ranks, every
collective; the all-to-all on 3 ranks and on 2 nodes x 2), --confirm, and a broken algorithm counted wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pccl_torch.bench.report import CONFIRM_FIELDS, JSON_FIELDS, PIPELINE_FIELDS
from pccl_torch.plan import names_for

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
def test_pipelined_rows_record_their_chunks(tmp_path) -> None:
    """A ``hier:pipelined`` row carries the chunks the call was cut into (here fixed by PCCL_PIPELINE_CHUNKS), which
    ``pccl-sim validate`` prices it in; no other row has the field."""
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "pccl_torch.bench.cli", "-np", "4", "--local-size", "2", "-c",
               "all_gather,reduce_scatter", "-b", "64K", "-e", "64K", "-n", "2", "-w", "1",
               "--backends", "pccl:hier:pipelined,pccl:ring", "--check", "--json", str(out), "--no-progress"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PCCL_PIPELINE_CHUNKS": "3"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())
    piped = [r for r in rows if r["algorithm"] == "hier:pipelined"]
    assert len(piped) == 2 and all(r["chunks"] == 3 and r["wrong"] == 0 for r in piped)
    assert all(set(r) == set(JSON_FIELDS) | set(PIPELINE_FIELDS) for r in piped)
    assert all(set(r) == set(JSON_FIELDS) for r in rows if r["algorithm"] != "hier:pipelined")


def _all_to_all_rows(tmp_path, ranks: int, local_size: int, *extra: str) -> tuple[list[dict], str]:
    """``pccl-bench -c all_to_all`` on ``ranks`` ranks, ``local_size`` a node: pccl's choice, every algorithm that
    runs on CPU tensors, gloo and MPICH, checked; the rows and the printed table."""
    out = tmp_path / f"a2a-{ranks}.json"
    command = [sys.executable, "-m", "pccl_torch.bench.cli", "-np", str(ranks), "--local-size", str(local_size),
               "-c", "all_to_all", "-b", "4K", "-e", "64K", "-f", "16", "-n", "2", "-w", "1",
               "--backends", "pccl,pccl:all,gloo,mpi", "--check", "--json", str(out), "--no-progress", *extra]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(out.read_text()), result.stdout


def _check_all_to_all_rows(rows: list[dict], ranks: int, local_size: int) -> None:
    """alltoall_perf's conventions: size = one rank's send buffer (p equal blocks), busbw = algbw (p-1)/p; every
    CPU algorithm and both baselines at every size, nothing wrong, every pccl row against the best baseline."""
    block = {4096: 1024 // ranks, 65536: 16384 // ranks}
    assert {r["size_bytes"] for r in rows} == {4 * ranks * b for b in block.values()}
    assert all(r["collective"] == "all_to_all" and r["ranks"] == ranks and r["local_size"] == local_size
               for r in rows)
    assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in rows), [(r["label"], r["wrong"]) for r in rows]
    for r in rows:
        assert r["count"] * 4 == r["size_bytes"]
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * (ranks - 1) / ranks)
        assert (r["vs_best_baseline"] is not None) == (r["backend"] == "pccl")
    for size in {r["size_bytes"] for r in rows}:
        fixed = {r["algorithm"] for r in rows if r["size_bytes"] == size and r["backend"] == "pccl" and not r["auto"]
                 and not r["compression"]}
        assert fixed == set(names_for("all_to_all", "cpu")), size
        assert {r["backend"] for r in rows if r["size_bytes"] == size and r["algorithm"] == "native"} == {"gloo", "mpi"}
        assert sum(r["auto"] for r in rows if r["size_bytes"] == size) == 1


@pytest.mark.multiprocess
def test_all_to_all_three_ranks(tmp_path) -> None:
    rows, stdout = _all_to_all_rows(tmp_path, 3, 1)
    _check_all_to_all_rows(rows, 3, 1)
    assert "## all_to_all" in stdout and "Out of bounds values : 0 OK" in stdout


@pytest.mark.multiprocess
def test_all_to_all_two_nodes_of_two_with_wire_formats(tmp_path) -> None:
    rows, stdout = _all_to_all_rows(tmp_path, 4, 2, "--compression", "int8,bf16")
    exact = [r for r in rows if not r["compression"]]
    _check_all_to_all_rows(exact, 4, 2)
    assert all(r["nodes"] == 2 for r in rows)
    compressed = [r for r in rows if r["compression"]]
    assert {(r["compression"], r["size_bytes"]) for r in compressed} == {
        (f, s) for f in ("int8", "bf16") for s in (4096, 65536)}
    assert all(r["wrong"] == 0 and r["vs_exact"] for r in compressed), [(r["label"], r["wrong"]) for r in compressed]
    assert "Out of bounds values : 0 OK" in stdout


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


BROKEN = [("ring", ("all_gather", "reduce_scatter", "all_reduce")), ("pairwise", ("reduce_scatter", "all_to_all"))]


@pytest.mark.multiprocess
@pytest.mark.parametrize("schedule,collectives", BROKEN, ids=[name for name, _ in BROKEN])
def test_check_counts_the_wrong_elements_of_a_broken_algorithm(tmp_path, schedule, collectives) -> None:
    """--check must see a wrong result: a flat schedule of every collective that has it is broken on purpose
    (rank 0's first output element + 1, see bench_corrupt_driver.py). Its rows, and only its rows, count
    wrong elements, the footer says WRONG and pccl-bench exits 1."""
    out = tmp_path / "bench.json"
    result = launch("bench_corrupt_driver.py", 2, "--corrupt", schedule, "--", "--local-size", "1", "-b", "1K", "-e",
                    "4K", "-f", "4", "-n", "2", "-w", "1", "-c", ",".join(collectives), "--backends",
                    f"pccl:{schedule},pccl:mpi,gloo,mpi", "--check", "--json", str(out), "--no-progress", local_size=1,
                    timeout_s=300)
    assert out.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())
    broken = [r for r in rows if r["backend"] == "pccl" and r["algorithm"] == schedule]
    sound = [r for r in rows if r not in broken]
    assert {r["collective"] for r in broken} == set(collectives), rows
    # one element of rank 0's output: all-reduce results are checked on both ranks, rank 0 wrong by 1
    assert all(r["wrong"] == 1 for r in broken), [(r["collective"], r["size_bytes"], r["wrong"]) for r in broken]
    assert sound and all(r["wrong"] == 0 for r in sound), [(r["label"], r["wrong"]) for r in sound]
    assert "WRONG" in result.stdout and "Out of bounds values : 0 OK" not in result.stdout
    assert result.returncode == 1, result.stderr[-3000:]
