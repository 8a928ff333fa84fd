"""A Hugging Face accelerate script, started by ``accelerate launch``, with pccl as its process group.

On CPU, accelerate replaces any backend given through ``InitProcessGroupKwargs`` with gloo, so the script makes
the process group pccl itself before creating the Accelerator, which then uses the group that exists.
Rank 0 writes --json: the losses, the default group's type and pccl's counters.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from accelerate import Accelerator

import pccl_torch as pc
from _training import sgd_steps  # this folder is on sys.path when the driver runs as a script


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="pccl", choices=["pccl", "gloo"])
    parser.add_argument("--json")
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    model = accelerator.prepare(model)
    losses = sgd_steps(model, accelerator.process_index, features=12, batch=6, lr=0.05, seed=5)
    everything = pc.stats("all")
    if accelerator.is_main_process and args.json:
        with open(args.json, "w") as fh:
            json.dump({"losses": losses, "default_group": type(dist.group.WORLD).__name__,
                       "transport": everything["transport"], "calls": everything["calls"]}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
