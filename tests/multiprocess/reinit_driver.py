"""``pccl_torch.init()`` again after ``pccl_torch.shutdown()`` in one process, under torchrun (or mpiexec).

Each of ``--cycles`` rounds: ``init()`` (which, with no torch.distributed group yet, makes the default group
from the launcher's variables and owns it), an all-reduce checked against its exact sum, the topology, and
``shutdown()`` (which destroys that group). A hang fails fast: the driver dumps its stacks and exits 3 after
``--deadline`` seconds. Every rank writes its result (``rank_result``) after its last ``shutdown()``.
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import pccl_torch as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script by torchrun or mpiexec
import rank_result  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=90.0)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.deadline, exit=True)  # a hang ends the rank (exit 1) with its stacks
    rounds = []
    for cycle in range(args.cycles):
        start = time.perf_counter()
        comm = pc.init()
        rank, size = dist.get_rank(), dist.get_world_size()
        x = torch.full((5,), float(rank + 1 + cycle))
        pc.all_reduce(x)
        expected = size * (size + 1) / 2 + size * cycle
        t = comm.topology
        rounds.append({"sum_ok": x.tolist() == [expected] * 5, "topology": [t.world_size, t.num_nodes, t.local_size],
                       "transport": comm.transport, "seconds": time.perf_counter() - start})
        pc.shutdown()
        rounds[-1]["torch_initialized_after_shutdown"] = dist.is_initialized()
    faulthandler.cancel_dump_traceback_later()
    rank_result.write({"rounds": rounds, "torch_rank": rank})


if __name__ == "__main__":
    main()
