"""How close pccl's automatic choice came to the best fixed algorithm in pccl-bench JSON files run with
``--backends pccl,pccl:all --confirm N``: the share of points within 5% and the worst ratio, then one line per
point (docs/testbed/tuning/README.md). Where the file has the noise floor (``confirm_repeat_ratio``: the fastest
fixed algorithm timed as two identical columns), also the points where that floor is within 5%, the only ones
at which a 5% comparison means anything, and auto's share among them.

    python scripts/score_auto.py benchmarks/results/testbed/tuning/mpiexec-1g-off.json \\
        benchmarks/results/testbed/tuning/mpiexec-1g-online.json
"""

from __future__ import annotations

import argparse
import json

WITHIN = 1.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    for path in args.files:
        with open(path) as fh:
            rows = [r for r in json.load(fh) if r["auto"] and r.get("compression") is None and "auto_vs_best_fixed" in r]
        ratios = [r["auto_vs_best_fixed"] for r in rows]
        within = sum(1 for ratio in ratios if ratio <= WITHIN)
        print(f"{path}: {within}/{len(ratios)} points within {WITHIN - 1:.0%} of the best fixed; worst {max(ratios):.2f}x")
        resolved = [r for r in rows if r.get("confirm_repeat_ratio", float("inf")) <= WITHIN]
        if any("confirm_repeat_ratio" in r for r in rows):
            good = sum(1 for r in resolved if r["auto_vs_best_fixed"] <= WITHIN)
            worst = max((r["auto_vs_best_fixed"] for r in resolved), default=float("nan"))
            print(f"   noise floor within {WITHIN - 1:.0%} at {len(resolved)}/{len(rows)} points; there auto within "
                  f"{WITHIN - 1:.0%} at {good}/{len(resolved)}, worst {worst:.2f}x")
        for r in rows:
            tuned = r.get("tuning", {}).get("source", "")
            repeat = f"  same-column noise {r['confirm_repeat_ratio']:.2f}" if "confirm_repeat_ratio" in r else ""
            print(f"   {r['collective']:15s} {r['size_bytes'] >> 10:6d} KiB  auto {r['algorithm']:16s} "
                  f"best fixed {r['confirm_fixed']:24s} {r['auto_vs_best_fixed']:.2f}  {tuned}{repeat}")


if __name__ == "__main__":
    main()
