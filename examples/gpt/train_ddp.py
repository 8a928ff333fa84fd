"""Train the example GPT with DDP, its gradient all-reduce through pccl or gloo.

    PCCL_LOCAL_SIZE=2 mpiexec -n 4 python examples/gpt/train_ddp.py --comm pccl
    PCCL_LOCAL_SIZE=2 mpiexec -n 4 python examples/gpt/train_ddp.py --comm gloo

--comm pccl       torch.distributed's default group is a ``pccl`` process group; DDP all-reduces on it
--comm pccl-hook  the default group stays gloo; pccl's DDP comm hook all-reduces the gradients
--comm gloo       plain gloo (through torch's stock all-reduce hook, so its all-reduces can be timed)
--comm gloo-bf16  gloo with torch's ``bf16_compress_hook`` (the bucket cast to bfloat16 and summed in
                  bfloat16): the stock counterpart of ``--comm pccl-hook --compression all_reduce:bf16``
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import harness
import pccl_torch as pc
from pccl_torch.integrations.ddp import allreduce_hook

COMMS = ("pccl", "pccl-hook", "gloo", "gloo-bf16")


def wrap(model: torch.nn.Module, comm: str) -> DDP:
    """Initialise torch.distributed for ``comm`` and wrap ``model`` in DDP reducing through it."""
    if comm == "pccl":
        pc.init_process_group("pccl")  # rank, world size and address from MPI
        return DDP(model)
    if comm == "pccl-hook":
        pc.init()  # gloo default group plus pccl's communicator
        ddp = DDP(model)
        ddp.register_comm_hook(None, allreduce_hook)
        return ddp
    pc.init_process_group("gloo")
    ddp = DDP(model)
    hook = default_hooks.bf16_compress_hook if comm == "gloo-bf16" else default_hooks.allreduce_hook
    ddp.register_comm_hook(dist.group.WORLD, hook)
    return ddp


def main(argv: list[str] | None = None) -> harness.RunResult:
    """Train with the command-line arguments ``argv``; returns the run's record (every rank)."""
    parser = harness.build_parser(__doc__)
    parser.add_argument("--comm", choices=COMMS, default="pccl")
    args = parser.parse_args(argv)
    harness.setup(args)

    model = harness.build_model(args)
    ddp = wrap(model, args.comm)
    optimizer = harness.make_optimizer(ddp.parameters(), args)

    step = harness.sgd_step(ddp, optimizer)

    def evaluate(x: torch.Tensor, y: torch.Tensor) -> float:
        return model(x, y)[1].item()  # the unwrapped module: no collectives

    with harness.comm_meter(args.comm.startswith("pccl")) as meter:
        result = harness.train(args, step, evaluate, meter, framework="ddp", comm=args.comm,
                               params=model.num_params())
    harness.write_outputs(args, result)
    harness.close()
    return result


if __name__ == "__main__":
    main()
