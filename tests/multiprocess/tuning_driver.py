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
from pccl_torch.choice import choice_of

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


def _one_call(collective: str, nbytes: int, rank: int, size: int) -> tuple[str, int]:
    """Run one call of the shape, pccl choosing; (the algorithm it ran, wrong elements)."""
    before = dict(pc.stats()["algorithms"])
    n = nbytes // 4
    if collective == "all_reduce":
        buf = torch.full((n,), float(rank + 1))
        pc.all_reduce(buf)
        wrong = int((buf != size * (size + 1) / 2).sum())
    elif collective == "all_gather":
        out, mine = torch.empty(n), torch.full((n // size,), float(rank))
        pc.all_gather_into_tensor(out, mine)
        wrong = int((out != torch.arange(size).repeat_interleave(n // size).float()).sum())
    else:
        out = torch.empty(n // size)
        pc.reduce_scatter_tensor(out, torch.full((n,), float(rank + 1)))
        wrong = int((out != size * (size + 1) / 2).sum())
    after = pc.stats()["algorithms"]
    ran = [k.split(":", 1)[1] for k, v in after.items() if v != before.get(k, 0)]
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


if __name__ == "__main__":
    main()
