"""Comparison table and plot of training runs, from the dicts the scripts write with ``--json``
(plain Python and matplotlib: no torch, no MPI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

Run = dict[str, Any]

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
ALL_TO_ALL = "all_to_all"
"""A column of its own only where a run made all-to-alls (the mixture-of-experts example)."""


def header(all_to_all: bool = False) -> str:
    return (f"{'framework':<17}{'comm':<10}{'steps':>5}{'step ms':>9}{'worst':>7}{'tok/s':>8}{'comm ms':>9}"
            f"{'share':>7}{'cpu ms':>8}  {'all-gather':<15}{'reduce-scatter':<15}{'all-reduce':<15}"
            f"{'all-to-all     ' if all_to_all else ''}{'loss first->final':<19}{'val':>6}")


HEADER = header()


def _per_call(collective: dict[str, Any] | None) -> str:
    """``calls x ms`` per step for one collective, or ``-``."""
    if not collective or not collective["calls_per_step"]:
        return "-"
    return f"{collective['calls_per_step']:.0f} x {collective['ms_per_call']:.2f}ms"


def _has_all_to_all(runs: list[Run]) -> bool:
    return any((r["summary"]["collectives"].get(ALL_TO_ALL) or {}).get("calls_per_step") for r in runs)


def table_row(run: Run, all_to_all: bool = False) -> str:
    s = run["summary"]
    columns = COLLECTIVES + ((ALL_TO_ALL,) if all_to_all else ())
    cells = "".join(f"{_per_call(s['collectives'].get(c)):<15}" for c in columns)
    worst = f"{s['worst_step_ratio']:.1f}x"
    return (f"{run['framework']:<17}{run['comm']:<10}{len(run['steps']):>5}{s['step_ms']:>9.1f}{worst:>7}"
            f"{s['tokens_per_s']:>8,.0f}{s['comm_ms_per_step']:>9.1f}{100 * s['comm_share']:>6.0f}%"
            f"{s['cpu_ms_per_step']:>8.0f}  {cells}"
            f"{s['first_loss']:.3f} -> {s['final_train_loss']:.3f}   {s['val_loss']:>6.3f}")


def speedup_row(baseline: Run, run: Run) -> str:
    """How much faster ``run`` is than ``baseline`` (baseline time / run time; > 1: faster)."""
    b, r = baseline["summary"], run["summary"]
    comm = b["comm_ms_per_step"] / r["comm_ms_per_step"] if r["comm_ms_per_step"] else float("nan")
    return (f"{'':<17}{run['comm'] + ' vs ' + baseline['comm']:<19}speed-up: step {b['step_ms'] / r['step_ms']:.2f}x, "
            f"comm {comm:.2f}x")


def comparison_table(runs: list[Run], baseline: str = "gloo", where: str | None = None) -> str:
    """One row per run, grouped by framework, each group closed by the speed-up over ``baseline``;
    ``where`` describes the nodes (default: emulated on one machine)."""
    first = runs[0]
    where = where or f"{first['world_size'] // first['local_size']} emulated nodes x {first['local_size']}"
    lines = [
        f"GPT, {first['params']:,} parameters, {first['world_size']} CPU ranks = {where}, "
        f"{first['tokens_per_step']:,} tokens a step.",
        "Times: medians over steps 3..N (step: slowest rank; collectives: calls a step x time a call, mean over "
        "ranks); worst: slowest step over the median; cpu: CPU time a step, all ranks' processes summed; "
        "loss: first step -> mean of the last 10 steps; val: held-out 10% of the corpus",
        header(_has_all_to_all(runs)),
    ]
    frameworks = list(dict.fromkeys(r["framework"] for r in runs))
    for framework in frameworks:
        group = [r for r in runs if r["framework"] == framework]
        lines += [table_row(r, _has_all_to_all(runs)) for r in group]
        base = next((r for r in group if r["comm"] == baseline), None)
        lines += [speedup_row(base, r) for r in group if base is not None and r is not base]
    lines.append("comm time: pccl runs from pccl's counters (time inside pccl); gloo runs from torch.distributed's "
                 "calls, issue to completion")
    for run in runs:
        if run.get("algorithms"):
            used = ", ".join(f"{name} x{n}" for name, n in sorted(run["algorithms"].items()))
            lines.append(f"algorithms pccl chose ({run['framework']}, rank 0, set-up and training): {used}")
    return "\n".join(lines)


def plot_runs(runs: list[Run], path: Path) -> None:
    """Training loss and step time per step, one line per run (pccl solid, others dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours: dict[str, str] = {}
    for run in runs:
        colour = colours.setdefault(run["framework"], f"C{len(colours)}")
        style = "-" if run["comm"].startswith("pccl") else "--"
        label = f"{run['framework']} {run['comm']}"
        steps = [s["step"] for s in run["steps"]]
        ax_loss.plot(steps, [s["loss"] for s in run["steps"]], style, color=colour, label=label)
        ax_time.plot(steps[2:], [1e3 * s["seconds"] for s in run["steps"][2:]], style, color=colour,
                     label=label, alpha=0.8)
    ax_loss.set(xlabel="step", ylabel="train loss (cross-entropy, nats)",
               title="loss (same seed and data: the runs coincide)")
    ax_time.set(xlabel="step", ylabel="step time (ms, slowest rank)", title="step time (from step 3)")
    ax_time.set_ylim(bottom=0)
    for ax in (ax_loss, ax_time):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    first = runs[0]
    fig.suptitle(f"GPT ({first['params']:,} parameters) on {first['world_size']} CPU ranks "
                 f"({first['world_size'] // first['local_size']} emulated nodes x {first['local_size']})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
