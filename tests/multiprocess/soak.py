"""Soak: thousands of random collectives on one communicator, every result verified, memory watched.

    mpiexec -n 4 -env PCCL_LOCAL_SIZE 2 python -m tests.multiprocess.soak --calls 5000   # the full run

Every rank draws the same seeded sequence of (collective, algorithm, dtype, op, size up to 256 KiB),
runs it through pccl, checks it against a local reference (inputs of out-of-place calls unchanged,
all-reduce results identical on every rank) with the correctness driver's checker, and samples its
resident memory. Rank 0 prints one JSON summary; exit status 1 on any wrong result.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import torch
from mpi4py import MPI

import pccl_torch as pc
from tests.multiprocess.driver import FLOAT_OPS, INT_OPS, Case, Runner

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64)
MAX_BYTES = 256 << 10
WARMUP_CALLS = 100  # memory growth is measured from here: allocator pools and caches fill first


def resident_mib() -> float:
    """This process's resident set size."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * 4096 / 2**20


def random_case(rng: random.Random, world: int) -> Case:
    collective = rng.choice(("all_gather", "reduce_scatter", "all_reduce"))
    dtype = rng.choice(DTYPES)
    op = None if collective == "all_gather" else rng.choice(FLOAT_OPS if dtype.is_floating_point else INT_OPS)
    # Product overflows 16-bit floats on long sums of values near 1; keep the verified ops meaningful.
    if op == "product" and dtype.itemsize == 2:
        op = "sum"
    total = rng.randint(0, MAX_BYTES // dtype.itemsize)  # elements of the full buffer
    count = total // world if collective != "all_reduce" else total
    return Case(collective, rng.choice(pc.algorithms(collective, "cpu")), dtype, op, count)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    comm = pc.init()
    runner = Runner(world, verbose=False)
    rng = random.Random(args.seed)
    start, rss = time.perf_counter(), {}
    for call in range(args.calls):
        case = random_case(rng, comm.topology.world_size)
        runner.check(str(case), lambda: runner.run_case(case))
        if call + 1 in (WARMUP_CALLS, args.calls):
            rss[call + 1] = resident_mib()
    failures = world.gather(runner.failures, root=0)
    growth = world.gather(rss.get(args.calls, 0) - rss.get(WARMUP_CALLS, 0), root=0)
    pc.shutdown()
    if world.Get_rank() == 0:
        wrong = [f for per_rank in failures for f in per_rank]
        print(json.dumps({"calls": args.calls, "ranks": world.Get_size(), "wrong": len(wrong),
                          "seconds": round(time.perf_counter() - start, 1),
                          "rss_growth_mib_per_rank": [round(g, 1) for g in growth],
                          "rss_mib_rank0": {str(k): round(v, 1) for k, v in rss.items()}}))
        for line in wrong[:20]:
            print(line, file=sys.stderr)
        return 1 if wrong else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
