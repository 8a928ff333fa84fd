"""The cost model's Frontier profile against the PCCL authors' Frontier logs.

The public artifact of the PCCL paper (github.com/axonn-ai/sc2025-pccl-reproducer) keeps the slurm logs of its
January 2025 Frontier runs on branch ``experimental`` (``data/frontier/all_gather*``, ``reduce_scatter*``,
``fr_reduce_scatter``; one more all-gather set, ``data/all_gather_3``, only in its root commit 5a6353f). Each log
prints, per message size and GCD count, RCCL's time (``Method = nccl``) and a hierarchical prototype's
(``Method = hybrid``: RCCL inside the node, MPI between nodes, which pccl-sim calls ``hier:mpi``), in ms, the mean
of the last 10 of 20 iterations; sizes are bf16 MiB: the all-gather's output, the reduce-scatter's full input.

    git clone -b experimental https://github.com/axonn-ai/sc2025-pccl-reproducer
    python scripts/frontier_logs.py sc2025-pccl-reproducer/data/frontier/{all_gather,all_gather_2,reduce_scatter,\\
        reduce_scatter_2,fr_reduce_scatter}

prints, for every (collective, library), the median and quartiles of |predicted - measured| / measured over the
points on at least 2 nodes (the median over the logs where a point was run several times).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from pccl_torch.sim import costs, machine

MODELLED = {"nccl": "vendor", "hybrid": "hier:mpi"}
"""Log method -> the pccl-sim algorithm it is priced as."""
GCDS_PER_NODE = 8


def parse(log: Path) -> list[tuple[str, str, int, int, float]]:
    """(collective, method, gcds, bytes, ms) of every timed line of one slurm log."""
    collective = "all_gather" if "all_gather" in log.parent.name else "reduce_scatter"
    out, size, method, gcds = [], None, None, None
    for line in log.read_text(errors="replace").splitlines():
        line = line.strip()
        if m := re.match(r"(?:input|output) size = (\d+) MB", line):
            size = int(m.group(1)) << 20
        elif m := re.match(r"Method = (\w+)", line):
            method = m.group(1)
        elif m := re.search(r"bus bw for (\d+) GPUs", line):
            gcds = int(m.group(1))
        elif (m := re.match(r"time = ([\d.]+) ms", line)) and None not in (size, method, gcds):
            out.append((collective, method, gcds, size, float(m.group(1))))
            method = None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path, help="folders of slurm-*.out logs")
    parser.add_argument("--machine", default="frontier", help="pccl-sim profile (default frontier)")
    args = parser.parse_args(argv)
    profile = machine.load(args.machine)
    times: dict[tuple[str, str, int, int], list[float]] = defaultdict(list)
    for folder in args.dirs:
        for log in sorted(folder.glob("*.out")):
            for collective, method, gcds, nbytes, ms in parse(log):
                times[(collective, method, gcds, nbytes)].append(ms)
    errors: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (collective, method, gcds, nbytes), runs in times.items():
        if method not in MODELLED or gcds < 2 * GCDS_PER_NODE:
            continue
        predicted = 1e3 * costs.predict(collective, MODELLED[method], nbytes, gcds // GCDS_PER_NODE, GCDS_PER_NODE,
                                        profile)
        measured = statistics.median(runs)
        errors[(collective, method)].append(abs(predicted - measured) / measured)
    if not errors:
        print("no timed lines found", file=sys.stderr)
        return 1
    for (collective, method), e in sorted(errors.items()):
        q1, _, q3 = statistics.quantiles(e, n=4) if len(e) > 1 else (e[0], e[0], e[0])
        print(f"{collective:<15} {method:<7} as {MODELLED[method]:<9} {len(e):>3} points  median |error| "
              f"{statistics.median(e):6.1%}  quartiles {q1:6.1%} .. {q3:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
