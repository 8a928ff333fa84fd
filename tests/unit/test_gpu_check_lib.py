"""The GPU check's summary of host staging (``scripts/gpu_check_lib.py``): staged CUDA time over host time."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lib():
    spec = importlib.util.spec_from_file_location("gpu_check_lib", ROOT / "scripts" / "gpu_check_lib.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(label: str, collective: str, size: int, time_us: float, algorithm: str = "mpi") -> dict:
    return {"label": label, "algorithm": algorithm, "collective": collective, "size_bytes": size,
            "time_us": time_us}


def test_staging_ratio_from_16_mib_with_goal(tmp_path: Path) -> None:
    lib = _lib()
    mib = 1 << 20
    (tmp_path / "pccl-bench-w2.json").write_text(json.dumps([
        _row("pccl", "all_reduce", 4 * mib, 900.0), _row("pccl", "all_reduce", 16 * mib, 1200.0),
        _row("pccl", "all_gather", 16 * mib, 2000.0), _row("nccl", "all_reduce", 16 * mib, 100.0),
        _row("pccl", "reduce_scatter", 16 * mib, 100.0, algorithm="vendor")]))
    (tmp_path / "pccl-bench-w2-host.json").write_text(json.dumps([
        _row("pccl", "all_reduce", 4 * mib, 100.0), _row("pccl", "all_reduce", 16 * mib, 1000.0),
        _row("pccl", "all_gather", 16 * mib, 1000.0), _row("pccl", "reduce_scatter", 16 * mib, 900.0)]))
    staging = lib._staging(tmp_path)
    assert staging["staged_over_host"] == {"pccl all_reduce": {"16MiB": 1.2}, "pccl all_gather": {"16MiB": 2.0}}
    assert staging["goal_missed"] == {"pccl all_gather": {"16MiB": 2.0}}


def test_staging_without_both_runs_says_so(tmp_path: Path) -> None:
    assert "error" in _lib()._staging(tmp_path)
