"""pccl-bench output: the nccl-tests-style table with its footer, the JSON rows and the busbw plot."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from pccl_torch.units import format_size

JSON_FIELDS = (
    "collective", "backend", "label", "algorithm", "auto", "compression", "size_bytes", "count", "dtype", "time_us",
    "algbw_gbps", "busbw_gbps", "wrong", "vs_best_baseline", "vs_exact", "ranks", "local_size", "nodes", "iters", "warmup", "hostname",
    "versions", "transport", "links",
)
#: Present on auto rows only, with ``--confirm N``: the head-to-head re-timing of auto against the fastest
#: fixed algorithms (``auto_vs_best_fixed`` > 1: auto slower), and the noise floor of that comparison: the
#: fastest fixed algorithm timed as two identical columns (``confirm_repeat_ratio``: slower / faster, >= 1).
CONFIRM_FIELDS = ("confirm_iters", "confirm_auto_us", "confirm_fixed", "confirm_fixed_us", "auto_vs_best_fixed",
                  "confirm_repeat_ratio")
#: Present on exact auto rows only, with online tuning (PCCL_TUNE=online): what was tried and chosen.
TUNING_FIELDS = ("tuning",)
#: Present on pccl's ``hier:pipelined`` rows only: the chunks the call was cut into (what the cost model prices).
PIPELINE_FIELDS = ("chunks",)


def _label(row: dict) -> str:
    if row["backend"] != "pccl":
        return row["backend"]
    if row.get("compression"):
        return f"pccl+{row['compression']}"
    return f"pccl ({row['algorithm']})" if row["auto"] else f"pccl:{row['algorithm']}"


def format_table(rows: list[dict]) -> str:
    """One block per collective: size count type backend algorithm time algbw busbw #wrong vs-best."""
    if not rows:
        return "no rows (every size was smaller than one element per rank)"
    first = rows[0]
    lines = [f"# pccl-bench: {first['ranks']} ranks = {first['nodes']} nodes x {first['local_size']}, "
             f"{first['dtype']}, median of {first['iters']} iterations after {first['warmup']} warm-up, "
             "time of the slowest rank; vs-best = best baseline time / pccl time"
             + ("; vs-exact = pccl exact auto time / compressed time" if any(r.get("compression") for r in rows) else "")]
    header = (f"{'size':>8} {'count':>10} {'type':>8}  {'backend':<8} {'algorithm':<26} {'time(us)':>10} "
              f"{'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6} {'vs-best':>7}")
    for collective in dict.fromkeys(r["collective"] for r in rows):
        lines += ["", f"## {collective}", header]
        for r in (r for r in rows if r["collective"] == collective):
            algorithm = f"{r['algorithm']} (auto)" if r["auto"] else r["algorithm"]
            if r.get("compression"):
                algorithm = f"{r['algorithm']}+{r['compression']}"
            ratio = f"{r['vs_best_baseline']:.2f}" if r["vs_best_baseline"] else "-"
            if r.get("vs_exact"):
                ratio += f" vs-exact {r['vs_exact']:.2f}"
            wrong = "N/A" if r["wrong"] < 0 else str(r["wrong"])
            lines.append(f"{format_size(r['size_bytes']):>8} {r['count']:>10} {r['dtype']:>8}  {r['backend']:<8} "
                         f"{algorithm:<26} {r['time_us']:>10.1f} {r['algbw_gbps']:>11.3f} {r['busbw_gbps']:>11.3f} "
                         f"{wrong:>6} {ratio:>7}")
    lines += ["", *format_footer(rows)]
    return "\n".join(lines)


def format_footer(rows: list[dict]) -> list[str]:
    """Average bus bandwidth per backend and collective, and the geometric-mean pccl/baseline ratio."""
    busbw: dict[tuple[str, str], list[float]] = defaultdict(list)
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        busbw[(r["collective"], _label(r) if not r["auto"] else "pccl (auto)")].append(r["busbw_gbps"])
        if r["vs_best_baseline"]:
            ratios[(r["collective"], "pccl (auto)" if r["auto"] else _label(r))].append(r["vs_best_baseline"])
    lines = ["# Avg bus bandwidth (GB/s) and geometric-mean speedup over the best baseline:"]
    for (collective, label), values in busbw.items():
        speedup = ratios.get((collective, label))
        extra = f"  x{math.exp(sum(map(math.log, speedup)) / len(speedup)):.2f}" if speedup else ""
        lines.append(f"#  {collective:<15} {label:<34} {sum(values) / len(values):8.3f}{extra}")
    confirmed = [r for r in rows if "auto_vs_best_fixed" in r]
    if confirmed:
        worst = max(confirmed, key=lambda r: r["auto_vs_best_fixed"])
        within = sum(r["auto_vs_best_fixed"] <= 1.10 for r in confirmed)
        lines.append(f"# Auto vs the fastest fixed algorithm, re-timed head to head ({worst['confirm_iters']} iterations): "
                     f"within 10% at {within} of {len(confirmed)} points; worst {worst['auto_vs_best_fixed']:.3f}x "
                     f"({worst['collective']} {format_size(worst['size_bytes'])}: auto {worst['algorithm']} "
                     f"{worst['confirm_auto_us']:.1f} us vs {worst['confirm_fixed']} {worst['confirm_fixed_us']:.1f} us)")
        repeats = [r["confirm_repeat_ratio"] for r in confirmed]
        lines.append(f"# Noise floor: the fastest fixed algorithm timed twice, as two columns, came within 5% of "
                     f"itself at {sum(x <= 1.05 for x in repeats)} of {len(repeats)} points; worst {max(repeats):.3f}x")
    wrong = sum(max(r["wrong"], 0) for r in rows)
    checked = any(r["wrong"] >= 0 for r in rows)
    lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'WRONG'}" if checked
                 else "# Results not checked (pass --check)")
    return lines


def write_json(rows: list[dict], path: str | Path) -> None:
    """One object per row with exactly :data:`JSON_FIELDS`, plus :data:`CONFIRM_FIELDS`, :data:`TUNING_FIELDS` and
    :data:`PIPELINE_FIELDS` where measured (schema in docs/benchmarks.md)."""
    with open(path, "w") as fh:
        json.dump([{k: r[k] for k in JSON_FIELDS + CONFIRM_FIELDS + TUNING_FIELDS + PIPELINE_FIELDS if k in r}
                   for r in rows], fh, indent=1)


def plot(rows: list[dict], path: str | Path) -> None:
    """busbw against size, log axes, one line per backend/algorithm, one panel per collective."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collectives = list(dict.fromkeys(r["collective"] for r in rows))
    fig, axes = plt.subplots(1, len(collectives), figsize=(6 * len(collectives), 4.5), squeeze=False)
    for ax, collective in zip(axes[0], collectives):
        lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for r in rows:
            if r["collective"] == collective:
                lines["pccl (auto)" if r["auto"] else _label(r)].append((r["size_bytes"], r["busbw_gbps"]))
        for label, points in lines.items():
            xs, ys = zip(*sorted(points))
            baseline = not label.startswith("pccl")
            ax.plot(xs, ys, marker="o", linewidth=2.5 if baseline or label == "pccl (auto)" else 1,
                    linestyle="--" if baseline else "-", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes per rank)" if collective == "all_to_all" else "size (bytes, full buffer)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(collective)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6 if len(lines) > 8 else 8)
    first = rows[0]
    fig.suptitle(f"pccl-bench: {first['ranks']} ranks = {first['nodes']} nodes x {first['local_size']}, "
                 f"{first['dtype']}, {first['hostname']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
