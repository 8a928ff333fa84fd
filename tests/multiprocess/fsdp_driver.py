"""FSDP2 with pccl's all-gather/reduce-scatter hooks, and FSDP1 over a pccl process group, each against
the same run on gloo, under mpiexec.

Prints "N passed, M failed" on rank 0 and writes --json. Every rank also writes its own result
(``rank_result``) after ``pc.shutdown()`` returned.
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
import rank_result  # this folder is on sys.path when the driver runs as a script
from _training import sgd_steps  # this folder is on sys.path when the driver runs as a script
from pccl_torch.integrations.fsdp import fully_shard


def train(comm: str, rank: int, size: int, steps: int = 5) -> tuple[list[float], torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                                torch.nn.GELU(), torch.nn.Linear(32, 1))
    mesh = init_device_mesh("cpu", (size,))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh, comm=comm)
    fully_shard(model, mesh=mesh, comm=comm)
    # clip_grad_norm_ runs DTensor collectives on FSDP's own group
    losses = sgd_steps(model, rank, features=12, batch=6, lr=0.05, seed=7, steps=steps,
                       before_step=lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0))
    return losses, torch.cat([p.full_tensor().flatten() for p in model.parameters()])


def train_fsdp1(group, rank: int, steps: int = 5) -> tuple[list[float], torch.Tensor]:
    """FSDP1 with ``process_group=group`` (gloo, or a pccl group: then all of FSDP1's traffic is pccl's)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    model = FSDP(torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 1)),
                 process_group=group, device_id=torch.device("cpu"), use_orig_params=True)
    losses = sgd_steps(model, rank, features=12, batch=6, lr=0.05, seed=11, steps=steps)
    with FSDP.summon_full_params(model):
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
    return losses, params


def check_fsdp1(rank: int) -> str | None:
    import torch.distributed as dist

    from pccl_torch.integrations.torch_backend import communicator_of

    pccl_group = dist.new_group(backend="pccl")
    gloo_group = dist.new_group(backend="gloo")
    base_losses, base_params = train_fsdp1(gloo_group, rank)
    losses, params = train_fsdp1(pccl_group, rank)
    calls = pc.stats(communicator_of(pccl_group))["calls"]
    if min(calls.get(c, 0) for c in ("all_gather", "reduce_scatter")) == 0:
        return f"FSDP1 over a pccl group bypassed pccl: {calls}"
    if not torch.allclose(torch.tensor(losses), torch.tensor(base_losses), rtol=1e-5, atol=1e-6):
        return f"FSDP1 losses differ: {losses} vs {base_losses}"
    if not torch.allclose(params, base_params, rtol=1e-5, atol=1e-6):
        return f"FSDP1 final parameters differ by {(params - base_params).abs().max().item():.3g}"
    return None


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
        else:
            problem = check_fsdp1(rank)
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
    calls = pc.stats()["calls"]
    pc.shutdown()
    rank_result.write({"ranks": size, "problem": problem, "pccl_calls": calls}, rank)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
