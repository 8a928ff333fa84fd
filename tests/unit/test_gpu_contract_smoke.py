"""The GPU check's contract script (``scripts/gpu_cuda_contract.py``) on CPU tensors: its FIFO and timing phases
under torchrun on 2 ranks over the pccl backend with the worker thread (``PCCL_ASYNC=thread``), judged by
``gpu_check_lib``. What the ``fifo-cpu-n2`` section of ``scripts/gpu_check.sh`` runs, with fewer timed calls
(about 12 s on 2 shared cores)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .test_gpu_check_lib import ROOT, _lib


@pytest.mark.multiprocess
def test_cpu_smoke_fifo_and_timing_rows_judged(tmp_path: Path) -> None:
    rows_dir = tmp_path / "rows"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(ROOT / "scripts" / "gpu_cuda_contract.py"), "--device", "cpu", "--backend", "pccl",
               "--phases", "fifo,timing", "--label", "fifo-cpu-n2", "--rows", str(rows_dir),
               "--timing-mib", "1", "--timing-warmup", "1", "--timing-iters", "2"]
    env = dict(os.environ, PCCL_ASYNC="thread", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore::FutureWarning")
    process = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    lib = _lib()
    rows = lib.load_rows(rows_dir)
    assert {r["rank"] for r in rows} == {0, 1}
    assert not [r for r in rows if r.get("error")], [r["error"] for r in rows if r.get("error")]
    timing = [r for r in rows if r["phase"] == "timing"]
    assert sorted((r["collective"], r["mode"]) for r in timing if r["rank"] == 0) == sorted(
        (c, m) for c in ("all_gather", "reduce_scatter", "all_reduce") for m in ("sync", "async"))
    assert all(len(r["host_s"]) == len(r["total_s"]) == 2 for r in timing)
    assert all(r["backend"] == "pccl" and r["launcher"] == "torchrun" for r in timing)
    verdict = lib.judge_fifo_cpu(rows, {"fifo-cpu-n2": {"status": "pass", "reason": "exit 0"}})
    parts = {p["what"]: p for p in verdict["details"]["parts"]}
    assert parts["fifo-cpu-n2 one_group"]["status"] == "pass", parts
    assert parts["fifo-cpu-n2 two_groups"]["status"] == "pass", parts
    assert parts["fifo-cpu-n2 two_groups"]["checked"] == 200  # 50 pairs on 2 groups, 2 ranks
    host = lib.judge_host_return(rows, {})  # CPU tensors: the host does the work, nothing judged
    assert all(p["status"] == "skip" for p in host["details"]["parts"])
