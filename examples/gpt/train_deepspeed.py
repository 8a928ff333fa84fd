"""Train the example GPT with DeepSpeed ZeRO (stage 3 by default), every collective through pccl or gloo.

    PCCL_LOCAL_SIZE=2 mpiexec -n 4 python examples/gpt/train_deepspeed.py --comm_backend pccl
    PCCL_LOCAL_SIZE=2 mpiexec -n 4 python examples/gpt/train_deepspeed.py --comm_backend gloo --zero-stage 2

DeepSpeed finds rank, world size and the rendezvous address from MPI. The configs live in
``configs/deepspeed/zero{1,2,3}.json``; ``--batch-size`` sets their micro-batch per rank. The optimizer is
a torch AdamW (``zero_force_ds_cpu_optimizer: false``), so nothing is compiled but DeepSpeed's CPU
communication extension (cache it with ``TORCH_EXTENSIONS_DIR``). ``--device cuda`` trains on each rank's
GPU (DeepSpeed's CUDA accelerator: leave ``DS_ACCELERATOR`` unset or ``cuda``); the CPU runs set
``DS_ACCELERATOR=cpu``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.distributed as dist

import harness
from pccl_torch.integrations.deepspeed import add_comm_arguments, release_shared_memory

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "deepspeed"


def load_config(path: Path, batch_size: int) -> dict[str, Any]:
    """The DeepSpeed config at ``path`` with ``batch_size`` sequences per rank and no accumulation."""
    config = json.loads(path.read_text())
    config["train_micro_batch_size_per_gpu"] = batch_size
    config["gradient_accumulation_steps"] = 1
    config.pop("train_batch_size", None)  # DeepSpeed derives it: micro-batch x ranks
    return config


def main(argv: list[str] | None = None) -> harness.RunResult:
    """Train with the command-line arguments ``argv``; returns the run's record (every rank)."""
    parser = harness.build_parser(__doc__)
    add_comm_arguments(parser)  # --comm_backend {nccl,gloo,mpi,pccl}, default pccl
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--zero-stage", type=int, choices=(1, 2, 3), default=3,
                       help="use configs/deepspeed/zero<N>.json (default 3)")
    which.add_argument("--ds-config", type=Path, help="a DeepSpeed config file instead")
    args = parser.parse_args(argv)
    harness.setup(args)
    accelerator = os.environ.get("DS_ACCELERATOR", args.device)  # DeepSpeed's accelerator names are the devices'
    if accelerator != args.device:
        raise SystemExit(f"--device {args.device} with DS_ACCELERATOR={accelerator}: DeepSpeed would place the model "
                         f"on {accelerator}; set DS_ACCELERATOR={args.device}")
    device = harness.select_device(args.device)

    # Under mpiexec DeepSpeed's MPI discovery sets the rendezvous port: MASTER_PORT where given, else its 29500.
    deepspeed.init_distributed(dist_backend=args.comm_backend,
                               distributed_port=int(os.environ.get("MASTER_PORT") or 29500))
    release_shared_memory()  # DeepSpeed never unlinks its /dev/shm segments
    config = load_config(args.ds_config or CONFIGS / f"zero{args.zero_stage}.json", args.batch_size)
    stage = config.get("zero_optimization", {}).get("stage", 0)
    model = harness.build_model(args)
    params = model.num_params()  # before ZeRO-3 partitions them
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=harness.make_optimizer(model.parameters(), args),
                                           config=config)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        _, loss = engine(x.to(device), y.to(device))
        engine.backward(loss)
        engine.step()
        return loss.item()

    def evaluate(x: torch.Tensor, y: torch.Tensor) -> float:
        return engine(x.to(device), y.to(device))[1].item()

    with harness.comm_meter(args.comm_backend == "pccl") as meter:
        result = harness.train(args, step, evaluate, meter, framework=f"deepspeed-zero{stage}",
                               comm=args.comm_backend, params=params)
    harness.write_outputs(args, result)
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
