"""benchmarks/bench_kernels.py: a CPU smoke run (every kernel row, the per-call costs, the JSON), and its dispatch
check and proposed routes on given measurements (the 2026-12-04 H200 run gives back the seeded table)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pccl_torch.triton_kernels import _backend
from tests.kernels.test_kernel_dispatch import MEASURED_2026_12_04

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kernels.py"
KERNELS = {"reduce_2", "reduce_8", "permute", "rotate", "quantize", "dequantize", "dequantize_acc", "split_planes",
           "merge_planes"}


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_kernels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, *argv: str) -> tuple[str, list[dict]]:
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PCCL_KERNELS")}
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "-b", "4K", "-e", "16K", "-n", "2", "-w",
                           "1", "--launch-calls", "3", "--json", str(out), *argv],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(out.read_text())


@pytest.mark.parametrize("argv,forced", [((), "torch"), (("--interpret", "-d", "bfloat16"), "triton")])
def test_cpu_run_has_every_kernel_and_the_per_call_costs(tmp_path, argv, forced) -> None:
    stdout, rows = _run(tmp_path, *argv)
    sweep = [r for r in rows if r.get("kind") != "launch"]
    launch = [r for r in rows if r.get("kind") == "launch"]
    assert {r["kernel"] for r in sweep} == KERNELS | {"copy_"}
    assert {r["bytes"] for r in sweep} == {4096, 16384}
    assert {r["kernel"] for r in launch} == KERNELS | {"copy_"}
    assert {r["impl"] for r in sweep} == {"torch", forced, "torch-ref"}
    assert all(r["dispatch"] == forced and r["time_us"] > 0 for r in rows)
    assert all(r.get("auto") is None for r in rows)  # nothing is routed on CPU
    if forced == "triton":  # bfloat16 has no Triton decode: its rows are the reference's alone
        assert not [r for r in sweep if r["kernel"] == "dequantize" and r["impl"] == "triton"]
    for line in ("per-call cost, 1-element buffers", "dispatch check: nothing is routed on cpu", "proposed routes"):
        assert line in stdout


def _rows(measured: dict, dtype: torch.dtype) -> list[dict]:
    """bench_kernels rows (as on CUDA) from (bytes, Triton us, torch us) points of one dtype."""
    rows = []
    for (kernel, d), points in measured.items():
        if d != dtype:
            continue
        for nbytes, triton_us, torch_us in points:
            auto = _backend.route(kernel, dtype, nbytes, "cuda")
            rows += [{"kernel": kernel, "bytes": nbytes, "impl": "triton", "time_us": triton_us, "auto": auto},
                     {"kernel": kernel, "bytes": nbytes, "impl": "torch-ref", "time_us": torch_us, "auto": auto}]
    return rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_seeded_table_is_what_the_12_04_run_proposes(dtype) -> None:
    """propose_routes on the 2026-12-04 measurements gives ROUTES' ranges (for the kernels measured in that
    class), and the dispatch check finds no slower pick."""
    bench = _bench_module()
    rows = _rows(MEASURED_2026_12_04, dtype)
    cls = _backend.dtype_class(dtype)
    proposed = bench.propose_routes(rows, cls, "12-04")
    routes = _backend._ranges(tuple(eval(line.rstrip(","), {"Route": _backend.Route, "MIB": bench.MIB})
                                    for line in proposed))
    measured_kernels = {k for k, d in MEASURED_2026_12_04 if d == dtype}
    seeded = {key: ranges for key, ranges in _backend._RANGES.items() if key[1] == cls and key[0] in measured_kernels}
    assert routes == seeded
    good, slower = bench.dispatch_check(rows)
    assert (good, slower) == (len(rows) // 2, [])


def test_dispatch_check_names_a_slower_pick() -> None:
    bench = _bench_module()
    rows = [{"kernel": "reduce_2", "bytes": 1 << 20, "impl": "triton", "time_us": 10.0, "auto": "torch"},
            {"kernel": "reduce_2", "bytes": 1 << 20, "impl": "torch-ref", "time_us": 30.0, "auto": "torch"},
            {"kernel": "rotate", "bytes": 1 << 20, "impl": "triton", "time_us": 10.0, "auto": "triton"},
            {"kernel": "rotate", "bytes": 1 << 20, "impl": "torch-ref", "time_us": 30.0, "auto": "triton"}]
    good, slower = bench.dispatch_check(rows)
    assert good == 1 and len(slower) == 1 and slower[0].startswith("reduce_2 1M: auto runs torch (30.0 us)")
    assert bench.propose_routes(rows, "full", "x") == [
        'Route(kernel="reduce_2", dtypes="full", start=0, measured="x: Triton faster at 1M-1M"),',
        'Route(kernel="rotate", dtypes="full", start=0, measured="x: Triton faster at 1M-1M"),']
