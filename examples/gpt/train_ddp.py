"""Train the example GPT with DDP, its gradient all-reduce through pccl or gloo.

    PCCL_LOCAL_SIZE=2 mpiexec -n 4 python examples/gpt/train_ddp.py --comm pccl
    PCCL_LOCAL_SIZE=2 mpiexec -n 4 python examples/gpt/train_ddp.py --comm gloo

--comm pccl       torch.distributed's default group is a ``pccl`` process group; DDP all-reduces on it
--comm pccl-hook  the default group stays gloo; pccl's DDP comm hook all-reduces the gradients
--comm gloo       plain gloo (through torch's stock all-reduce hook, so its all-reduces can be timed)
--comm gloo-bf16  gloo with torch's ``bf16_compress_hook`` (the bucket cast to bfloat16 and summed in
                  bfloat16): the stock counterpart of ``--comm pccl-hook --compression all_reduce:bf16``
--comm nccl       torch's NCCL (``--device cuda`` only), the baseline a GPU user has

``--device cuda`` trains on each rank's GPU; the ``pccl`` group then takes the CUDA gradients
(``cpu:gloo,cuda:pccl``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import harness
import pccl_torch as pc
from pccl_torch.integrations.ddp import allreduce_hook

COMMS = ("pccl", "pccl-hook", "gloo", "gloo-bf16", "nccl")


def wrap(model: torch.nn.Module, comm: str, device: torch.device) -> DDP:
    """Initialise torch.distributed for ``comm`` and wrap ``model`` (on ``device``) in DDP reducing through it."""
    ids = [device.index] if device.type == "cuda" else None
    if comm in ("pccl", "nccl"):
        # rank, world size and address from MPI
        pc.init_process_group(harness.process_group_backend(comm, device))
        return DDP(model, device_ids=ids)
    if comm == "pccl-hook":
        pc.init(device=device if device.type == "cuda" else None)  # gloo default group plus pccl's communicator
        ddp = DDP(model, device_ids=ids)
        ddp.register_comm_hook(None, allreduce_hook)
        return ddp
    pc.init_process_group("gloo")
    ddp = DDP(model, device_ids=ids)
    hook = default_hooks.bf16_compress_hook if comm == "gloo-bf16" else default_hooks.allreduce_hook
    ddp.register_comm_hook(dist.group.WORLD, hook)
    return ddp


def main(argv: list[str] | None = None) -> harness.RunResult:
    """Train with the command-line arguments ``argv``; returns the run's record (every rank)."""
    parser = harness.build_parser(__doc__)
    parser.add_argument("--comm", choices=COMMS, default="pccl")
    args = parser.parse_args(argv)
    harness.setup(args)
    device = harness.select_device(args.device)

    model = harness.build_model(args, device)
    ddp = wrap(model, args.comm, device)
    optimizer = harness.make_optimizer(ddp.parameters(), args)

    step = harness.sgd_step(ddp, optimizer, device)

    def evaluate(x: torch.Tensor, y: torch.Tensor) -> float:
        return model(x.to(device), y.to(device))[1].item()  # the unwrapped module: no collectives

    with harness.comm_meter(args.comm.startswith("pccl")) as meter:
        result = harness.train(args, step, evaluate, meter, framework="ddp", comm=args.comm,
                               params=model.num_params())
    harness.write_outputs(args, result)
    harness.close()
    return result


if __name__ == "__main__":
    main()
