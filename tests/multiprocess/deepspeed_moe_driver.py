"""DeepSpeed's own mixture-of-experts layer (``deepspeed.moe.layer.MoE``) trained a few steps on CPU ranks with
``--comm_backend pccl`` or ``gloo`` (DeepSpeed's engine, ZeRO stage 0 or 1, expert parallel over every rank),
under mpiexec or torchrun.

Every rank writes its result (``rank_result``) after ``destroy_process_group()`` returned: its losses and, on
pccl, what pccl ran (its counters, summed over every pccl group: DeepSpeed builds its expert groups with
``new_group`` on the world's backend) and what the groups handed to gloo.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections import Counter
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.moe.layer import MoE

import pccl_torch as pc
from pccl_torch.integrations.deepspeed import add_comm_arguments, release_shared_memory
from pccl_torch.integrations.torch_backend import PcclProcessGroup, bypassed, pccl_groups

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script
import rank_result  # noqa: E402

HIDDEN, EXPERTS, TOKENS = 16, 8, 32


class Net(torch.nn.Module):
    """Linear -> DeepSpeed MoE (top-2, an MLP per expert, expert parallel over every rank) -> linear head."""

    def __init__(self, ep_size: int) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(HIDDEN, HIDDEN)
        expert = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 2 * HIDDEN), torch.nn.GELU(),
                                     torch.nn.Linear(2 * HIDDEN, HIDDEN))
        # drop_tokens=False: no capacity limit, so the token counts a rank sends vary (uneven all-to-alls)
        self.moe = MoE(HIDDEN, expert, num_experts=EXPERTS, ep_size=ep_size, k=2, drop_tokens=False,
                       use_rts=False, top2_2nd_expert_sampling=False)
        self.out = torch.nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, aux, _ = self.moe(torch.relu(self.inp(x)))
        return self.out(h), aux


def main() -> None:
    parser = argparse.ArgumentParser()
    add_comm_arguments(parser)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--zero-stage", type=int, default=0)
    args = parser.parse_args()
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    # Under mpiexec DeepSpeed's MPI discovery takes this port (29500 otherwise): the test gives each launch a free one.
    deepspeed.init_distributed(dist_backend=args.comm_backend,
                               distributed_port=int(os.environ.get("MASTER_PORT") or 29500))
    release_shared_memory()  # DeepSpeed never unlinks its /dev/shm segments
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Net(ep_size=world)
    config = {"train_batch_size": 4 * world, "train_micro_batch_size_per_gpu": 4,
              "zero_optimization": {"stage": args.zero_stage}, "gradient_clipping": 0.0,
              "zero_force_ds_cpu_optimizer": False, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10**9}
    # DeepSpeed's MoE recipe: the expert parameters in param groups of their own (ZeRO needs it)
    groups = deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "params"})
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(groups, lr=0.05), config=config)
    on_pccl = isinstance(dist.group.WORLD, PcclProcessGroup)
    before = pc.stats("all")["calls"] if on_pccl else {}
    target = torch.randn(HIDDEN, 1, generator=torch.Generator().manual_seed(7))  # what there is to learn
    x = torch.randn(4, TOKENS // 4, HIDDEN, generator=torch.Generator().manual_seed(100 + rank))
    y = torch.tanh(x) @ target  # one batch a rank, every step: the loss must fall
    losses = []
    for _ in range(args.steps):
        pred, aux = engine(x)
        loss = torch.nn.functional.mse_loss(pred, y)
        engine.backward(loss + 0.01 * aux)
        engine.step()
        losses.append(loss.item())
    result: dict = {"backend": args.comm_backend, "losses": losses, "default_group": type(dist.group.WORLD).__name__}
    if on_pccl:
        after = pc.stats("all")["calls"]
        result["pccl_calls"] = {c: n - before.get(c, 0) for c, n in after.items()}
        result["bypassed"] = {k: v for pg in pccl_groups() for k, v in bypassed(pg).items()}
        result["delegated"] = dict(sum((pg.delegated for pg in pccl_groups()), Counter()))
        result["pccl_groups"] = len(pccl_groups())
    dist.destroy_process_group()
    rank_result.write(result)


if __name__ == "__main__":
    main()
