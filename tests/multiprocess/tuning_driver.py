"""Online tuning under mpiexec: every rank must lock in the same algorithm per call shape, with right results,
even when one rank's clock and load differ (``--skew-rank``). Rank 0 prints one JSON line: each rank's
``stats()["tuning"]``, the algorithms each call ran, the model's choice per shape, and how many results were
wrong.

    PCCL_TUNE_CACHE=/tmp/t.json mpiexec -n 4 python tuning_driver.py --tune online --skew-rank 1
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time

import torch
from mpi4py import MPI

import pccl_torch as pc
from pccl_torch import api
from pccl_torch.selection import choice_of

if __package__:
    from . import rank_result
else:  # run as a script by mpiexec
    import rank_result

SHAPES = [("all_reduce", 1 << 16), ("all_reduce", 1 << 20), ("all_gather", 1 << 20), ("reduce_scatter", 1 << 20)]
"""(collective, bytes of the full buffer), float32."""
CALLS = 40
"""Calls per shape: more than exploring a small shape takes (4 candidates x (1 untimed + 7 timed) calls)."""


def _skew(seed: int) -> threading.Event:
    """This rank's clock runs at a random rate per reading, and a thread keeps one of its cores busy."""
    rng, real = random.Random(seed), time.perf_counter
    api.perf_counter = lambda: real() * (1 + rng.random() * 1e-3)  # type: ignore[attr-defined]
    stop = threading.Event()

    def burn() -> None:
        while not stop.is_set():
            sum(range(20000))

    threading.Thread(target=burn, daemon=True).start()
    return stop


def _pattern(numel: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input: distinct in every element and on every rank (a schedule that misplaces a block,
    drops a rank or counts one twice changes the result), small integers, so float32 sums are exact."""
    return (torch.arange(numel, dtype=torch.float32) % 997) + 1024 * (rank + 1)


def _one_call(collective: str, nbytes: int, rank: int, size: int) -> tuple[str, int]:
    """Run one call of the shape, pccl choosing; (the algorithm it ran, wrong elements)."""
    before = dict(pc.stats()["algorithms"])
    n = nbytes // 4
    if collective == "all_reduce":
        buf = _pattern(n, rank)
        pc.all_reduce(buf)
        wrong = int((buf != sum(_pattern(n, r) for r in range(size))).sum())
    elif collective == "all_gather":
        block = n // size
        out, mine = torch.empty(n), torch.arange(block, dtype=torch.float32) + block * rank
        pc.all_gather_into_tensor(out, mine)
        wrong = int((out != torch.arange(n, dtype=torch.float32)).sum())
    else:
        block = n // size
        out = torch.empty(block)
        pc.reduce_scatter_tensor(out, _pattern(n, rank))
        expected = sum(_pattern(n, r) for r in range(size))[rank * block:(rank + 1) * block]
        wrong = int((out != expected).sum())
    after = pc.stats()["algorithms"]
    ran = [k.split(":", 1)[1] for k, v in after.items() if v != before.get(k, 0)]
    assert len(ran) == 1, f"one call ran {ran}"
    return ran[0], wrong


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tune", default=None)
    parser.add_argument("--skew-rank", type=int, default=-1)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    comm = pc.init(tune=args.tune)
    rank, size = comm.topology.rank, comm.topology.world_size
    stop = _skew(rank) if rank == args.skew_rank else None
    ran: dict[str, list[str]] = {}
    wrong = 0
    for collective, nbytes in SHAPES:
        for _ in range(CALLS):
            name, bad = _one_call(collective, nbytes, rank, size)
            ran.setdefault(f"{collective}:{nbytes}", []).append(name)
            wrong += bad
    if stop is not None:
        stop.set()
    choice = choice_of(comm)
    mine = {"tuning": pc.stats()["tuning"], "ran": ran, "wrong": wrong,
            "default": {f"{c}:{n}": choice._decide(comm, c, None, n, torch.float32).name for c, n in SHAPES}}
    everyone = world.gather(mine, root=0)
    pc.shutdown()
    if rank == 0:
        print(json.dumps({"ranks": everyone}))
    rank_result.write(mine, rank)  # after shutdown returned; the test reads every rank's


if __name__ == "__main__":
    main()
