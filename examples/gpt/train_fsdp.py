"""Train the example GPT with FSDP2 (``fully_shard`` per block and at the root), its parameter
all-gathers and gradient reduce-scatters through pccl or gloo.

    PCCL_LOCAL_SIZE=2 mpiexec -n 4 python examples/gpt/train_fsdp.py --comm pccl
    PCCL_LOCAL_SIZE=2 mpiexec -n 4 python examples/gpt/train_fsdp.py --comm gloo

With ``--comm pccl``, FSDP keeps its gloo group for everything else (DTensor ops, state dicts);
``pccl_torch.integrations.fsdp.fully_shard(..., comm="pccl")`` sets FSDP's custom all-gather and
reduce-scatter on every sharded module. ``--device cuda`` trains on each rank's GPU (``--comm nccl``: FSDP on
torch's NCCL, the baseline a GPU user has).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import harness
import pccl_torch as pc
from pccl_torch.integrations.fsdp import fully_shard

COMMS = ("pccl", "gloo", "nccl")


def shard(model: torch.nn.Module, comm: str, device: torch.device) -> None:
    """Initialise torch.distributed for ``comm`` and shard ``model`` (on ``device``): each block, then the rest."""
    if comm == "pccl":
        pc.init(device=device if device.type == "cuda" else None)  # gloo default group plus pccl's communicator
    else:  # rank, world size and address from MPI
        pc.init_process_group(harness.process_group_backend(comm, device))
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    fsdp_comm = "pccl" if comm == "pccl" else "default"
    for block in model.blocks:
        fully_shard(block, mesh=mesh, comm=fsdp_comm)
    fully_shard(model, mesh=mesh, comm=fsdp_comm)


def main(argv: list[str] | None = None) -> harness.RunResult:
    """Train with the command-line arguments ``argv``; returns the run's record (every rank)."""
    parser = harness.build_parser(__doc__)
    parser.add_argument("--comm", choices=COMMS, default="pccl")
    args = parser.parse_args(argv)
    harness.setup(args)
    device = harness.select_device(args.device)

    model = harness.build_model(args, device)
    params = model.num_params()  # before sharding: afterwards each rank holds a shard
    shard(model, args.comm, device)
    optimizer = harness.make_optimizer(model.parameters(), args)

    step = harness.sgd_step(model, optimizer, device)

    def evaluate(x: torch.Tensor, y: torch.Tensor) -> float:
        return model(x.to(device), y.to(device))[1].item()

    with harness.comm_meter(args.comm == "pccl") as meter:
        result = harness.train(args, step, evaluate, meter, framework="fsdp2", comm=args.comm, params=params)
    harness.write_outputs(args, result)
    harness.close()
    return result


if __name__ == "__main__":
    main()
