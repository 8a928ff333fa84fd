"""What ``pccl-sim validate`` leaves unexplained across a link with latency, and how much of it is run-to-run noise.

Reads ``pccl-sim validate --json`` outputs (one per run) and prints, per group of runs:

- the residual per inter-node step, ``(measured - predicted) / steps``, median over calls of at most ``--upto``
  bytes (all-gather, reduce-scatter, all-reduce; not pipelined calls, whose steps overlap), for gloo (``vendor``),
  MPI's own collectives and pccl's schedules. A cost each step pays that the model lacks shows up here as a
  constant over round trips; one that shrinks as the round trip grows is not a per-step constant;
- the noise floor: the median of ``|run - median of the other runs| / run`` over the calls the runs share, the
  error a model that knew every call's typical time would still show on one run.

    python benchmarks/latency_residuals.py --machine tb1g-fitted.yaml 1ms=a.json,b.json,c.json 20ms=d.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

from pccl_torch.sim import costs, machine
from pccl_torch.sim.costs import WIRE_LATENCIES_PER_STEP
from pccl_torch.units import parse_size

Key = tuple[str, int, int, int, str, str]


def _algorithm(row: dict) -> str:
    """The algorithm the model priced the row as (baselines run their own library's)."""
    return row["algorithm"] if row["backend"] == "pccl" else "vendor" if row["backend"] == "gloo" else "mpi"


def _family(algorithm: str) -> str:
    return {"vendor": "gloo", "mpi": "mpi-own"}.get(algorithm, "pccl")


def inter_steps(row: dict, profile: machine.MachineProfile) -> float:
    """Message steps of the row's schedule that cross nodes (each pays a round trip of the wire)."""
    terms = costs.profile_terms(row["collective"], _algorithm(row), row["nbytes"], row["nodes"], row["local_size"],
                                profile)
    return terms["link_latency"] / WIRE_LATENCIES_PER_STEP


def step_residuals(rows: list[dict], profile: machine.MachineProfile, upto: int) -> dict[str, list[float]]:
    """Seconds per inter-node step the model under-prices, by family, for small latency-bound calls."""
    out: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        algorithm = _algorithm(row)
        if row["nbytes"] > upto or row["collective"] == "all_to_all" or algorithm.endswith("pipelined"):
            continue
        steps = inter_steps(row, profile)
        if steps:
            out[_family(algorithm)].append((row["measured_us"] - row["predicted_us"]) * 1e-6 / steps)
    return out


def noise_floor(runs: list[list[dict]]) -> float | None:
    """Median over runs' rows of ``|measured - median of the other runs' measurements| / measured``."""
    by_call: dict[Key, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for i, rows in enumerate(runs):
        for r in rows:
            key = (r["collective"], r["nbytes"], r["nodes"], r["local_size"], r["backend"], r["algorithm"])
            by_call[key][i].append(r["measured_us"])
    errors = []
    for per_run in by_call.values():
        for i, measured in per_run.items():
            others = [m for j, ms in per_run.items() if j != i for m in ms]
            if others:
                typical = statistics.median(others)
                errors += [abs(m - typical) / m for m in measured]
    return statistics.median(errors) if errors else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("groups", nargs="+", help="LABEL=validate.json[,validate.json...] (one file a run)")
    parser.add_argument("--machine", required=True, help="the profile the validations ran on")
    parser.add_argument("--upto", default="1M", type=parse_size, help="largest call counted as small (1M)")
    args = parser.parse_args(argv)
    profile = machine.load(args.machine)
    for group in args.groups:
        label, _, files = group.partition("=")
        runs = [json.load(open(f))["rows"] for f in files.split(",")]
        residuals = step_residuals([r for rows in runs for r in rows], profile, args.upto)
        parts = [f"{fam} {statistics.median(v) * 1e3:+.2f} ms (n={len(v)})" for fam, v in sorted(residuals.items())]
        floor = noise_floor(runs)
        noise = f"; noise floor {floor:.1%} over {len(runs)} runs" if floor is not None and len(runs) > 1 else ""
        print(f"{label}: residual per inter-node step: {', '.join(parts)}{noise}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
