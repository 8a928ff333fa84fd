"""``pccl-sim validate``: the cost model's predictions against pccl-bench measurements.

Every row the model can price is predicted on the machine profile at the row's bytes and layout: a pccl row
as the algorithm it ran (``hier:*``, ``mpi``, ``vendor``, the flat family; ``hier:pipelined`` in the chunks pccl
cut it into, the row's ``chunks`` where pccl-bench recorded it, ``pipeline.predict_as_run``), a baseline as the pccl algorithm the fit models it as
(:data:`~pccl_torch.sim.fit.BASELINES`: ``mpi`` -> MPI's own collective, ``gloo``/``nccl``/``rccl`` -> the
vendor collective). Its error is ``(predicted - measured) / measured``. Rows the model cannot price are listed
with the reason: compressed rows (the model does not price the encoding), rows with wrong results, unknown
backends, collectives or algorithm names.

The direction check, where the rows cover more than one node count: at each node count, pccl's speed-up is the
best baseline's time over pccl's choice (the auto row), measured and predicted (the least predicted time of the
same baseline rows over the auto row's predicted time); or, with ``baseline``, that one backend's (``gloo``: the
vendor library the fit models, the baseline of the at-scale figures). For each collective and size (sizes within
:data:`SAME_SIZE` of each other are one size: pccl-bench rounds the buffer to whole elements a rank, so 16M on
3 x 2 ranks is 16,777,200 bytes) present at several node counts with the same ranks a node, each step between
consecutive node counts is ``right`` when the predicted speed-up moves the way the measured one does (up,
down or flat), else ``wrong``. Several files at one node count are repeated runs: the point is their median
speed-up, measured and predicted, with the measured range (a single run's best baseline can flip on one noisy
row: MPICH's 16 MiB all-reduce on the 1 Gbit/s testbed took 172-217 ms in four runs of one day). Where both
points of a step are repeated runs and their measured ranges overlap, the runs do not tell which way the
speed-up moved: the step is ``unresolved`` (:data:`UNRESOLVED`), counted apart from right and wrong.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pccl_torch.algorithms import COLLECTIVES
from pccl_torch.sim import costs
from pccl_torch.sim.pipeline import predict_as_run
from pccl_torch.sim.fit import BASELINES, missing_keys, modelled_algorithm
from pccl_torch.sim.machine import MachineProfile
from pccl_torch.units import format_size, table

SAME_SIZE = 0.01
"""Relative difference under which two buffer sizes count as one size in the direction check."""
UNRESOLVED = "unresolved"
"""The verdict of a step whose two points' measured ranges (repeated runs) overlap."""


@dataclass(frozen=True, slots=True)
class Row:
    """Where a bench row comes from and what ran: the fields a priced and a skipped row share."""

    source: str
    """The bench file the row came from."""
    index: int
    """The row's position in its file (from 0)."""
    collective: str
    nbytes: int
    nodes: int
    local_size: int
    backend: str
    """``pccl`` or the baseline's backend (``gloo``, ``mpi``, ...)."""
    algorithm: str
    """Priced: pccl's as run, a baseline's model (``vendor``, ``mpi``); skipped: as the bench named it, a
    compressed row's with ``+format``."""


@dataclass(frozen=True, slots=True)
class Priced(Row):
    """One measured row and the model's time for it."""

    auto: bool
    """pccl's own choice (the bench's auto row)."""
    measured_us: float
    predicted_us: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_us - self.measured_us) / self.measured_us

    @property
    def label(self) -> str:
        if self.backend != "pccl":
            return f"{self.backend} as {self.algorithm}"
        return f"pccl {self.algorithm} (auto)" if self.auto else f"pccl {self.algorithm}"

    def describe(self) -> str:
        """Which row this is, in one phrase: collective, size, layout, backend and algorithm, file."""
        return (f"{self.collective} {format_size(self.nbytes)} {self.nodes}x{self.local_size} {self.label}, "
                f"{Path(self.source).name}")


@dataclass(frozen=True, slots=True)
class Skipped(Row):
    """A row the model cannot price, and why."""

    reason: str


@dataclass(frozen=True, slots=True)
class SpeedupPoint:
    """pccl's choice against the best baseline at one node count: one bench file, or the median of repeated
    runs (several files at that node count)."""

    nodes: int
    source: str
    algorithm: str
    """pccl's choice (the auto row's algorithm; the most common one over repeated runs)."""
    baseline: str
    """The measured-best baseline's backend (the most common one over repeated runs)."""
    measured: float
    """Best baseline time / pccl's time, measured (> 1: pccl faster); the median over repeated runs."""
    predicted: float
    """Least predicted time of the same baselines / pccl's predicted time; the median over repeated runs."""
    runs: int = 1
    """How many bench files (repeated runs) the point is the median of."""
    measured_low: float | None = None
    """The least measured speed-up of the runs (None: one run)."""
    measured_high: float | None = None
    """The greatest measured speed-up of the runs (None: one run)."""

    def overlaps(self, other: "SpeedupPoint") -> bool:
        """Whether both points are repeated runs whose measured ranges overlap: which way the speed-up moved
        between them is then within the runs' spread."""
        if self.measured_low is None or self.measured_high is None or other.measured_low is None \
                or other.measured_high is None:
            return False
        return self.measured_low <= other.measured_high and other.measured_low <= self.measured_high

    def measured_text(self) -> str:
        """The measured speed-up, with the runs' range when there are several."""
        if self.runs == 1:
            return f"{self.measured:.2f}x"
        return f"{self.measured:.2f}x ({self.measured_low:.2f}-{self.measured_high:.2f}, {self.runs} runs)"


@dataclass(frozen=True, slots=True)
class Step:
    """How the speed-up moves from one node count to the next."""

    from_nodes: int
    to_nodes: int
    measured: str
    """``up``, ``down`` or ``flat``."""
    predicted: str
    verdict: str
    """``right`` when both move the same way, else ``wrong``; :data:`UNRESOLVED` when the measured ranges of
    the two points overlap (see :meth:`SpeedupPoint.overlaps`)."""


@dataclass(frozen=True, slots=True)
class Trend:
    """The speed-up of one collective and size against the node count, measured and predicted."""

    collective: str
    nbytes: int
    """The largest of the sizes grouped as one (see :data:`SAME_SIZE`)."""
    local_size: int
    points: list[SpeedupPoint]
    steps: list[Step]
    note: str = ""
    """Why there are no steps, or which node counts had no usable point."""


@dataclass(frozen=True, slots=True)
class Summary:
    """Absolute relative errors of a set of priced rows."""

    count: int
    median: float
    worst: float
    worst_row: str


@dataclass(frozen=True, slots=True)
class Validation:
    """Everything ``pccl-sim validate`` reports."""

    machine: str
    sources: list[str]
    priced: list[Priced]
    skipped: list[Skipped]
    node_counts: list[int]
    """The node counts of the priced rows."""
    trends: list[Trend] = field(default_factory=list)
    baseline: str | None = None
    """The backend the speed-ups are over (None: the best baseline at each point)."""

    def summary(self, collective: str | None = None) -> Summary | None:
        """Median and worst |error| over every priced row, or ``collective``'s (None: no row)."""
        rows = [r for r in self.priced if collective is None or r.collective == collective]
        if not rows:
            return None
        worst = max(rows, key=lambda r: abs(r.error))
        return Summary(len(rows), statistics.median(abs(r.error) for r in rows), abs(worst.error), worst.describe())


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of one pccl-bench ``--json`` file; ValueError when it is not one."""
    try:
        rows = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc}); validate reads pccl-bench --json output") from None
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a JSON list of pccl-bench rows")
    for index, row in enumerate(rows):
        missing = missing_keys(row)
        if missing:
            raise ValueError(f"{path}: row {index} is not a pccl-bench row: missing {', '.join(missing)} "
                             "(validate reads pccl-bench --json output)")
    return rows


def _why_not(row: Mapping[str, Any]) -> str | None:
    """Why the model cannot price ``row`` (None: it can)."""
    backend, collective = row["backend"], row["collective"]
    if modelled_algorithm(row) is None:
        return f"backend {backend!r} has no model (pccl, {', '.join(BASELINES)})"
    if collective not in COLLECTIVES:
        return f"collective {collective!r} has no model"
    if row.get("compression"):
        return f"compressed (+{row['compression']}): the model does not price the encoding"
    if row.get("wrong", 0) > 0:
        return f"{row['wrong']} wrong elements: the time is of a broken run"
    if float(row["time_us"]) <= 0:
        return "measured time is not positive"
    if backend == "pccl" and row["algorithm"] not in costs.algorithms(collective):
        return f"algorithm {row['algorithm']!r} is not in the model's {collective} algorithms"
    return None


def price(rows: Iterable[Mapping[str, Any]], profile: MachineProfile,
          source: str = "") -> tuple[list[Priced], list[Skipped]]:
    """Each row of one bench file priced on ``profile``, or skipped with the reason."""
    priced, skipped = [], []
    for index, row in enumerate(rows):
        where = (source, index, row["collective"], int(row["size_bytes"]), int(row["nodes"]), int(row["local_size"]),
                 row["backend"])
        reason = _why_not(row)
        if reason:
            name = row["algorithm"] + (f"+{row['compression']}" if row.get("compression") else "")
            skipped.append(Skipped(*where, name, reason))
            continue
        algorithm = modelled_algorithm(row)
        seconds = predict_as_run(row["collective"], algorithm, int(row["size_bytes"]), int(row["nodes"]),
                                 int(row["local_size"]), profile, row.get("chunks"))
        priced.append(Priced(*where, algorithm, bool(row["auto"]) and row["backend"] == "pccl",
                             float(row["time_us"]), seconds * 1e6))
    return priced, skipped


def _size_groups(sizes: Iterable[int]) -> dict[int, int]:
    """Each size -> the largest size of its group (sorted sizes within :data:`SAME_SIZE` of the group's largest)."""
    out: dict[int, int] = {}
    group: list[int] = []
    for size in sorted(set(sizes), reverse=True):
        if group and (group[0] - size) > SAME_SIZE * group[0]:
            group = []
        group.append(size)
        out[size] = group[0]
    return out


def _point(rows: list[Priced], baseline: str | None = None) -> SpeedupPoint | str:
    """pccl's speed-up at one (file, collective, size, layout) over the best baseline, or over ``baseline``'s
    rows only; or why there is none."""
    autos = [r for r in rows if r.auto]
    baselines = [r for r in rows if r.backend != "pccl" and baseline in (None, r.backend)]
    nodes = rows[0].nodes
    if len(autos) != 1:
        return f"{'no' if not autos else len(autos)} auto rows at {nodes} nodes"
    if not baselines:
        return f"no {baseline or 'baseline'} row at {nodes} nodes"
    auto = autos[0]
    if auto.predicted_us <= 0:
        return f"pccl's predicted time is 0 at {nodes} nodes"
    best = min(baselines, key=lambda r: r.measured_us)
    return SpeedupPoint(nodes, auto.source, auto.algorithm, best.backend, best.measured_us / auto.measured_us,
                        min(r.predicted_us for r in baselines) / auto.predicted_us)


def _median_point(points: list[SpeedupPoint]) -> SpeedupPoint:
    """One point for repeated runs at a node count: median speed-ups, the most common choice and baseline."""
    if len(points) == 1:
        return points[0]
    measured = [p.measured for p in points]

    def most_common(values: Iterable[str]) -> str:
        return Counter(values).most_common(1)[0][0]

    return SpeedupPoint(points[0].nodes, ", ".join(Path(p.source).name for p in points),
                        most_common(p.algorithm for p in points), most_common(p.baseline for p in points),
                        statistics.median(measured), statistics.median(p.predicted for p in points),
                        len(points), min(measured), max(measured))


def _move(before: float, after: float) -> str:
    return "up" if after > before else "down" if after < before else "flat"


def _step(a: SpeedupPoint, b: SpeedupPoint) -> Step:
    """How the speed-up moves from point ``a`` to point ``b`` (more nodes), and the verdict on the prediction."""
    measured, predicted = _move(a.measured, b.measured), _move(a.predicted, b.predicted)
    verdict = UNRESOLVED if a.overlaps(b) else "right" if measured == predicted else "wrong"
    return Step(a.nodes, b.nodes, measured, predicted, verdict)


def trends(priced: list[Priced], baseline: str | None = None) -> list[Trend]:
    """For every (collective, size, ranks a node) priced at more than one node count: the speed-up (over the best
    baseline, or ``baseline``) at each node count and whether the predicted one moves the way the measured one
    does between consecutive counts."""
    nominal = {c: _size_groups(r.nbytes for r in priced if r.collective == c) for c in {r.collective for r in priced}}
    cells: dict[tuple[str, int, int], dict[tuple[int, str], list[Priced]]] = {}
    for r in priced:
        key = (r.collective, nominal[r.collective][r.nbytes], r.local_size)
        cells.setdefault(key, {}).setdefault((r.nodes, r.source), []).append(r)
    out = []
    for (collective, nbytes, local), by_point in cells.items():
        counts = sorted({nodes for nodes, _ in by_point})
        if len(counts) < 2:
            continue
        notes, points = [], []
        for nodes in counts:
            found = [_point(rows, baseline) for (n, _), rows in by_point.items() if n == nodes]
            notes += [p for p in found if isinstance(p, str)]
            usable = [p for p in found if not isinstance(p, str)]
            if usable:
                points.append(_median_point(usable))
        steps = [_step(a, b) for a, b in zip(points, points[1:])]
        if len(points) < 2:
            notes.append("fewer than 2 node counts usable: no direction")
        out.append(Trend(collective, nbytes, local, points, steps, "; ".join(notes)))
    order = {c: i for i, c in enumerate(COLLECTIVES)}
    return sorted(out, key=lambda t: (order[t.collective], t.nbytes, t.local_size))


def validate(benches: Iterable[tuple[str, list[Mapping[str, Any]]]], profile: MachineProfile,
             baseline: str | None = None) -> Validation:
    """Price the rows of each ``(source, rows)`` bench file on ``profile`` and check the direction of the speed-up
    over the best baseline, or over ``baseline`` (a backend such as ``gloo``)."""
    priced: list[Priced] = []
    skipped: list[Skipped] = []
    sources = []
    for source, rows in benches:
        sources.append(source)
        p, s = price(rows, profile, source)
        priced += p
        skipped += s
    counts = sorted({r.nodes for r in priced})
    return Validation(profile.name, sources, priced, skipped, counts,
                      trends(priced, baseline) if len(counts) > 1 else [], baseline)


def _percent(x: float) -> str:
    return f"{x:+.1%}"


def format_validation(v: Validation) -> str:
    """The report: per file a table of the priced rows, the skipped rows, the error footer, the direction check."""
    lines = [f"# pccl-sim validate on {v.machine}: error = (predicted - measured) / measured"]
    header = ("collective", "size", "nodes x local", "backend/algorithm", "measured(us)", "predicted(us)", "error")
    for source in v.sources:
        rows = [r for r in v.priced if r.source == source]
        lines += ["", f"## {source}: {len(rows)} rows priced"]
        if rows:
            lines += table(header, [(r.collective, format_size(r.nbytes), f"{r.nodes} x {r.local_size}", r.label,
                                     f"{r.measured_us:.1f}", f"{r.predicted_us:.1f}", _percent(r.error)) for r in rows],
                           "<>><>>>")
        for s in (s for s in v.skipped if s.source == source):
            lines.append(f"skipped row {s.index}: {s.collective} {format_size(s.nbytes)} {s.nodes} x {s.local_size} "
                         f"{s.backend} {s.algorithm}: {s.reason}")
    lines += ["", f"# {len(v.priced)} rows priced, {len(v.skipped)} skipped"]
    total = v.summary()
    if total is None:
        lines.append("# no row priced")
    else:
        lines.append(f"# median |error| {total.median:.1%}, worst {total.worst:.1%} ({total.worst_row})")
        for collective in dict.fromkeys(r.collective for r in v.priced):
            s = v.summary(collective)
            assert s is not None
            lines.append(f"#  {collective:<15} {s.count:>3} rows  median |error| {s.median:6.1%}  "
                         f"worst {s.worst:6.1%} ({s.worst_row})")
    lines += ["", *format_direction(v)]
    return "\n".join(lines)


def _over(v: Validation) -> str:
    return v.baseline or "the best baseline"


def format_direction(v: Validation) -> list[str]:
    """The direction check: one table of speed-ups per (collective, size), then a line per collective."""
    if len(v.node_counts) < 2:
        counts = ", ".join(map(str, v.node_counts)) or "none"
        return [f"# direction: the rows cover one node count ({counts}): no direction check"]
    if not v.trends:
        return ["# direction: no collective and size at more than one node count"]
    lines = [f"# direction: pccl's choice over {_over(v)} (speed-up) against the node count"]
    header = ("collective", "size", "nodes x local", "pccl's choice", "baseline", "measured", "predicted",
              "moves (measured/predicted)")
    rows = []
    for t in (t for t in v.trends if t.steps):
        for i, p in enumerate(t.points):
            step = t.steps[i - 1] if i else None
            move = f"{step.measured}/{step.predicted}: {step.verdict}" if step else ""
            rows.append((t.collective, format_size(t.nbytes), f"{p.nodes} x {t.local_size}", p.algorithm, p.baseline,
                         p.measured_text(), f"{p.predicted:.2f}x", move))
    lines += table(header, rows, "<>><<>><") if rows else []
    for t in v.trends:
        if t.note:
            lines.append(f"{t.collective} {format_size(t.nbytes)}, {t.local_size} ranks a node: {t.note}")
    for collective in dict.fromkeys(t.collective for t in v.trends):
        steps = [(t, s) for t in v.trends if t.collective == collective for s in t.steps]
        verdicts = Counter(s.verdict for _, s in steps)
        unresolved = (f"; {verdicts[UNRESOLVED]} {UNRESOLVED}: the runs' measured ranges overlap"
                      if verdicts[UNRESOLVED] else "")
        detail = ", ".join(f"{format_size(t.nbytes)} {s.from_nodes}->{s.to_nodes} {s.verdict}" for t, s in steps)
        lines.append(f"# direction {collective}: {verdicts['right']} of {len(steps)} steps right{unresolved} "
                     f"({detail})" if steps else f"# direction {collective}: no step checked")
    return lines


def plot_trends(v: Validation, path: str | Path) -> Path:
    """pccl's speed-up over the best baseline (or ``v.baseline``) against the node count, measured (solid;
    repeated runs: their median, the range as an error bar) and predicted (dashed), one panel per collective and a
    line pair per size; ValueError when no trend has two points."""
    trends = [t for t in v.trends if len(t.points) > 1]
    if not trends:
        raise ValueError("no collective and size at two or more node counts: nothing to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collectives = list(dict.fromkeys(t.collective for t in trends))
    fig, axes = plt.subplots(1, len(collectives), figsize=(4.5 * len(collectives), 3.8), squeeze=False)
    for ax, collective in zip(axes[0], collectives):
        for i, t in enumerate(t for t in trends if t.collective == collective):
            nodes = [p.nodes for p in t.points]
            color = f"C{i}"
            label = f"{format_size(t.nbytes)}, {t.local_size} a node"
            measured = [p.measured for p in t.points]
            spread = [[m - (p.measured_low if p.measured_low is not None else m) for m, p in zip(measured, t.points)],
                      [(p.measured_high if p.measured_high is not None else m) - m for m, p in zip(measured, t.points)]]
            ax.errorbar(nodes, measured, yerr=spread, fmt="-o", color=color, capsize=3, label=f"{label}: measured")
            ax.plot(nodes, [p.predicted for p in t.points], "--x", color=color, label=f"{label}: predicted")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set(title=collective, xlabel="nodes", ylabel=f"speed-up over {_over(v)}")
        ax.set_xticks(sorted({p.nodes for t in trends for p in t.points}))
        ax.legend(fontsize="x-small")
    fig.suptitle(f"measured (solid) and predicted (dashed, {v.machine}) speed-up against node count")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def to_json(v: Validation) -> dict[str, Any]:
    """The report as JSON-ready data: every priced row with its error, the skipped rows, the summaries, the trends."""
    def summary(s: Summary | None) -> dict[str, Any] | None:
        return asdict(s) if s else None

    return {
        "machine": v.machine,
        "sources": v.sources,
        "rows": [asdict(r) | {"error": r.error} for r in v.priced],
        "skipped": [asdict(s) for s in v.skipped],
        "summary": summary(v.summary()),
        "per_collective": {c: summary(v.summary(c)) for c in dict.fromkeys(r.collective for r in v.priced)},
        "node_counts": v.node_counts,
        "baseline": v.baseline,
        "trends": [asdict(t) for t in v.trends],
    }
