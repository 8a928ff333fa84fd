"""Time against node count from ``pccl-bench`` JSON runs of one layout per node count (the scaling the paper is
about): one panel per collective and size, one line per backend (pccl's automatic choice, its forced plans,
the baselines), and how much each one grows from the fewest nodes to the most.

    python benchmarks/plot_node_scaling.py scale-2n.json scale-4n.json scale-8n.json -o node-scaling.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from pccl_torch.units import format_size


def _label(row: dict) -> str:
    if row["backend"] != "pccl":
        return row["backend"]
    return "pccl (auto)" if row["auto"] else f"pccl:{row['algorithm']}"


def series(rows: list[dict]) -> dict[tuple[str, int], dict[str, dict[int, float]]]:
    """(collective, size) -> label -> nodes -> milliseconds."""
    out: dict[tuple[str, int], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        out[(r["collective"], r["size_bytes"])][_label(r)][r["nodes"]] = r["time_us"] / 1e3
    return out


def growth_table(data: dict[tuple[str, int], dict[str, dict[int, float]]]) -> str:
    """Markdown: each line's time at the fewest and the most nodes, and the ratio."""
    lines = ["| collective | size | backend | " + " | ".join(f"{n} nodes (ms)" for n in _nodes(data)) +
             " | growth |", "|---|---|---|" + "---|" * (len(_nodes(data)) + 1)]
    for (collective, size), by_label in sorted(data.items()):
        for label, points in sorted(by_label.items()):
            first, last = points[min(points)], points[max(points)]
            cells = " | ".join(f"{points[n]:.1f}" if n in points else "-" for n in _nodes(data))
            lines.append(f"| {collective} | {format_size(size)} | {label} | {cells} | {last / first:.2f}x |")
    return "\n".join(lines)


def _nodes(data: dict) -> list[int]:
    return sorted({n for by_label in data.values() for points in by_label.values() for n in points})


def plot(data: dict[tuple[str, int], dict[str, dict[int, float]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(data)
    columns = min(len(keys), 3)
    rows = -(-len(keys) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys):
        for label, points in sorted(data[key].items()):
            xs = sorted(points)
            baseline = not label.startswith("pccl")
            ax.plot(xs, [points[x] for x in xs], marker="o", linestyle="--" if baseline else "-",
                    linewidth=2.5 if baseline or label == "pccl (auto)" else 1, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(_nodes(data), [str(n) for n in _nodes(data)])
        ax.set_xlabel("nodes")
        ax.set_ylabel("time (ms)")
        ax.set_title(f"{key[0]} {format_size(key[1])}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="pccl-bench --json files, one node count each")
    parser.add_argument("-o", "--output", required=True, help="PNG to write")
    args = parser.parse_args()
    rows = [row for path in args.runs for row in json.load(open(path))]
    data = series(rows)
    plot(data, args.output)
    print(growth_table(data))


if __name__ == "__main__":
    main()
