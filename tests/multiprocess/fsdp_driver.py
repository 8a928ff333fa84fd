"""FSDP2 with pccl's all-gather/reduce-scatter hooks against plain FSDP2 on gloo, under mpiexec.

Prints "N passed, M failed" on rank 0 and writes --json.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

import torch
from mpi4py import MPI
from torch.distributed.device_mesh import init_device_mesh

import pccl_torch as pc
from pccl_torch.integrations.fsdp import fully_shard


def train(comm: str, rank: int, size: int, steps: int = 5) -> tuple[list[float], torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                                torch.nn.GELU(), torch.nn.Linear(32, 1))
    mesh = init_device_mesh("cpu", (size,))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh, comm=comm)
    fully_shard(model, mesh=mesh, comm=comm)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(7 + rank)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(6, 12, generator=g), torch.randn(6, 1, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)  # DTensor collectives on FSDP's group
        opt.step()
        losses.append(loss.item())
    return losses, torch.cat([p.full_tensor().flatten() for p in model.parameters()])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    comm = pc.init()
    rank, size = comm.topology.rank, comm.topology.world_size
    problem = None
    try:
        base_losses, base_params = train("default", rank, size)
        before = pc.stats()["calls"]
        losses, params = train("pccl", rank, size)
        after = pc.stats()["calls"]
        grew = {c: after.get(c, 0) - before.get(c, 0) for c in ("all_gather", "reduce_scatter")}
        if min(grew.values()) <= 0:
            problem = f"FSDP2 collectives did not go through pccl: {grew}"
        elif not torch.allclose(torch.tensor(losses), torch.tensor(base_losses), rtol=1e-5, atol=1e-6):
            problem = f"losses differ: {losses} vs {base_losses}"
        elif not torch.allclose(params, base_params, rtol=1e-5, atol=1e-6):
            problem = f"final parameters differ by {(params - base_params).abs().max().item():.3g}"
    except Exception as exc:  # noqa: BLE001 - reported below
        problem = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
    world = MPI.COMM_WORLD
    failures = [f for f in world.gather(problem, root=0) or [] if f]
    if rank == 0:
        for f in failures:
            print("FAIL", f, file=sys.stderr)
        print(f"{size - len(failures)} passed, {len(failures)} failed")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"passed": size - len(failures), "failed": len(failures), "failures": failures,
                           "pccl_calls": pc.stats()["calls"]}, fh)
    failed = world.allreduce(int(problem is not None), op=MPI.SUM)
    pc.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
