"""Per-call cost of mismatch checking (``PCCL_DEBUG=check``): the same all-reduces with checking off and
on, interleaved in rounds so machine noise hits both alike; reports the median per-call difference.

    mpiexec -n 4 -env PCCL_LOCAL_SIZE 2 python benchmarks/bench_check.py [--calls 300] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import pccl_torch as pc


def per_call_us(comm: pc.Communicator, buf: torch.Tensor, algorithm: str, calls: int) -> float:
    comm.world.comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        pc.all_reduce(buf, algorithm=algorithm)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes", default="1024,65536,1048576", help="bytes of the all-reduced buffer")
    parser.add_argument("--algorithms", default="mpi,ring,hier:ring")
    args = parser.parse_args()
    comm = pc.init(check=False)
    rows = []
    for nbytes in map(int, args.sizes.split(",")):
        buf = torch.ones(nbytes // 4)
        calls = max(10, args.calls * 1024 // max(nbytes, 1024))
        for algorithm in args.algorithms.split(","):
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.rounds):
                for check in (False, True):
                    comm.check = check
                    times[check].append(per_call_us(comm, buf, algorithm, calls))
            off, on = statistics.median(times[False]), statistics.median(times[True])
            rows.append((nbytes, algorithm, off, on))
    comm.check = False
    if comm.topology.rank == 0:
        print(f"{comm.topology.world_size} ranks ({comm.topology.num_nodes} nodes x {comm.topology.local_size}); "
              "median of interleaved rounds")
        print(f"{'bytes':>9} {'algorithm':>10} {'off us':>9} {'on us':>9} {'overhead us':>12} {'ratio':>6}")
        for nbytes, algorithm, off, on in rows:
            print(f"{nbytes:9d} {algorithm:>10} {off:9.1f} {on:9.1f} {on - off:12.1f} {on / off:6.2f}")
    pc.shutdown()


if __name__ == "__main__":
    main()
