"""``pccl-sim step``: a training step predicted from a one-rank run's computation and the model's collectives.

A step is the computation of one rank alone (the step time of a one-rank run of the same model and batch), made
:func:`~pccl_torch.sim.costs.contention` times as long where the ranks share the host's cores, plus the step's
collectives, each call priced on the machine profile at its full-buffer size: gloo's and NCCL's as the vendor
collective, pccl's as the algorithm pccl chooses across a network (``heuristic.networked_choice`` with the
profile's link bandwidth; MPI's own on one node), ``hier:pipelined`` in its best chunk count. The collectives'
calls and sizes come from a run that records them (a torch.distributed run: the example harness's
``call_sizes``); they depend on the model and the framework, not on the backend or the node count.

Part of the communication overlaps the computation (ZeRO-3 prefetches parameters; on shared cores a rank waiting
on the link leaves its core to a computing one): ``step = compute + comm - overlap * min(compute, comm)``, with
``overlap`` (0..1) per backend fitted on the runs at one node count (the fewest, by default) and then held for
the others.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pccl_torch.selection.heuristic import networked_choice
from pccl_torch.sim import costs
from pccl_torch.sim.machine import MachineProfile
from pccl_torch.units import table

VENDOR_BACKENDS = ("gloo", "nccl", "rccl")
"""Run backends priced as the vendor collective; ``pccl`` is priced as pccl's choice."""


@dataclass(frozen=True, slots=True)
class Run:
    """What a training run's JSON (``examples/gpt`` ``--json``) says about its steps."""

    source: str
    backend: str
    nodes: int
    local_size: int
    step_ms: float
    """Median step (slowest rank) over the timed steps."""
    call_sizes: dict[str, dict[int, float]]
    """Calls a step per collective and full-buffer bytes (empty where the run did not record them)."""


@dataclass(frozen=True, slots=True)
class StepPrediction:
    """One run's measured step against the model's."""

    run: Run
    compute_ms: float
    per_collective_ms: dict[str, float]
    overlap: float = 0.0

    @property
    def comm_ms(self) -> float:
        """The step's predicted communication: every collective's."""
        return sum(self.per_collective_ms.values())

    @property
    def predicted_ms(self) -> float:
        return self.compute_ms + self.comm_ms - self.overlap * min(self.compute_ms, self.comm_ms)

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_ms - self.run.step_ms) / self.run.step_ms


def load_run(path: str | Path) -> Run:
    """A training run from its JSON; ValueError when the file is not one."""
    try:
        data = json.loads(Path(path).read_text())
        call_sizes = {c: {int(b): float(n) for b, n in sizes.items()}
                      for c, sizes in data.get("call_sizes", {}).items()}
        return Run(str(path), data["comm"], data["world_size"] // data["local_size"], data["local_size"],
                   float(data["summary"]["step_ms"]), call_sizes)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"{path}: not a training run's JSON (examples/gpt --json): {exc}") from None


def algorithm(backend: str, collective: str, nbytes: int, nodes: int, profile: MachineProfile) -> str:
    """The algorithm a call of ``backend`` is priced as (see the module's docstring)."""
    if backend in VENDOR_BACKENDS:
        return "vendor"
    if backend != "pccl":
        raise ValueError(f"no model of backend {backend!r}: pccl, {', '.join(VENDOR_BACKENDS)}")
    if nodes == 1:
        return "mpi"
    return networked_choice(collective, nbytes, nodes, 1.0 / profile.beta_inter if profile.beta_inter else None,
                            inter_latency_s=profile.link_latency, local_size=profile.ranks_per_node)


def comm_ms(run: Run, sizes: Mapping[str, Mapping[int, float]], profile: MachineProfile) -> dict[str, float]:
    """Predicted milliseconds a step per collective: every call size at its calls a step."""
    out = {}
    for collective, calls in sizes.items():
        out[collective] = 1e3 * sum(
            count * costs.predict(collective, algorithm(run.backend, collective, nbytes, run.nodes, profile),
                                  nbytes, run.nodes, run.local_size, profile)
            for nbytes, count in calls.items())
    return out


def compute_ms(one_rank_step_ms: float, run: Run, profile: MachineProfile) -> float:
    """A rank's computation in ``run``: the one-rank step, stretched where the ranks share the host's cores."""
    return one_rank_step_ms * costs.contention(run.nodes * run.local_size, profile.host_cores)


def fitted_overlap(predictions: Sequence[StepPrediction]) -> float:
    """The overlap (0..1) that makes the median predicted step of ``predictions`` (one backend) the measured one:
    for each, the overlap that would be exact, their median, clamped to [0, 1]."""
    exact = [(p.compute_ms + p.comm_ms - p.run.step_ms) / min(p.compute_ms, p.comm_ms)
             for p in predictions if min(p.compute_ms, p.comm_ms) > 0]
    return min(1.0, max(0.0, statistics.median(exact))) if exact else 0.0


def predict_steps(runs: Sequence[Run], sizes: Mapping[str, Mapping[int, float]], one_rank_step_ms: float,
                  profile: MachineProfile, fit_nodes: int | None = None) -> list[StepPrediction]:
    """Every run's step predicted; the overlap of each backend fitted on its runs at ``fit_nodes`` nodes (default:
    the fewest nodes among the runs) and held for the other node counts."""
    if not runs:
        raise ValueError("no runs to predict")
    if not sizes:
        raise ValueError("no call sizes: give a run that recorded them (a torch.distributed run, e.g. gloo's)")
    fit_nodes = fit_nodes if fit_nodes is not None else min(r.nodes for r in runs)
    raw = [StepPrediction(r, compute_ms(one_rank_step_ms, r, profile), comm_ms(r, sizes, profile)) for r in runs]
    overlap = {}
    for backend in dict.fromkeys(r.backend for r in runs):
        fitted_on = [p for p in raw if p.run.backend == backend and p.run.nodes == fit_nodes]
        if not fitted_on:
            raise ValueError(f"no {backend} run at {fit_nodes} nodes to fit its overlap on")
        overlap[backend] = fitted_overlap(fitted_on)
    return [replace(p, overlap=overlap[p.run.backend]) for p in raw]


def format_steps(predictions: Sequence[StepPrediction], fit_nodes: int) -> str:
    """The table of runs, measured and predicted, and the error summary of the runs not fitted on."""
    header = ("run", "backend", "nodes x local", "compute(ms)", "comm(ms)", "overlap", "predicted(ms)",
              "measured(ms)", "error")
    rows = [("/".join(Path(p.run.source).parts[-2:]), p.run.backend, f"{p.run.nodes} x {p.run.local_size}",
             f"{p.compute_ms:.0f}",
             f"{p.comm_ms:.0f}", f"{p.overlap:.2f}", f"{p.predicted_ms:.0f}", f"{p.run.step_ms:.0f}",
             f"{p.error:+.1%}") for p in sorted(predictions, key=lambda p: (p.run.nodes, p.run.backend))]
    lines = table(header, rows, "<<>>>>>>>")
    held = [p for p in predictions if p.run.nodes != fit_nodes]
    if held:
        errors = [abs(p.error) for p in held]
        lines.append(f"# {len(held)} runs not fitted on (overlap fitted at {fit_nodes} nodes): median |error| "
                     f"{statistics.median(errors):.1%}, worst {max(errors):.1%}")
    return "\n".join(lines)


def to_json(predictions: Sequence[StepPrediction]) -> list[dict[str, Any]]:
    return [{"source": p.run.source, "backend": p.run.backend, "nodes": p.run.nodes, "local_size": p.run.local_size,
             "measured_ms": p.run.step_ms, "compute_ms": p.compute_ms, "comm_ms": p.comm_ms, "overlap": p.overlap,
             "per_collective_ms": p.per_collective_ms, "predicted_ms": p.predicted_ms, "error": p.error}
            for p in predictions]
