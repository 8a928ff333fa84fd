"""The scripts that turn pccl-bench JSON into the latency regime's tables and plot (benchmarks/)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(backend: str, algorithm: str, auto: bool, ms: float, size: int = 1 << 20, nodes: int = 4) -> dict:
    return {"collective": "all_reduce", "size_bytes": size, "backend": backend, "algorithm": algorithm, "auto": auto,
            "time_us": ms * 1e3, "nodes": nodes}


def test_auto_against_the_best_forced_plan_and_baseline() -> None:
    verdict = _script("auto_vs_forced").verdict
    rows = [_row("pccl", "hier:recursive_doubling", True, 50.0), _row("pccl", "hier:mpi", False, 48.0),
            _row("pccl", "hier:ring", False, 70.0), _row("mpi", "native", False, 100.0),
            _row("gloo", "native", False, 200.0),
            _row("pccl", "mpi", True, 20.0, size=4096), _row("pccl", "hier:mpi", False, 10.0, size=4096),
            _row("mpi", "native", False, 20.0, size=4096)]
    text = verdict(rows, 64 << 10)
    assert "| 1M | 50.0 ms (hier:recursive_doubling) | 48.0 ms (hier:mpi) | 0.96 | 100.0 ms (mpi) | 2.00x |" in text
    assert "at 1 of 1 points" in text and "geomean 2.00x" in text  # 4 KiB is below --from: listed, not counted
    worse = verdict([*rows[:1], _row("pccl", "hier:mpi", False, 40.0), *rows[3:5]], 64 << 10)
    assert "at 0 of 1 points" in worse


def test_node_scaling_growth_and_plot(tmp_path) -> None:
    scaling = _script("plot_node_scaling")
    rows = [_row("pccl", "hier:mpi", True, ms, nodes=n) for n, ms in ((2, 10.0), (4, 12.0), (8, 15.0))]
    rows += [_row("pccl", "ring", False, ms, nodes=n) for n, ms in ((2, 10.0), (4, 20.0), (8, 40.0))]
    data = scaling.series(rows)
    table = scaling.growth_table(data)
    assert "| pccl (auto) | 10.0 | 12.0 | 15.0 | 1.50x |" in table
    assert "| pccl:ring | 10.0 | 20.0 | 40.0 | 4.00x |" in table
    scaling.plot(data, str(tmp_path / "scaling.png"))
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_latency_residuals_per_inter_node_step_and_noise_floor() -> None:
    residuals = _script("latency_residuals")
    from pccl_torch.sim import machine
    profile = machine.load(str(BENCHMARKS / "results" / "testbed" / "node-count" / "tb200-fitted.yaml"))

    def priced(backend: str, algorithm: str, collective: str, measured_us: float, predicted_us: float,
               nbytes: int = 64 << 10) -> dict:
        return {"collective": collective, "nbytes": nbytes, "nodes": 4, "local_size": 2, "backend": backend,
                "algorithm": algorithm, "measured_us": measured_us, "predicted_us": predicted_us}

    # gloo's all-gather on 4 x 2 is a ring of 7 steps, all crossing nodes; 7 ms more than priced: 1 ms a step
    gloo = priced("gloo", "native", "all_gather", 17_000.0, 10_000.0)
    assert residuals.inter_steps(gloo, profile) == 7
    rows = [gloo, priced("gloo", "native", "all_to_all", 9_000.0, 3_000.0),  # all-to-all: not counted
            priced("pccl", "hier:pipelined", "all_gather", 9_000.0, 3_000.0),  # pipelined: not counted
            priced("gloo", "native", "all_gather", 90_000.0, 10_000.0, nbytes=4 << 20)]  # above --upto
    found = residuals.step_residuals(rows, profile, 1 << 20)
    assert list(found) == ["gloo"] and found["gloo"] == [pytest.approx(1e-3)]
    # the same call in two runs, 10 and 12 ms: each run off the other by 20% and 1/6
    one = [priced("mpi", "native", "all_reduce", 10_000.0, 0.0)]
    two = [priced("mpi", "native", "all_reduce", 12_000.0, 0.0)]
    assert residuals.noise_floor([one, two]) == pytest.approx((0.2 + 1 / 6) / 2)
    assert residuals.noise_floor([one]) is None
