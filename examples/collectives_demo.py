"""Demo: the three collectives on emulated nodes, pccl's choice side by side with gloo and MPI.

    PCCL_LOCAL_SIZE=2 mpiexec -n 4 python examples/collectives_demo.py

For each collective and size, runs pccl's automatic choice (``auto``: the selector profile, else the
heuristic), the flat vendor collective (torch.distributed gloo, ``vendor``) and the MPI library's own
(``mpi``), all through pccl's API, interleaved, and prints the median time, bus bandwidth (nccl-tests
definitions) and whether the result matched a torch reference.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from mpi4py import MPI

import pccl_torch as pc

SIZES = (1 << 10, 1 << 16, 1 << 20, 1 << 22)  # bytes of the full buffer


def run_once(collective: str, algorithm: str | None, count: int, rank: int, world: int):
    """One call on fresh inputs; returns (seconds, correct)."""
    if collective == "all_gather":
        inp = torch.full((count // world,), float(rank))
        out = torch.empty(count // world * world)
        start = time.perf_counter()
        pc.all_gather_into_tensor(out, inp, algorithm=algorithm)
        elapsed = time.perf_counter() - start
        return elapsed, torch.equal(out, torch.arange(world, dtype=torch.float32).repeat_interleave(count // world))
    if collective == "reduce_scatter":
        block = count // world
        inp = torch.arange(block * world, dtype=torch.float32) + rank
        out = torch.empty(block)
        start = time.perf_counter()
        pc.reduce_scatter_tensor(out, inp, algorithm=algorithm)
        elapsed = time.perf_counter() - start
        expected = (torch.arange(block * world, dtype=torch.float32) * world + sum(range(world)))
        return elapsed, torch.equal(out, expected[rank * block:(rank + 1) * block])
    buf = torch.full((count,), float(rank + 1))
    start = time.perf_counter()
    pc.all_reduce(buf, algorithm=algorithm)
    elapsed = time.perf_counter() - start
    return elapsed, bool((buf == world * (world + 1) / 2).all())


def bus_factor(collective: str, world: int) -> float:
    return 2 * (world - 1) / world if collective == "all_reduce" else (world - 1) / world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--iters", type=int, default=10)
    parser.add_argument("-w", "--warmup", type=int, default=2)
    args = parser.parse_args()

    comm = pc.init()
    topo = comm.topology
    mpi = MPI.COMM_WORLD
    if topo.rank == 0:
        print(f"pccl-torch {pc.__version__}: {topo.world_size} ranks = {topo.num_nodes} nodes x {topo.local_size} "
              f"(PCCL_LOCAL_SIZE emulation); fp32; median of {args.iters} after {args.warmup} warm-up\n")
        print(f"{'collective':<15}{'bytes':>10}  {'backend':<8}{'algorithm':<26}{'time(us)':>10}"
              f"{'busbw(GB/s)':>13}  {'correct':<7}")
    all_correct = True
    for collective in ("all_gather", "reduce_scatter", "all_reduce"):
        for nbytes in SIZES:
            count = nbytes // 4 // topo.world_size * topo.world_size
            timings: dict[str, list[float]] = {"auto": [], "vendor": [], "mpi": []}
            correct = dict.fromkeys(timings, True)
            for it in range(args.warmup + args.iters):
                for backend in timings:  # interleaved, so the comparison holds on a noisy machine
                    algorithm = None if backend == "auto" else backend
                    mpi.Barrier()
                    elapsed, ok = run_once(collective, algorithm, count, topo.rank, topo.world_size)
                    slowest = mpi.allreduce(elapsed, op=MPI.MAX)
                    correct[backend] &= mpi.allreduce(ok, op=MPI.LAND)
                    if it >= args.warmup:
                        timings[backend].append(slowest)
            chosen = pc.choose_algorithm(collective, count * 4, comm)
            for backend, samples in timings.items():
                median = statistics.median(samples)
                busbw = count * 4 / median * bus_factor(collective, topo.world_size) / 1e9
                all_correct &= correct[backend]
                if topo.rank == 0:
                    algorithm = f"{chosen} (auto)" if backend == "auto" else backend
                    print(f"{collective:<15}{count * 4:>10}  {'pccl':<8}{algorithm:<26}{median * 1e6:>10.0f}"
                          f"{busbw:>13.3f}  {'yes' if correct[backend] else 'NO':<7}")
        if topo.rank == 0:
            print()
    pc.shutdown()
    if topo.rank == 0:
        print("all results correct" if all_correct else "SOME RESULTS WERE WRONG")
    raise SystemExit(0 if all_correct else 1)


if __name__ == "__main__":
    main()
