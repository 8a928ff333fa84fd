"""Train the example GPT with a mixture-of-experts feed-forward: experts spread over the ranks (expert
parallel), every other parameter replicated (data parallel). Tokens travel to their experts and back by
``torch.distributed.all_to_all_single`` with uneven splits, through pccl or gloo.

    PCCL_LOCAL_SIZE=2 mpiexec -n 4 python examples/gpt/train_moe.py --comm pccl     # or gloo
    PCCL_LOCAL_SIZE=2 torchrun --standalone --nproc-per-node 4 examples/gpt/train_moe.py --comm pccl
    PCCL_COMPRESSION=all_to_all:bf16 mpiexec -n 4 python examples/gpt/train_moe.py --comm pccl

--comm pccl   torch.distributed's default group is a ``pccl`` process group (``cpu:gloo,cuda:pccl`` with
              ``--device cuda``): the all-to-alls and the gradient all-reduce go through it
--comm gloo   plain gloo
--comm nccl   ``cpu:gloo,cuda:nccl`` (``--device cuda`` only)

A step: forward (each block's MoE layer makes three all-to-alls: the row counts, the tokens out to their
experts, the results back), backward (two more per layer: the gradients of the tokens and results), then one
all-reduce of every replicated parameter's gradient, averaged over ranks. The experts' gradients already sum
every rank's tokens; divided by the number of ranks they are the gradient of the mean loss over ranks, as the
replicated parameters' are, so the run trains the same model as one process on all the ranks' batches.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import harness
import pccl_torch as pc  # also registers the "pccl" backend
from data import VOCAB_SIZE
from model import GPT, GPTConfig
from moe import aux_loss, split_parameters

COMMS = ("pccl", "gloo", "nccl")


def build_moe_model(args: argparse.Namespace, device: torch.device) -> GPT:
    """The MoE GPT of ``args`` (after ``init_process_group``: each rank keeps its share of the experts),
    initialised identically on every rank and for every backend."""
    torch.manual_seed(args.seed)
    config = GPTConfig(vocab_size=VOCAB_SIZE, block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
                       n_embd=args.n_embd, moe_experts=args.moe_experts or 2 * dist.get_world_size())
    return GPT(config).to(device)


def all_reduce_mean(grads: list[torch.Tensor]) -> None:
    """Average ``grads`` over ranks in place, as one flat all-reduce (DDP would use buckets)."""
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def main(argv: list[str] | None = None) -> harness.RunResult:
    """Train with the command-line arguments ``argv``; returns the run's record (every rank)."""
    parser = harness.build_parser(__doc__)
    parser.add_argument("--comm", "--backend", dest="comm", choices=COMMS, default="pccl")
    parser.add_argument("--moe-experts", type=int, default=0,
                        help="experts a layer, a multiple of the ranks (default: 2 a rank)")
    parser.add_argument("--aux-loss-coef", type=float, default=0.01,
                        help="weight of the load-balancing loss (trained on, not reported)")
    args = parser.parse_args(argv)
    harness.setup(args)
    device = harness.select_device(args.device)
    if os.environ.get("RANK"):  # torchrun (or another launcher that sets torch's variables)
        dist.init_process_group(harness.process_group_backend(args.comm, device))
    else:  # mpiexec, or one process: rank, world size and address from MPI
        pc.init_process_group(harness.process_group_backend(args.comm, device))

    model = build_moe_model(args, device)
    replicated, experts = split_parameters(model)
    optimizer = harness.make_optimizer(model.parameters(), args)
    world = dist.get_world_size()

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        _, loss = model(x.to(device), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        (loss + args.aux_loss_coef * aux_loss(model)).backward()
        all_reduce_mean([p.grad for p in replicated])
        for p in experts:  # summed over every rank's tokens: the gradient of the mean loss is 1/world of it
            p.grad /= world
        optimizer.step()
        return loss.item()

    @torch.no_grad()
    def evaluate(x: torch.Tensor, y: torch.Tensor) -> float:
        return model(x.to(device), y.to(device))[1].item()  # the all-to-alls run here too, on every rank

    params = sum(p.numel() for p in replicated) + world * sum(p.numel() for p in experts)
    with harness.comm_meter(args.comm == "pccl") as meter:
        result = harness.train(args, step, evaluate, meter, framework="moe", comm=args.comm, params=params)
    harness.write_outputs(args, result)
    harness.close()
    return result


if __name__ == "__main__":
    main()
