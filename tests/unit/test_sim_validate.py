"""pccl-sim validate: measured against predicted time of pccl-bench rows, the skipped rows, and whether the
predicted speed-up moves with the node count the way the measured one does; the model's limits (one node, one
rank a node, 3 nodes)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from pccl_torch.sim import machine
from pccl_torch.sim.pipeline import predict_as_run
from pccl_torch.sim.cli import main
from pccl_torch.sim.costs import pipelined_time
from pccl_torch.sim.validate import _size_groups

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "sim-validate"
N2, N3, A2A = DATA / "bench-n2.json", DATA / "bench-n3.json", DATA / "a2a-2x2-compressed-1m.json"
MACHINE = REPO / "benchmarks" / "results" / "testbed" / "node-count" / "tb200-fitted.yaml"
PROFILE = machine.load(str(MACHINE))


def run(tmp_path: Path, capsys, *files: Path) -> tuple[dict, str]:
    """``pccl-sim validate FILES --machine tb200-fitted.yaml --json``: the JSON report and the printed text."""
    out = tmp_path / "validate.json"
    assert main(["validate", *map(str, files), "--machine", str(MACHINE), "--json", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


def write(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(rows))
    return path


def row(collective: str, backend: str, algorithm: str, nodes: int, local: int, time_us: float, *,
        nbytes: int = 1 << 20, auto: bool = False, compression: str | None = None, wrong: int = 0) -> dict:
    """A pccl-bench row with the fields validate reads."""
    return {"collective": collective, "backend": backend, "algorithm": algorithm, "auto": auto,
            "compression": compression, "size_bytes": nbytes, "time_us": time_us, "wrong": wrong,
            "nodes": nodes, "local_size": local, "ranks": nodes * local}


def predicted_us(collective: str, algorithm: str, nbytes: int, nodes: int, local: int) -> float:
    """The model's time of a row as pccl ran it (``hier:pipelined`` in its 1 MiB chunks, not the model's best)."""
    return predict_as_run(collective, algorithm, nbytes, nodes, local, PROFILE) * 1e6


def find(rows: list[dict], **fields) -> dict:
    [hit] = [r for r in rows if all(r[k] == v for k, v in fields.items())]
    return hit


# ---- errors against hand-computed ones ----------------------------------------------------------------

def test_errors_equal_hand_computed_ones(tmp_path, capsys) -> None:
    report, text = run(tmp_path, capsys, N2, N3)
    bench = {2: json.loads(N2.read_text()), 3: json.loads(N3.read_text())}
    # pccl's pipelined all-gather on 2 nodes x 2, priced as it ran
    measured = find(bench[2], collective="all_gather", backend="pccl")["time_us"]
    expected = predicted_us("all_gather", "hier:pipelined", 16 << 20, 2, 2)
    got = find(report["rows"], collective="all_gather", backend="pccl", nodes=2)
    assert got["measured_us"] == measured and got["predicted_us"] == pytest.approx(expected, rel=1e-12)
    assert got["error"] == pytest.approx((expected - measured) / measured, rel=1e-12)
    # MPICH's reduce-scatter on 3 nodes x 2 (16,777,200 bytes), priced as MPI's own collective
    measured = find(bench[3], collective="reduce_scatter", backend="mpi")["time_us"]
    expected = predicted_us("reduce_scatter", "mpi", 16777200, 3, 2)
    got = find(report["rows"], collective="reduce_scatter", backend="mpi", nodes=3)
    assert got["algorithm"] == "mpi" and got["nbytes"] == 16777200
    assert got["error"] == pytest.approx((expected - measured) / measured, rel=1e-12)
    line = next(x for x in text.splitlines() if x.startswith("reduce_scatter") and "3 x 2" in x and "mpi as mpi" in x)
    assert line.split()[-1] == f"{(expected - measured) / measured:+.1%}"
    # gloo is priced as the vendor collective: its error is not MPI's
    gloo = find(report["rows"], collective="reduce_scatter", backend="gloo", nodes=3)
    assert gloo["algorithm"] == "vendor"
    assert gloo["predicted_us"] == pytest.approx(predicted_us("reduce_scatter", "vendor", 16777200, 3, 2))
    # the footer: median and worst |error| over the 12 rows
    errors = [abs(r["error"]) for r in report["rows"]]
    assert len(errors) == 12 and report["skipped"] == []
    assert report["summary"]["median"] == pytest.approx(statistics.median(errors))
    assert report["summary"]["worst"] == pytest.approx(max(errors))
    assert f"# median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}" in text
    assert set(report["per_collective"]) == {"all_gather", "reduce_scatter"}
    assert report["per_collective"]["all_gather"]["count"] == 6


def test_a_pipelined_row_is_priced_in_its_recorded_chunks(tmp_path, capsys) -> None:
    """pccl-bench records a pipelined row's chunk count (``chunks``); without it, pccl's 1 MiB rule (16 here)."""
    nbytes = 16 << 20
    rows = [row("reduce_scatter", "pccl", "hier:pipelined", 2, 2, 80000.0, nbytes=nbytes, auto=True) | {"chunks": 4},
            row("reduce_scatter", "pccl", "hier:pipelined", 2, 2, 80000.0, nbytes=nbytes)]
    report, _ = run(tmp_path, capsys, write(tmp_path, "piped.json", rows))
    recorded, ruled = report["rows"]
    assert recorded["predicted_us"] == pytest.approx(
        pipelined_time("reduce_scatter", nbytes, 2, 2, PROFILE, 4) * 1e6, rel=1e-12)
    assert ruled["predicted_us"] == pytest.approx(
        pipelined_time("reduce_scatter", nbytes, 2, 2, PROFILE, 16) * 1e6, rel=1e-12)
    assert recorded["predicted_us"] != pytest.approx(ruled["predicted_us"])


def test_three_nodes_join_two_in_the_direction_check(tmp_path, capsys) -> None:
    """16,777,200 bytes on 3 nodes and 16 MiB on 2 are one size; the speed-ups are best baseline over auto."""
    report, text = run(tmp_path, capsys, N2, N3)
    assert report["node_counts"] == [2, 3]
    [trend] = [t for t in report["trends"] if t["collective"] == "all_gather"]
    assert trend["nbytes"] == 16 << 20 and [p["nodes"] for p in trend["points"]] == [2, 3]
    bench = json.loads(N3.read_text())
    times = {r["backend"]: r["time_us"] for r in bench if r["collective"] == "all_gather"}
    point = trend["points"][1]
    assert point["measured"] == pytest.approx(min(times["gloo"], times["mpi"]) / times["pccl"])
    base = min(predicted_us("all_gather", a, 16777200, 3, 2) for a in ("vendor", "mpi"))
    assert point["predicted"] == pytest.approx(base / predicted_us("all_gather", "hier:pipelined", 16777200, 3, 2))
    assert len(trend["steps"]) == 1
    assert "# direction all_gather: " in text and "# direction reduce_scatter: " in text


def test_direction_over_one_baseline(tmp_path, capsys) -> None:
    """``--baseline gloo``: each speed-up is gloo's time over pccl's, measured and predicted, even where MPICH's
    row is faster; a backend no file has leaves no point, and says so."""
    out = tmp_path / "validate.json"
    assert main(["validate", str(N2), str(N3), "--machine", str(MACHINE), "--json", str(out), "--baseline",
                 "gloo"]) == 0
    report, text = json.loads(out.read_text()), capsys.readouterr().out
    assert report["baseline"] == "gloo" and "pccl's choice over gloo (speed-up)" in text
    for path, nodes, nbytes in ((N2, 2, 16 << 20), (N3, 3, 16777200)):
        bench = json.loads(path.read_text())
        times = {r["backend"]: r["time_us"] for r in bench if r["collective"] == "all_gather"}
        [trend] = [t for t in report["trends"] if t["collective"] == "all_gather"]
        [point] = [p for p in trend["points"] if p["nodes"] == nodes]
        assert point["baseline"] == "gloo"
        assert point["measured"] == pytest.approx(times["gloo"] / times["pccl"])
        assert point["predicted"] == pytest.approx(predicted_us("all_gather", "vendor", nbytes, nodes, 2)
                                                   / predicted_us("all_gather", "hier:pipelined", nbytes, nodes, 2))
    assert main(["validate", str(N2), str(N3), "--machine", str(MACHINE), "--baseline", "nccl"]) == 0
    text = capsys.readouterr().out
    assert "no nccl row at 2 nodes" in text and "no step checked" in text


def test_sizes_group_only_when_nearly_equal() -> None:
    assert _size_groups([16 << 20, 16777200, 4096, 4080, 16384]) == {
        16 << 20: 16 << 20, 16777200: 16 << 20, 4096: 4096, 4080: 4096, 16384: 16384}


# ---- skipped rows --------------------------------------------------------------------------------------

def test_compressed_rows_are_listed_as_skipped(tmp_path, capsys) -> None:
    report, text = run(tmp_path, capsys, A2A)
    assert len(report["rows"]) == 5
    assert sorted(s["algorithm"] for s in report["skipped"]) == ["hier:mpi+int8", "mpi+bf16", "mpi+fp8", "mpi+int8"]
    assert all("compressed" in s["reason"] for s in report["skipped"])
    assert "skipped row 4: all_to_all 1M 2 x 2 pccl mpi+int8: compressed (+int8)" in text
    assert "# 5 rows priced, 4 skipped" in text
    assert "no direction check" in text


def test_rows_the_model_cannot_price_say_why(tmp_path, capsys) -> None:
    rows = [row("all_gather", "pccl", "ring", 2, 2, 100.0, auto=True),
            row("all_gather", "pccl", "magic", 2, 2, 100.0),
            row("all_gather", "ucc", "native", 2, 2, 100.0),
            row("broadcast", "pccl", "ring", 2, 2, 100.0),
            row("all_gather", "pccl", "ring", 2, 2, 100.0, wrong=3),
            row("all_gather", "pccl", "ring", 2, 2, 0.0)]
    report, text = run(tmp_path, capsys, write(tmp_path, "odd.json", rows))
    assert len(report["rows"]) == 1
    reasons = {s["index"]: s["reason"] for s in report["skipped"]}
    assert sorted(reasons) == [1, 2, 3, 4, 5]
    assert "'magic' is not in the model's all_gather algorithms" in reasons[1]
    assert "backend 'ucc' has no model" in reasons[2]
    assert "collective 'broadcast' has no model" in reasons[3]
    assert "3 wrong elements" in reasons[4]
    assert "not positive" in reasons[5]
    assert text.count("skipped row ") == 5


def test_a_file_that_is_not_pccl_bench_output_is_a_usage_error(tmp_path, capsys) -> None:
    bad = write(tmp_path, "bad.json", [{"collective": "all_gather"}])
    assert main(["validate", str(bad), "--machine", str(MACHINE)]) == 2
    assert "pccl-sim: error: " in capsys.readouterr().err
    yaml_file = MACHINE
    assert main(["validate", str(yaml_file), "--machine", str(MACHINE)]) == 2
    assert "not JSON" in capsys.readouterr().err


# ---- the direction check -------------------------------------------------------------------------------

def bench_with_speedups(speedups: dict[int, float], local: int = 2, nbytes: int = 16 << 20) -> list[dict]:
    """All-gather rows at each node count: gloo as the model predicts it, pccl's hier:ring chosen and measured
    ``speedup`` times faster than gloo."""
    rows = []
    for nodes, speedup in speedups.items():
        gloo = predicted_us("all_gather", "vendor", nbytes, nodes, local)
        rows += [row("all_gather", "gloo", "native", nodes, local, gloo, nbytes=nbytes),
                 row("all_gather", "pccl", "hier:ring", nodes, local, gloo / speedup, nbytes=nbytes, auto=True)]
    return rows


def predicted_speedup(nodes: int, local: int = 2, nbytes: int = 16 << 20) -> float:
    return (predicted_us("all_gather", "vendor", nbytes, nodes, local)
            / predicted_us("all_gather", "hier:ring", nbytes, nodes, local))


def test_direction_right_when_measured_moves_as_predicted(tmp_path, capsys) -> None:
    counts = (2, 3, 5)
    speedups = {n: predicted_speedup(n) * 0.8 for n in counts}  # off by 20%, moving the same way
    files = [write(tmp_path, f"n{n}.json", bench_with_speedups({n: s})) for n, s in speedups.items()]
    report, text = run(tmp_path, capsys, *files)
    [trend] = report["trends"]
    assert [s["verdict"] for s in trend["steps"]] == ["right", "right"]
    assert [p["measured"] for p in trend["points"]] == pytest.approx(list(speedups.values()))
    assert "# direction all_gather: 2 of 2 steps right" in text


def test_direction_wrong_when_measured_moves_against_predicted(tmp_path, capsys) -> None:
    """2 -> 3 nodes: the measured speed-up moves against the model's (wrong); 3 -> 5: with it (right)."""
    predicted = {n: predicted_speedup(n) for n in (2, 3, 5)}
    moves = ["up" if predicted[b] > predicted[a] else "down" for a, b in ((2, 3), (3, 5))]
    against = {"up": 0.8, "down": 1.25}  # measured factor that moves the other way
    measured = {2: 1.5}
    measured[3] = measured[2] * against[moves[0]]
    measured[5] = measured[3] / against[moves[1]]  # the same way as predicted
    files = [write(tmp_path, f"n{n}.json", bench_with_speedups({n: s})) for n, s in measured.items()]
    report, text = run(tmp_path, capsys, *files)
    [trend] = report["trends"]
    steps = [(s["from_nodes"], s["to_nodes"], s["measured"], s["predicted"], s["verdict"]) for s in trend["steps"]]
    opposite = {"up": "down", "down": "up"}
    assert steps == [(2, 3, opposite[moves[0]], moves[0], "wrong"), (3, 5, moves[1], moves[1], "right")]
    assert "# direction all_gather: 1 of 2 steps right (16M 2->3 wrong, 16M 3->5 right)" in text
    assert f"{opposite[moves[0]]}/{moves[0]}: wrong" in text


def test_repeated_runs_at_a_node_count_are_one_median_point(tmp_path, capsys) -> None:
    """Three files at 2 nodes (repeated runs): one point, their median speed-up and range; the step to 3 nodes
    compares that median."""
    files = [write(tmp_path, "a.json", bench_with_speedups({2: 1.5})),
             write(tmp_path, "b.json", bench_with_speedups({2: 1.4})),
             write(tmp_path, "d.json", bench_with_speedups({2: 1.3})),
             write(tmp_path, "c.json", bench_with_speedups({3: 1.45}))]
    report, text = run(tmp_path, capsys, *files)
    [trend] = report["trends"]
    two, three = trend["points"]
    assert (two["runs"], two["measured_low"], two["measured_high"]) == (3, pytest.approx(1.3), pytest.approx(1.5))
    assert two["measured"] == pytest.approx(1.4) and two["source"] == "a.json, b.json, d.json"
    assert two["predicted"] == pytest.approx(predicted_speedup(2))
    assert (three["runs"], three["measured_low"]) == (1, None)
    [step] = trend["steps"]
    assert step["measured"] == "up"  # the median 1.4 -> 1.45 (the first run alone, 1.5, would say down)
    assert "1.40x (1.30-1.50, 3 runs)" in text


def test_steps_within_the_runs_spread_are_unresolved(tmp_path, capsys) -> None:
    """Repeated runs at 2, 3 and 5 nodes: where the measured ranges of two node counts overlap the step is
    unresolved, whatever the medians say, and counted apart; where they are apart, right or wrong as usual."""
    predicted = {n: predicted_speedup(n) for n in (2, 3, 5)}
    moves = ["up" if predicted[b] > predicted[a] else "down" for a, b in ((2, 3), (3, 5))]
    against = {"up": 0.8, "down": 1.25}  # a factor that moves the other way
    runs = {2: (1.50, 1.45, 1.55)}
    # 2 -> 3: medians against the model's move, ranges overlapping (the runs cannot tell the direction)
    third = 1.5 * (0.97 if moves[0] == "up" else 1.03)
    runs[3] = (third, 1.5, 2 * third - 1.5)
    # 3 -> 5: against the model's move again, ranges 20% apart
    runs[5] = tuple(x * against[moves[1]] for x in (third, third * 1.01, third * 0.99))
    files = [write(tmp_path, f"n{n}-{i}.json", bench_with_speedups({n: s}))
             for n, values in runs.items() for i, s in enumerate(values)]
    report, text = run(tmp_path, capsys, *files)
    [trend] = report["trends"]
    assert [s["verdict"] for s in trend["steps"]] == ["unresolved", "wrong"]
    assert "# direction all_gather: 0 of 2 steps right; 1 unresolved: the runs' measured ranges overlap" in text
    assert "(16M 2->3 unresolved, 16M 3->5 wrong)" in text


# ---- the model's limits ----------------------------------------------------------------------------------

def test_one_node(tmp_path, capsys) -> None:
    rows = [row("all_reduce", "pccl", "hier:ring", 1, 4, 500.0, auto=True),
            row("all_reduce", "gloo", "native", 1, 4, 800.0),
            row("all_reduce", "mpi", "native", 1, 4, 900.0)]
    report, text = run(tmp_path, capsys, write(tmp_path, "one-node.json", rows))
    assert len(report["rows"]) == 3 and report["trends"] == []
    assert all(math.isfinite(r["error"]) for r in report["rows"])
    assert find(report["rows"], backend="gloo")["predicted_us"] == pytest.approx(
        predicted_us("all_reduce", "vendor", 1 << 20, 1, 4))
    assert "the rows cover one node count (1): no direction check" in text


def test_one_rank_a_node_and_one_rank_in_all(tmp_path, capsys) -> None:
    """1 x 1, 2 x 1, 3 x 1: on one rank the model prices the flat ring at 0 (no step, no overhead on this
    profile), so that node count has no speed-up, and the check runs from 2 to 3 nodes."""
    assert predicted_us("all_gather", "ring", 1 << 20, 1, 1) == 0
    rows = []
    for nodes in (1, 2, 3):
        rows += [row("all_gather", "pccl", "ring", nodes, 1, 100.0 * nodes, auto=True),
                 row("all_gather", "gloo", "native", nodes, 1, 150.0 * nodes)]
    files = [write(tmp_path, f"n{n}x1.json", [r for r in rows if r["nodes"] == n]) for n in (1, 2, 3)]
    report, text = run(tmp_path, capsys, *files)
    assert len(report["rows"]) == 6
    one = find(report["rows"], backend="pccl", nodes=1)
    assert one["predicted_us"] == 0 and one["error"] == -1.0
    [trend] = report["trends"]
    assert [p["nodes"] for p in trend["points"]] == [2, 3]
    assert "pccl's predicted time is 0 at 1 nodes" in trend["note"]
    assert [(s["from_nodes"], s["to_nodes"]) for s in trend["steps"]] == [(2, 3)]
    assert "2 x 1" in text


def test_plot_of_the_speed_up_against_node_count(tmp_path, capsys) -> None:
    png = tmp_path / "trend.png"
    assert main(["validate", str(N2), str(N3), "--machine", str(MACHINE), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in capsys.readouterr().out
    # One node count: no trend to draw, said as a usage error.
    assert main(["validate", str(N2), "--machine", str(MACHINE), "--plot", str(tmp_path / "none.png")]) == 2
    assert "nothing to plot" in capsys.readouterr().err and not (tmp_path / "none.png").exists()
