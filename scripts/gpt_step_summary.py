"""One line per GPT training JSON (examples/gpt --json): total and first-10-steps seconds, median step, median of
steps 51-100, and the algorithms pccl ran most (docs/testbed/tuning/README.md).

    python scripts/gpt_step_summary.py out/gpt-algos/*.json
"""
import json, statistics, sys
from pathlib import Path
print(f"{'run':24s} {'100 steps s':>11s} {'first 10 s':>10s} {'median step ms':>15s} {'steps 51-100 ms':>16s}  algorithms")
for path in sys.argv[1:]:
    d = json.loads(Path(path).read_text())
    secs = [s["seconds"] for s in d["steps"]]
    algos = ", ".join(f"{k} x{v}" for k, v in sorted(d["algorithms"].items(), key=lambda kv: -kv[1])[:6]) if isinstance(d["algorithms"], dict) else d["algorithms"]
    print(f"{Path(path).stem:24s} {sum(secs):11.1f} {sum(secs[:10]):10.1f} {d['summary']['step_ms']:15.0f} "
          f"{statistics.median(secs[50:]) * 1e3:16.0f}  {algos}")
