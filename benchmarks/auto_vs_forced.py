"""pccl's automatic choice against its best forced plan and the best baseline, per point, from ``pccl-bench`` JSON
runs that time ``pccl`` beside ``pccl:<plan>`` backends and the baselines (the check of issue 58's goal: untuned auto
within 5% of the best forced plan).

    python benchmarks/auto_vs_forced.py ag.json rs.json ar.json [--from 64K]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict

from pccl_torch.units import format_size, parse_size

WITHIN = 0.95
"""auto counts as the best plan where the best forced plan took at least this share of auto's time."""


def verdict(rows: list[dict], smallest: int) -> str:
    points: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in rows:
        points[(r["collective"], r["size_bytes"])].append(r)
    lines = ["| collective | size | pccl auto (plan) | best forced plan | forced / auto | best baseline | "
             "baseline / auto |", "|---|---|---|---|---|---|---|"]
    within = counted = 0
    logs = []
    for (collective, size), group in sorted(points.items()):
        auto = [r for r in group if r["backend"] == "pccl" and r["auto"]]
        forced = [r for r in group if r["backend"] == "pccl" and not r["auto"]]
        base = [r for r in group if r["backend"] != "pccl"]
        if not auto or not forced or not base:
            continue
        a, f, b = auto[0], min(forced, key=lambda r: r["time_us"]), min(base, key=lambda r: r["time_us"])
        ratio, versus = f["time_us"] / a["time_us"], b["time_us"] / a["time_us"]
        if size >= smallest:
            counted += 1
            within += ratio >= WITHIN
            logs.append(math.log(versus))
        lines.append(f"| {collective} | {format_size(size)} | {a['time_us'] / 1e3:.1f} ms ({a['algorithm']}) | "
                     f"{f['time_us'] / 1e3:.1f} ms ({f['algorithm']}) | {ratio:.2f} | "
                     f"{b['time_us'] / 1e3:.1f} ms ({b['backend']}) | {versus:.2f}x |")
    if logs:
        lines.append(f"\nFrom {format_size(smallest)}: auto within {100 - WITHIN * 100:.0f}% of the best forced plan "
                     f"at {within} of {counted} points; over the best baseline geomean "
                     f"{math.exp(sum(logs) / len(logs)):.2f}x, lowest {math.exp(min(logs)):.2f}x.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="pccl-bench --json files")
    parser.add_argument("--from", dest="smallest", default="64K", help="smallest size the summary counts")
    args = parser.parse_args()
    print(verdict([row for path in args.runs for row in json.load(open(path))], parse_size(args.smallest)))


if __name__ == "__main__":
    main()
