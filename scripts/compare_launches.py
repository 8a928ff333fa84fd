"""Compare two pccl-bench JSON files of the same sizes: pccl's automatic choice under torchrun (first file) and
under mpiexec (second), beside the gloo and MPICH baselines of each run, as a markdown table
(docs/testbed/launchers/README.md).

    python scripts/compare_launches.py torchrun-1g.json mpiexec-1g.json
"""

from __future__ import annotations

import argparse
import json


def _rows(path: str) -> dict[tuple[str, int, str], dict]:
    """Rows by (collective, bytes, backend) for the baselines and pccl's automatic choice."""
    with open(path) as fh:
        rows = json.load(fh)
    return {(r["collective"], r["size_bytes"], r["backend"]): r for r in rows
            if r["backend"] != "pccl" or r["auto"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("torchrun")
    parser.add_argument("mpiexec")
    args = parser.parse_args()
    torchrun, mpiexec = _rows(args.torchrun), _rows(args.mpiexec)
    print("| collective | size | pccl auto, torchrun (gloo levels) | pccl auto, mpiexec (MPI levels) | torchrun / mpiexec "
          "| gloo (torchrun run) | MPICH (mpiexec run) |")
    print("|---|---|---|---|---|---|---|")
    for (collective, size, backend), row in sorted(torchrun.items()):
        if backend != "pccl":
            continue
        other = mpiexec[(collective, size, "pccl")]
        gloo, mpi = torchrun[(collective, size, "gloo")], mpiexec[(collective, size, "mpi")]
        print(f"| {collective} | {size >> 10} KiB | {row['time_us'] / 1e3:.2f} ms ({row['algorithm']}) "
              f"| {other['time_us'] / 1e3:.2f} ms ({other['algorithm']}) | {row['time_us'] / other['time_us']:.2f} "
              f"| {gloo['time_us'] / 1e3:.2f} ms | {mpi['time_us'] / 1e3:.2f} ms |")


if __name__ == "__main__":
    main()
