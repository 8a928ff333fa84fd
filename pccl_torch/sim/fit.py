"""Fit a machine profile to pccl-bench measurements.

Every cost is linear in the parameters (``costs.Terms``), so each measured row gives one equation
``terms(row) . params = time``. Rows are divided by their measured time, so the least-squares fit
minimises the *relative* error (small messages count as much as large ones), and the parameters are
kept non-negative (``scipy.optimize.nnls``). A parameter that no row depends on (an all-zero column:
e.g. ``alpha_vendor_step`` when every row ran on one node) keeps the base profile's value, or 0.

The machine's topology is given, not fitted: NICs a node, the cores the ranks share (``host_cores``), the vendor
library. The vendor library's ring and MPI cross the same node links, so by default (``tie_links``) the vendor's
bytes across nodes are priced on the NICs MPI uses, striped over all of them (``beta_vendor_inter = beta_inter /
nics_per_node``): one link parameter instead of two that the fit could trade against each other.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import nnls

from pccl_torch.plan import PIPELINED
from pccl_torch.sim.costs import Terms, profile_terms
from pccl_torch.sim.machine import PARAMS, TOPOLOGY_KEYS, VENDOR_LIBRARIES, MachineProfile
from pccl_torch.sim.pipeline import predict_as_run

BASELINES = {"gloo": "vendor", "nccl": "vendor", "rccl": "vendor", "mpi": "mpi"}
"""pccl-bench baseline backends and the pccl algorithm each one is modelled as."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One usable measurement: what ran, where, and its median time in seconds."""

    collective: str
    algorithm: str
    nbytes: int
    nodes: int
    local_size: int
    seconds: float
    chunks: int | None = None
    """A pipelined row's chunk count as pccl-bench recorded it (None: not recorded, pccl's rule)."""


@dataclass(frozen=True, slots=True)
class AlgorithmError:
    """Relative prediction errors |pred - meas| / meas of one (collective, algorithm)."""

    collective: str
    algorithm: str
    count: int
    median: float
    max: float


@dataclass(frozen=True, slots=True)
class FitReport:
    """How well the fitted profile reproduces the rows it was fitted on."""

    per_algorithm: list[AlgorithmError]
    count: int
    median: float
    max: float
    fitted: tuple[str, ...]
    """Parameters determined by the rows."""
    kept: tuple[str, ...]
    """Parameters no row depends on, kept from the base profile (or 0)."""


ROW_KEYS = ("backend", "algorithm", "collective", "size_bytes", "nodes", "local_size", "time_us")
"""The pccl-bench JSON fields a fit reads."""


def missing_keys(row: object) -> list[str]:
    """The :data:`ROW_KEYS` a pccl-bench row lacks (all of them for something that is not a mapping)."""
    return [key for key in ROW_KEYS if key not in row] if isinstance(row, Mapping) else list(ROW_KEYS)


def modelled_algorithm(row: Mapping[str, Any]) -> str | None:
    """The algorithm the model prices a pccl-bench row as: pccl's as it ran, a baseline's pccl equivalent
    (:data:`BASELINES`); None for a backend the model has no equivalent of."""
    return row["algorithm"] if row["backend"] == "pccl" else BASELINES.get(row["backend"])


def samples(rows: Iterable[Mapping[str, Any]], *, pipelined: bool = False) -> list[Sample]:
    """The rows ``fit`` uses: pccl rows as run, baselines as their pccl equivalent; rows with wrong
    results are dropped, and so are pipelined rows (their time is a max over phases, not linear in the
    parameters; ``costs.pipelined_time`` predicts them from the fitted ones) and compressed rows (``compression``
    set: their algorithm is named without the wire format, and the model does not price encoding).
    ``pipelined``: the pipelined rows instead (what ``chunk_overhead`` is fitted on)."""
    out = []
    for index, row in enumerate(rows):
        missing = missing_keys(row)
        if missing:
            raise ValueError(f"row {index} is not a pccl-bench row: missing {', '.join(missing)} "
                             "(fit reads pccl-bench --json output)")
        algorithm = modelled_algorithm(row)
        if algorithm is None:
            continue
        # wrong -1: not checked
        if row.get("wrong", 0) > 0 or algorithm.endswith(":" + PIPELINED) != pipelined or row.get("compression"):
            continue
        out.append(Sample(row["collective"], algorithm, int(row["size_bytes"]), int(row["nodes"]),
                          int(row["local_size"]), float(row["time_us"]) * 1e-6, row.get("chunks")))
    return out


def measured_vendor_library(rows: Iterable[Mapping[str, Any]]) -> str | None:
    """The vendor library whose baseline the rows measured, when they measured exactly one (gloo on a CPU
    machine, NCCL or RCCL on a GPU one), else None."""
    found = {row.get("backend") for row in rows} & set(VENDOR_LIBRARIES)
    return found.pop() if len(found) == 1 else None


TIED = ("beta_vendor_inter", "beta_inter")
"""With ``tie_links``: the first parameter is fitted as the second divided by ``nics_per_node``."""


def fit(rows: Iterable[Mapping[str, Any]], base: MachineProfile | None = None, *, name: str = "fitted",
        nics_per_node: int | None = None, host_cores: int | None = None, vendor_library: str | None = None,
        tie_links: bool = True) -> tuple[MachineProfile, FitReport]:
    """Fit every parameter the rows determine; returns the profile and its error report.

    ``ranks_per_node`` is the rows' most common ``local_size``. The topology (``nics_per_node``, ``host_cores``,
    ``vendor_library``) is as given, else the base profile's, else ``ranks_per_node`` NICs (no NIC contention),
    no shared cores and the vendor library the rows measured (:func:`measured_vendor_library`), else NCCL.
    """
    rows = list(rows)
    data = samples(rows)
    if not data:
        raise ValueError("no usable rows: fit needs pccl-bench rows of backend 'pccl', "
                         f"{', '.join(repr(b) for b in BASELINES)} without wrong results")
    ranks_per_node = Counter(s.local_size for s in data).most_common(1)[0][0]
    topology = {key: getattr(base, key) for key in TOPOLOGY_KEYS} if base else {}
    if not base and vendor_library is None:
        vendor_library = measured_vendor_library(rows)
    topology.update((key, value) for key, value in (("host_cores", host_cores), ("vendor_library", vendor_library))
                    if value is not None)
    shape = MachineProfile(name=name, ranks_per_node=ranks_per_node,
                           nics_per_node=nics_per_node or (base.nics_per_node if base else ranks_per_node),
                           **topology, **{p: 0.0 for p in PARAMS})
    design = np.array([_terms(s, shape).vector() for s in data])
    columns = list(PARAMS)
    tied, into = TIED
    if tie_links:
        design[:, columns.index(into)] += design[:, columns.index(tied)] / shape.nics_per_node
        design = np.delete(design, columns.index(tied), axis=1)
        columns.remove(tied)
    measured = np.array([s.seconds for s in data])
    if np.any(measured <= 0):
        raise ValueError("every row needs time_us > 0")
    weighted = design / measured[:, None]  # relative error: each equation scaled to 1
    norms = np.linalg.norm(weighted, axis=0)
    active = norms > 0
    scaled, _ = nnls(weighted[:, active] / norms[active], np.ones(len(data)))
    values = {p: (getattr(base, p) if base else 0.0) for p in PARAMS}
    values.update(zip(np.array(columns)[active], scaled / norms[active]))
    fitted = [p for p, a in zip(columns, active) if a]
    kept = [p for p, a in zip(columns, active) if not a]
    hosts = ", ".join(sorted({str(r.get("hostname")) for r in rows if r.get("hostname")})) or "unknown host"
    sources = {p: f"fitted by pccl-sim to {len(data)} pccl-bench rows ({hosts})" for p in fitted}
    sources.update({p: f"no row depends on it: kept from {base.name}" if base else "no row depends on it: 0"
                    for p in kept})
    if tie_links:
        values[tied] = values[into] / shape.nics_per_node
        sources[tied] = f"{into} / nics_per_node ({sources[into]})"
        (fitted if into in fitted else kept).append(tied)
    profile = replace(shape, sources=sources, **{p: float(values[p]) for p in PARAMS})
    piped = samples(rows, pipelined=True)
    if base is not None:
        profile = replace(profile, chunk_overhead=base.chunk_overhead)
        sources.setdefault("chunk_overhead", base.sources.get("chunk_overhead", f"kept from {base.name}"))
    if any(s.seconds <= 0 for s in piped):
        raise ValueError("every row needs time_us > 0")
    if piped:
        overhead, error = fit_chunk_overhead(piped, profile)
        sources["chunk_overhead"] = (f"fitted by pccl-sim to {len(piped)} pipelined pccl-bench rows ({hosts}), "
                                     f"after the others: mean |error| {error:.1%}")
        profile = replace(profile, chunk_overhead=overhead, sources=sources)
    return profile, report(data, profile, tuple(fitted), tuple(kept))


CHUNK_OVERHEAD_GRID = np.arange(0, 501) * 1e-5
"""The ``chunk_overhead`` values the fit tries: 0 to 5 ms a phase and chunk, in steps of 10 us."""


def fit_chunk_overhead(data: list[Sample], profile: MachineProfile) -> tuple[float, float]:
    """The :data:`CHUNK_OVERHEAD_GRID` value of least mean |relative error| over pipelined rows, each priced in
    the chunks pccl cut it into (``pipeline.predict_as_run``); and that error. Fitted after the linear parameters,
    which are held: the pipelined rows are the ones the linear fit leaves out (a max over phases), and one
    parameter on a grid is simple and bounded (a time is affine in it, so the least mean |relative error| is also
    a weighted median of per-row values; the grid keeps it at 10 us steps, at most 5 ms)."""
    def error(overhead: float) -> float:
        trial = replace(profile, chunk_overhead=float(overhead))
        return statistics.fmean(abs(predict_as_run(s.collective, s.algorithm, s.nbytes, s.nodes, s.local_size, trial,
                                                   s.chunks) - s.seconds) / s.seconds for s in data)

    best = min(CHUNK_OVERHEAD_GRID, key=error)
    return float(best), error(best)


def _terms(s: Sample, profile: MachineProfile) -> Terms:
    return profile_terms(s.collective, s.algorithm, s.nbytes, s.nodes, s.local_size, profile)


def report(data: list[Sample], profile: MachineProfile, fitted: tuple[str, ...] = PARAMS,
           kept: tuple[str, ...] = ()) -> FitReport:
    """Relative errors of ``profile``'s predictions on ``data``, per (collective, algorithm) and overall."""
    errors: dict[tuple[str, str], list[float]] = {}
    for s in data:
        pred = _terms(s, profile).time(profile)
        errors.setdefault((s.collective, s.algorithm), []).append(abs(pred - s.seconds) / s.seconds)
    per = [AlgorithmError(c, a, len(e), statistics.median(e), max(e)) for (c, a), e in errors.items()]
    every = [x for e in errors.values() for x in e]
    return FitReport(per, len(every), statistics.median(every), max(every), fitted, kept)


def format_report(rep: FitReport) -> str:
    """The report as a table: rows, median and max relative error per algorithm, then overall."""
    lines = [f"{'collective':<16}{'algorithm':<26}{'rows':>6}{'median err':>12}{'max err':>10}"]
    for e in sorted(rep.per_algorithm, key=lambda e: (e.collective, e.algorithm)):
        lines.append(f"{e.collective:<16}{e.algorithm:<26}{e.count:>6}{e.median:>12.1%}{e.max:>10.1%}")
    lines.append(f"{'overall':<42}{rep.count:>6}{rep.median:>12.1%}{rep.max:>10.1%}")
    lines.append(f"fitted: {', '.join(rep.fitted) or 'none'}")
    if rep.kept:
        lines.append(f"kept (no row depends on them): {', '.join(rep.kept)}")
    return "\n".join(lines)
