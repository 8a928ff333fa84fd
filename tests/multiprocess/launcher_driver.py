"""A training script as a torchrun / DeepSpeed-launcher user writes it: ``dist.init_process_group("pccl")`` with
no MPI launch around it (pccl's levels are then torch groups: ``pccl_torch.launcher``).

Checks, each against the same computation on a gloo group of the same ranks:
- every algorithm pccl accepts for CPU tensors, on float32, bfloat16 and int64 buffers of several sizes (empty
  and odd included), all-reduce results bitwise identical on every rank, and each wire format once;
- DDP, and FSDP2 with ``clip_grad_norm_``, on the default (pccl) group: the same losses as on gloo (rel 1e-5);
- device maps: a ``"cpu:gloo,cuda:pccl"`` group leaves CPU tensors to gloo, a ``"cpu:pccl,cuda:gloo"`` one runs them.
Results are gathered over a gloo group (no MPI); rank 0 prints "N passed, M failed" and writes --json, with
pccl's counters (``pccl_torch.stats("all")``). Every rank also writes its own result (``rank_result``) after
``destroy_process_group()`` returned.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import pccl_torch as pc
import rank_result  # this folder is on sys.path when the driver runs as a script
from _training import sgd_steps  # this folder is on sys.path when the driver runs as a script
from torch_backend_driver import check_device_maps
from pccl_torch.compression import NAMES as WIRE_FORMATS
from pccl_torch.integrations.torch_backend import communicator_of

SIZES = (0, 1, 7, 1000)
"""Elements per rank's block (all-gather, reduce-scatter) or of the buffer (all-reduce)."""
DTYPES = (torch.float32, torch.bfloat16, torch.int64)


def _values(numel: int, rank: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Small integers, so that every sum is exact in every dtype and any algorithm's order gives the same bits."""
    g = torch.Generator().manual_seed(seed * 131 + rank)
    return torch.randint(-4, 5, (numel,), generator=g).to(dtype)


def check_collectives(comm: pc.Communicator, gloo: dist.ProcessGroup) -> list[str]:
    """Every algorithm x dtype x size of the three collectives against gloo; a list of what failed."""
    rank, size = comm.topology.rank, comm.topology.world_size
    failures: list[str] = []
    seed = 0
    for collective in ("all_gather", "reduce_scatter", "all_reduce"):
        for name in pc.algorithms(collective, "cpu"):
            for dtype in DTYPES:
                for n in SIZES:
                    seed += 1
                    what = f"{collective} {name} {dtype} n={n}"
                    try:
                        problem = _check_one(comm, gloo, collective, name, dtype, n, rank, size, seed)
                    except Exception as exc:  # noqa: BLE001 - reported, the sweep goes on
                        problem = f"{type(exc).__name__}: {exc}"
                    if problem:
                        failures.append(f"{what}: {problem}")
    for fmt in WIRE_FORMATS:  # each wire format on the default plan and on the pipelined hierarchy
        for algorithm in (None, "hier:pipelined"):
            seed += 1
            try:
                problem = _check_compressed(comm, gloo, fmt, algorithm, rank, size, seed)
            except Exception as exc:  # noqa: BLE001
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                failures.append(f"compression {fmt} ({algorithm or 'auto'}): {problem}")
    return failures


def _check_one(comm, gloo, collective: str, name: str, dtype: torch.dtype, n: int, rank: int, size: int,
               seed: int) -> str | None:
    if collective == "all_gather":
        mine = _values(n, rank, dtype, seed)
        out, ref = torch.empty(size * n, dtype=dtype), torch.empty(size * n, dtype=dtype)
        pc.all_gather_into_tensor(out, mine, algorithm=name, comm=comm)
        dist.all_gather_into_tensor(ref, mine, group=gloo)
    elif collective == "reduce_scatter":
        full = _values(size * n, rank, dtype, seed)
        keep = full.clone()
        out, ref = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
        pc.reduce_scatter_tensor(out, full, algorithm=name, comm=comm)
        if not torch.equal(full, keep):
            return "the input was modified"
        dist.reduce_scatter_tensor(ref, full, group=gloo)
    else:
        out = _values(n, rank, dtype, seed)
        ref = out.clone()
        pc.all_reduce(out, algorithm=name, comm=comm)
        dist.all_reduce(ref, group=gloo)
        if _differs_across_ranks(out, gloo):
            return "all-reduce results differ between ranks"
    if not torch.equal(out, ref):
        return f"differs from gloo at {int((out != ref).sum())} of {out.numel()} elements"
    return None


def _check_compressed(comm, gloo, fmt: str, algorithm: str | None, rank: int, size: int, seed: int) -> str | None:
    """A float32 all-reduce with ``fmt`` between nodes: identical on every rank, close to gloo's sum (lossless:
    equal to it, on integer values whose sums are exact in any order). ``hier:pipelined`` needs 2 levels."""
    if algorithm is not None and not comm.topology.is_hierarchical:
        return None
    buf = (_values(4099, rank, torch.float32, seed) if fmt == "lossless"
           else torch.randn(4099, generator=torch.Generator().manual_seed(seed + rank)))
    ref = buf.clone()
    pc.all_reduce(buf, comm=comm, compression=fmt, algorithm=algorithm)
    dist.all_reduce(ref, group=gloo)
    if _differs_across_ranks(buf, gloo):
        return "results differ between ranks"
    error = (buf - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
    bound = {"lossless": 0.0, "bf16": 2e-2, "int8": 5e-2, "fp8": 2e-1}.get(fmt, 2e-1)
    return None if error <= bound else f"relative error {error:.3g} above {bound}"


def _differs_across_ranks(tensor: torch.Tensor, gloo: dist.ProcessGroup) -> bool:
    rows = [torch.empty_like(tensor) for _ in range(gloo.size())]
    dist.all_gather(rows, tensor, group=gloo)
    return any(not torch.equal(row.view(torch.uint8) if row.numel() else row, tensor.view(torch.uint8)
                               if tensor.numel() else tensor) for row in rows)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.GELU(),
                               torch.nn.Linear(32, 1))


def train_ddp(group: dist.ProcessGroup | None, rank: int) -> list[float]:
    return sgd_steps(DDP(_model(), process_group=group), rank, features=12, batch=6, lr=0.05, seed=3)


def train_fsdp2(mesh: DeviceMesh, rank: int) -> list[float]:
    model = _model()
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return sgd_steps(model, rank, features=12, batch=6, lr=0.05, seed=7,
                     before_step=lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0))


def check_training(rank: int, size: int, gloo: dist.ProcessGroup) -> list[str]:
    failures = []
    # What each issues: DDP all-reduces gradients; FSDP2 all-gathers parameters, reduce-scatters gradients, and
    # clip_grad_norm_ all-reduces the norm.
    for name, kinds, on_pccl, on_gloo in (
        ("DDP", ("all_reduce",), lambda: train_ddp(None, rank), lambda: train_ddp(gloo, rank)),
        ("FSDP2", ("all_gather", "reduce_scatter", "all_reduce"),
         lambda: train_fsdp2(init_device_mesh("cpu", (size,)), rank),
         lambda: train_fsdp2(DeviceMesh.from_group(gloo, "cpu"), rank)),
    ):
        before = pc.stats("all")["calls"]
        losses = on_pccl()
        ran = {c: n - before.get(c, 0) for c, n in pc.stats("all")["calls"].items()}
        reference = on_gloo()
        if not torch.allclose(torch.tensor(losses), torch.tensor(reference), rtol=1e-5, atol=1e-6):
            failures.append(f"{name} losses differ from gloo's: {losses} vs {reference}")
        if min(ran.get(kind, 0) for kind in kinds) == 0:
            failures.append(f"{name} did not run every {'/'.join(kinds)} through pccl: {ran}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--skip", default="", help="comma list of checks to skip: collectives, training, device maps")
    args = parser.parse_args()
    dist.init_process_group("pccl")
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    comm = communicator_of(dist.group.WORLD)
    failures: list[str] = []
    skip = set(filter(None, args.skip.split(",")))
    everything: dict = {}
    for name, check in (("collectives", lambda: check_collectives(comm, gloo)),
                        ("training", lambda: check_training(rank, size, gloo)),
                        ("device maps", lambda: list(filter(None, [check_device_maps(rank, size)])))):
        if name == "device maps":  # the counters before it: its gloo-mapped group hands CPU calls to gloo
            everything = pc.stats("all")
        if name in skip:
            continue
        try:
            failures += check()
        except Exception:  # noqa: BLE001 - reported to the test
            failures.append(f"{name}: {traceback.format_exc()}")
    mine = {"failures": failures, "passed": int(not failures), "transport": everything["transport"],
            "calls": everything["calls"], "bypassed": everything["bypassed"],
            "topology": [comm.topology.num_nodes, comm.topology.local_size, comm.topology.hosts],
            "launcher": {k: os.environ.get(k) for k in ("LOCAL_WORLD_SIZE", "GROUP_RANK", "CROSS_RANK", "LOCAL_SIZE")}}
    everyone: list[dict] = [{} for _ in range(size)]
    dist.all_gather_object(everyone, mine, group=gloo)
    if rank == 0:
        failed = [f"rank {r}: {f}" for r, entry in enumerate(everyone) for f in entry["failures"]]
        passed = sum(entry["passed"] for entry in everyone)
        print(f"{passed} passed, {len(failed)} failed")
        for line in failed[:40]:
            print(line, file=sys.stderr)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"passed": passed, "failures": failed, "ranks": everyone}, fh)
    dist.destroy_process_group()
    rank_result.write(mine, rank)  # after the teardown returned: the test checks every rank's
    return 0 if not any(entry["failures"] for entry in everyone) else 1


if __name__ == "__main__":
    sys.exit(main())
