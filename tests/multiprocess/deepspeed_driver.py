"""DeepSpeed ZeRO-1, -2 and -3 on a tiny model, with --comm_backend pccl or gloo, under mpiexec, torchrun or
DeepSpeed's own launcher.

Rank 0 writes --json: losses and final parameters per stage, and pccl's counters (pccl backend). Every rank
also writes its own result (``rank_result``) after ``destroy_process_group()`` returned.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections import Counter
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

import pccl_torch as pc
from pccl_torch.integrations.deepspeed import SHM_DIR, add_comm_arguments, release_shared_memory, shared_memory_name
from pccl_torch.integrations.torch_backend import PcclProcessGroup, pccl_groups

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script by mpiexec, pccl_torch.run or deepspeed
import rank_result  # noqa: E402

DEFAULT_PORT = 29500  # DeepSpeed's TORCH_DISTRIBUTED_DEFAULT_PORT


def run_stage(stage: int, rank: int, world: int, steps: int = 5) -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    config = {
        "train_batch_size": 4 * world, "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": stage}, "gradient_clipping": 0.0,
        "zero_force_ds_cpu_optimizer": False, "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                                           config=config)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(4, 12, generator=g), torch.randn(4, 1, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    if stage == 3:
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            params = torch.cat([p.detach().flatten().clone() for p in engine.module.parameters()])
    else:
        params = torch.cat([p.detach().flatten() for p in engine.module.parameters()])
    return losses, params.tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    add_comm_arguments(parser)
    parser.add_argument("--stages", default="1,2,3")
    parser.add_argument("--json")
    args = parser.parse_args()
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    # Under mpiexec DeepSpeed's MPI discovery sets MASTER_PORT to this port (its default 29500 otherwise): the
    # tests give each launch a free one, so that two runs on one machine do not meet at 29500.
    deepspeed.init_distributed(dist_backend=args.comm_backend,
                               distributed_port=int(os.environ.get("MASTER_PORT") or DEFAULT_PORT))
    release_shared_memory()  # DeepSpeed never unlinks its /dev/shm segments
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict = {"backend": args.comm_backend, "default_group": type(dist.group.WORLD).__name__, "stages": {},
                    "shm_left": (SHM_DIR / shared_memory_name(rank)).exists()}
    on_pccl = isinstance(dist.group.WORLD, PcclProcessGroup)
    for stage in map(int, args.stages.split(",")):
        before = pc.stats("all")["calls"] if on_pccl else {}
        losses, params = run_stage(stage, rank, world)
        result["stages"][stage] = {"losses": losses, "params": params}
        if on_pccl:  # what this stage ran through pccl, on every pccl group (world and DeepSpeed's own)
            after = pc.stats("all")["calls"]
            result["stages"][stage]["pccl_calls"] = {c: n - before.get(c, 0) for c, n in after.items()}
    if on_pccl:
        everything = pc.stats("all")
        result["pccl_calls"] = everything["calls"]
        result["bypassed"] = everything["bypassed"]
        result["transport"] = everything["transport"]
        result["pccl_groups"] = len(pccl_groups())
        result["delegated"] = dict(sum((pg.delegated for pg in pccl_groups()), Counter()))
    if rank == 0 and args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh)
    dist.destroy_process_group()
    rank_result.write(json.loads(json.dumps(result)), rank)  # stage keys as strings, as in --json


if __name__ == "__main__":
    main()
