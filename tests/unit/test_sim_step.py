"""pccl-sim step: a training step from a one-rank run's computation and the model's collectives, the overlap fitted
at one node count and held at the others; and the example harness recording the call sizes it needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pccl_torch.selection.heuristic import networked_choice
from pccl_torch.sim import costs, machine, step
from pccl_torch.sim.cli import main
from pccl_torch.sim.machine import MachineProfile

REPO = Path(__file__).resolve().parents[2]
PROFILE = MachineProfile(
    name="tb", ranks_per_node=2, nics_per_node=1, host_cores=2, vendor_library="gloo",
    alpha_intra=100e-6, beta_intra=1 / 1e9, alpha_inter=300e-6, beta_inter=1 / 23e6,
    alpha_vendor_intra=50e-6, beta_vendor_intra=1 / 0.6e9, alpha_vendor_step=150e-6, beta_vendor_inter=1 / 23e6,
    alpha_mpi_native=50e-6, gamma=1 / 3e9, copy=1 / 2.4e9, overhead=0.0,
)
SIZES = {"all_gather": {1 << 20: 20.0, 64 << 10: 5.0}, "reduce_scatter": {13 << 20: 1.0}, "all_reduce": {8: 1.0}}


def run_json(tmp_path: Path, name: str, backend: str, nodes: int, step_ms: float, *, local: int = 2,
             sizes: dict | None = None) -> Path:
    path = tmp_path / name
    data = {"comm": backend, "world_size": nodes * local, "local_size": local, "summary": {"step_ms": step_ms}}
    if sizes is not None:
        data["call_sizes"] = {c: {str(b): n for b, n in s.items()} for c, s in sizes.items()}
    path.write_text(json.dumps(data))
    return path


def expected_comm_ms(backend: str, nodes: int) -> float:
    total = 0.0
    for collective, calls in SIZES.items():
        for nbytes, count in calls.items():
            name = "vendor" if backend == "gloo" else networked_choice(collective, nbytes, nodes, 23e6)
            total += count * costs.predict(collective, name, nbytes, nodes, 2, PROFILE)
    return 1e3 * total


def test_step_is_stretched_compute_plus_priced_calls_less_the_overlap(tmp_path):
    runs = [step.load_run(run_json(tmp_path, f"{b}{n}.json", b, n, 1000.0 * n, sizes=SIZES))
            for b in ("gloo", "pccl") for n in (2, 3, 4)]
    predictions = step.predict_steps(runs, runs[0].call_sizes, 150.0, PROFILE)
    for p in predictions:
        assert p.compute_ms == pytest.approx(150.0 * p.run.nodes)  # 2N ranks on 2 cores
        assert p.comm_ms == pytest.approx(expected_comm_ms(p.run.backend, p.run.nodes))
        assert p.predicted_ms == pytest.approx(p.compute_ms + p.comm_ms - p.overlap * min(p.compute_ms, p.comm_ms))
        assert 0.0 <= p.overlap <= 1.0
    # The overlap is fitted on the fewest nodes: exact there where it can be.
    for p in (p for p in predictions if p.run.nodes == 2):
        exact = (p.compute_ms + p.comm_ms - p.run.step_ms) / min(p.compute_ms, p.comm_ms)
        if 0 <= exact <= 1:
            assert p.error == pytest.approx(0.0, abs=1e-12)
    held = {p.overlap for p in predictions if p.run.backend == "gloo"}
    assert len(held) == 1  # one overlap a backend, held for 3 and 4 nodes


def test_pccl_calls_are_priced_as_pccl_chooses_them():
    assert step.algorithm("gloo", "all_gather", 1 << 20, 3, PROFILE) == "vendor"
    assert step.algorithm("pccl", "all_gather", 16 << 20, 2, PROFILE) == "hier:pipelined"
    assert step.algorithm("pccl", "all_reduce", 16 << 20, 3, PROFILE) == "hier:ring"  # 3 nodes: the ring
    assert step.algorithm("pccl", "all_reduce", 16 << 20, 1, PROFILE) == "mpi"  # one node: MPI's own
    with pytest.raises(ValueError, match="no model of backend 'mpi'"):
        step.algorithm("mpi", "all_reduce", 8, 2, PROFILE)


def test_fitted_overlap_is_clamped():
    run = step.Run("r", "gloo", 2, 2, 100.0, {})
    assert step.fitted_overlap([step.StepPrediction(run, 80.0, {"all_gather": 80.0})]) == pytest.approx(0.75)
    assert step.fitted_overlap([step.StepPrediction(run, 10.0, {"all_gather": 10.0})]) == 0.0  # slower than none
    assert step.fitted_overlap([step.StepPrediction(run, 100.0, {"all_gather": 90.0})]) == 1.0  # faster than full


def test_cli(tmp_path, capsys):
    profile = PROFILE.save(tmp_path / "tb.yaml")
    runs = [run_json(tmp_path, f"{b}{n}.json", b, n, 900.0 * n, sizes=SIZES if b == "gloo" else None)
            for b in ("gloo", "pccl") for n in (2, 3)]
    one = run_json(tmp_path, "one.json", "gloo", 1, 120.0, local=1)
    out = tmp_path / "steps.json"
    assert main(["step", *map(str, runs), "--compute", str(one), "--machine", str(profile), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "call sizes from gloo2.json" in text and "# 2 runs not fitted on (overlap fitted at 2 nodes)" in text
    rows = json.loads(out.read_text())
    assert {(r["backend"], r["nodes"]) for r in rows} == {("gloo", 2), ("gloo", 3), ("pccl", 2), ("pccl", 3)}
    # Errors are usage errors: a --compute run of several ranks, no recorded sizes, a file that is not a run.
    assert main(["step", str(runs[0]), "--compute", str(runs[1]), "--machine", str(profile)]) == 2
    assert "needs a one-rank run" in capsys.readouterr().err
    assert main(["step", str(runs[3]), "--compute", str(one), "--machine", str(profile)]) == 2
    assert "no run recorded its call sizes" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[]")
    assert main(["step", str(tmp_path / "bad.json"), "--compute", str(one), "--machine", str(profile)]) == 2
    assert "not a training run's JSON" in capsys.readouterr().err


HARNESS_CALLS = """
import json, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import harness
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[2], 1), rank=0, world_size=1)
with harness.DistTimer() as timer:
    dist.all_reduce(torch.ones(10))
    dist.all_gather_single(torch.empty(6), torch.ones(6))
    dist.reduce_scatter_single(torch.empty(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
    dist.all_reduce(tensor=torch.ones(10))  # by name, as DeepSpeed calls it
print(json.dumps(harness._per_step(timer.sizes(), 2)))
dist.destroy_process_group()
"""


def test_harness_records_full_buffer_sizes(tmp_path):
    """The example harness's torch.distributed timer records every call's full-buffer bytes (gloo, one rank; in
    a process of its own, so no other test's wrapping of torch.distributed is in the way)."""
    done = subprocess.run([sys.executable, "-c", HARNESS_CALLS, str(REPO / "examples" / "gpt"), str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    per_step = json.loads(done.stdout.strip().splitlines()[-1])
    assert per_step == {"all_gather": {"24": 0.5}, "all_reduce": {"40": 1.0}, "reduce_scatter": {"24": 0.5}}


def test_frontier_logs_script_prices_the_papers_log_lines(tmp_path, capsys):
    """scripts/frontier_logs.py on a slurm log in the PCCL artifact's format: RCCL as the vendor ring, the hybrid
    prototype as hier:mpi, one-node points left out, the error of each against the Frontier profile."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import frontier_logs
    finally:
        sys.path.remove(str(REPO / "scripts"))
    folder = tmp_path / "all_gather_2"
    folder.mkdir()
    lines = []
    for gcds, nccl_ms, hybrid_ms in [(8, 1.0, 1.0), (1024, 30.0, 7.0)]:
        lines += ["output size = 64 MB",
                  "Method = nccl", f"All-gather bus bw for {gcds} GPUs is 1.0 GBPS for message output size 67.1 MB",
                  f"time = {nccl_ms} ms",
                  "Method = hybrid", f"All-gather bus bw for {gcds} GPUs is 1.0 GBPS for message output size 67.1 MB",
                  f"time = {hybrid_ms} ms"]
    (folder / "slurm-1.out").write_text("\n".join(lines) + "\n")
    assert frontier_logs.parse(folder / "slurm-1.out")[2:] == [("all_gather", "nccl", 1024, 64 << 20, 30.0),
                                                               ("all_gather", "hybrid", 1024, 64 << 20, 7.0)]
    assert frontier_logs.main([str(folder)]) == 0
    out = capsys.readouterr().out
    profile = machine.load("frontier")
    ring = 1e3 * costs.predict("all_gather", "vendor", 64 << 20, 128, 8, profile)
    assert f"{abs(ring - 30.0) / 30.0:6.1%}" in out and "1 points" in out  # the one-node point is left out
