"""A 2-rank pccl-bench run through its own launcher (-np): rows for every backend, nothing wrong."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pccl_torch.bench.report import JSON_FIELDS

from .conftest import ROOT


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
