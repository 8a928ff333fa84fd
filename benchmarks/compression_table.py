"""Markdown table of a ``pccl-bench --compression ...`` JSON: per collective and size, pccl's exact choice and
the best baseline, then each wire format's time and its speed-up over exact pccl (vs-exact).

    python benchmarks/compression_table.py benchmarks/results/testbed/compression/bench-1gbit.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from pccl_torch.units import format_size


def _column(row: dict) -> str:
    """A compressed row's column: its backend label (``pccl+int8``, ``pccl:hier:mpi+bf16``; older JSON without
    labels: ``pccl+<format>``)."""
    return row.get("label") or f"pccl+{row['compression']}"


def table(rows: list[dict]) -> str:
    formats = list(dict.fromkeys(_column(r) for r in rows if r.get("compression")))
    cells: dict[tuple[str, int], dict[str, dict]] = defaultdict(dict)
    for r in rows:
        key = "exact" if r["auto"] else (_column(r) if r.get("compression") else
                                         (r["backend"] if r["backend"] != "pccl" else None))
        if key:
            cells[(r["collective"], r["size_bytes"])][key] = r
    header = ["collective", "size", "pccl exact (ms)", "best baseline (ms)"] + [f"{f} ms (vs exact)" for f in formats]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (collective, size), row in cells.items():
        baselines = [v["time_us"] for k, v in row.items() if v["backend"] != "pccl"]
        exact = row.get("exact")
        out = [collective, format_size(size), f"{exact['time_us'] / 1e3:.1f}" if exact else "-",
               f"{min(baselines) / 1e3:.1f}" if baselines else "-"]
        for f in formats:
            r = row.get(f)
            out.append(f"{r['time_us'] / 1e3:.1f} ({r['vs_exact']:.2f}x)" if r and r.get("vs_exact") else "-")
        lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="+", help="pccl-bench --json outputs")
    for path in parser.parse_args().json:
        print(f"### {path}\n")
        print(table(json.load(open(path))))
        print()


if __name__ == "__main__":
    main()
