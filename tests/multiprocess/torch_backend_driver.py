"""The ``pccl`` torch.distributed backend and the DDP hook under mpiexec, against plain gloo.

Every rank runs every check and reports failures; rank 0 prints "N passed, M failed" and writes --json.
Every rank also writes its own result (``rank_result``) after ``pc.shutdown()`` returned.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import traceback
import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from mpi4py import MPI
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel as DDP

import pccl_torch as pc
import rank_result  # this folder is on sys.path when the driver runs as a script
from _training import sgd_steps  # this folder is on sys.path when the driver runs as a script
from pccl_torch.integrations.ddp import allreduce_hook
from pccl_torch.integrations.torch_backend import PcclProcessGroup, bypassed, communicator_of


def close(a: torch.Tensor, b: torch.Tensor, what: str) -> str | None:
    return None if torch.allclose(a, b, rtol=1e-6, atol=1e-6) else f"{what}: {a.flatten()[:4]} vs {b.flatten()[:4]}"


def check_collectives(pg, gloo, rank: int, size: int) -> str | None:
    """Every routed and delegated call on the pccl group against the same call on a gloo group (what pccl hands
    to gloo, dtypes and ops it does not implement, is checked by dropin_driver.py)."""
    x = torch.arange(10, dtype=torch.float32) + rank
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, op=op, group=pg)
        dist.all_reduce(b, op=op, group=gloo)
        if problem := close(a, b, f"all_reduce {op}"):
            return problem
    # PREMUL_SUM as FSDP builds it (gloo has none: the reference is factor x SUM)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, op=dist._make_nccl_premul_sum(0.5), group=pg)
    dist.all_reduce(b, group=gloo)
    if problem := close(a, 0.5 * b, "all_reduce PREMUL_SUM(0.5)"):
        return problem
    out_a, out_b = torch.empty(10 * size), torch.empty(10 * size)
    dist.all_gather_into_tensor(out_a, x, group=pg)
    dist.all_gather_into_tensor(out_b, x, group=gloo)
    if problem := close(out_a, out_b, "all_gather_into_tensor"):
        return problem
    lists_a, lists_b = [torch.empty(10) for _ in range(size)], [torch.empty(10) for _ in range(size)]
    dist.all_gather(lists_a, x, group=pg)
    dist.all_gather(lists_b, x, group=gloo)
    if problem := close(torch.stack(lists_a), torch.stack(lists_b), "all_gather (list)"):
        return problem
    big = torch.arange(6 * size, dtype=torch.float32) * (rank + 1)
    rs_a, rs_b = torch.empty(6), torch.empty(6)
    dist.reduce_scatter_tensor(rs_a, big, group=pg)
    dist.reduce_scatter_tensor(rs_b, big, group=gloo)
    if problem := close(rs_a, rs_b, "reduce_scatter_tensor"):
        return problem
    dist.reduce_scatter_tensor(rs_a, big, op=dist._make_nccl_premul_sum(torch.tensor(0.25)), group=pg)
    if problem := close(rs_a, 0.25 * rs_b, "reduce_scatter_tensor PREMUL_SUM(tensor 0.25)"):
        return problem
    dist.reduce_scatter(rs_a, list(big.chunk(size)), op=dist.ReduceOp.MAX, group=pg)
    dist.reduce_scatter(rs_b, list(big.chunk(size)), op=dist.ReduceOp.MAX, group=gloo)
    if problem := close(rs_a, rs_b, "reduce_scatter (list, MAX)"):
        return problem
    work = dist.all_reduce(x.clone(), group=pg, async_op=True)
    work.wait()
    if not work.is_completed():
        return "async all_reduce work not completed after wait()"
    # Delegated to gloo: they must still work on the pccl group.
    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=0, group=pg)
    if problem := close(b, torch.zeros(3), "broadcast (delegated)"):
        return problem
    dist.barrier(group=pg)
    # All-to-all through pccl: equal, uneven (rank i sends rank j (i + j) % 3 rows, zeros included), list form.
    a2a = torch.empty(size)
    dist.all_to_all_single(a2a, torch.arange(size, dtype=torch.float32) + 10 * rank, group=pg)
    if problem := close(a2a, torch.tensor([10.0 * r + rank for r in range(size)]), "all_to_all_single"):
        return problem
    sends, recvs = [(rank + j) % 3 for j in range(size)], [(i + rank) % 3 for i in range(size)]
    uneven_in = torch.cat([torch.full((n, 2), 10.0 * rank + j) for j, n in enumerate(sends)])
    uneven_out, reference = torch.empty(sum(recvs), 2), torch.empty(sum(recvs), 2)
    dist.all_to_all_single(uneven_out, uneven_in, recvs, sends, group=pg)
    dist.all_to_all_single(reference, uneven_in, recvs, sends, group=gloo)
    if problem := close(uneven_out, reference, "all_to_all_single (uneven splits)"):
        return problem
    outs = [torch.empty(n, dtype=torch.int64) for n in recvs]
    dist.all_to_all(outs, [torch.full((n,), 10 * rank + j, dtype=torch.int64) for j, n in enumerate(sends)], group=pg)
    if problem := close(torch.cat(outs), torch.cat([torch.full((n,), 10 * i + rank, dtype=torch.int64)
                                                    for i, n in enumerate(recvs)]), "all_to_all (list)"):
        return problem
    calls = pc.stats(communicator_of(pg))["calls"]
    if min(calls.get(c, 0) for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")) == 0:
        return f"pccl counters missed a collective: {calls}"
    if bypassed(pg):
        return f"collectives bypassed pccl to the vendor group: {bypassed(pg)}"
    if min(pg.delegated.get(n, 0) for n in ("broadcast", "barrier")) == 0:
        return f"delegated calls not counted: {dict(pg.delegated)}"
    return None


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def train(ddp: DDP, rank: int, steps: int = 5) -> tuple[list[float], torch.Tensor]:
    losses = sgd_steps(ddp, rank, features=8, batch=4, lr=0.1, seed=100, steps=steps)
    return losses, torch.cat([p.detach().flatten() for p in ddp.parameters()])


def check_ddp(pg, gloo, rank: int) -> str | None:
    """DDP over gloo, over the pccl group, and over gloo with pccl's comm hook: same losses and weights."""
    base_losses, base_params = train(DDP(_model(), process_group=gloo), rank)
    before = pc.stats(communicator_of(pg))["calls"].get("all_reduce", 0)
    pg_losses, pg_params = train(DDP(_model(), process_group=pg), rank)
    if pc.stats(communicator_of(pg))["calls"].get("all_reduce", 0) <= before:
        return "DDP over the pccl group did not all-reduce through pccl"
    if bypassed(pg):
        return f"DDP collectives bypassed pccl: {bypassed(pg)}"
    hooked = DDP(_model(), process_group=gloo)
    hooked.register_comm_hook(None, allreduce_hook)
    hook_before = pc.stats()["calls"].get("all_reduce", 0)
    hook_losses, hook_params = train(hooked, rank)
    if pc.stats()["calls"].get("all_reduce", 0) <= hook_before:
        return "the DDP comm hook did not all-reduce through pccl"
    for name, losses, params in (("pccl group", pg_losses, pg_params), ("comm hook", hook_losses, hook_params)):
        if problem := close(torch.tensor(losses), torch.tensor(base_losses), f"DDP {name} losses"):
            return problem
        if problem := close(params, base_params, f"DDP {name} final parameters"):
            return problem
    return None


def check_subgroup(rank: int, size: int) -> str | None:
    """A pccl subgroup of the even ranks: created without the odd ranks, correct on its members."""
    members = list(range(0, size, 2))
    sub = dist.new_group(members, backend="pccl")
    if rank not in members:
        return None
    if not isinstance(sub, PcclProcessGroup):
        return f"new_group(backend='pccl') gave {type(sub).__name__}"
    t = torch.full((5,), float(rank))
    dist.all_reduce(t, group=sub)
    return close(t, torch.full((5,), float(sum(members))), "subgroup all_reduce")


def check_destroy_frees_the_group(rank: int, size: int) -> str | None:
    """destroy_process_group on a pccl group closes its communicators and frees its private gloo groups now (their
    threads joined while the interpreter is whole), and the destroyed group refuses further use."""
    group = dist.new_group(backend="pccl")
    t = torch.full((3,), float(rank))
    dist.all_reduce(t, group=group)
    if problem := close(t, torch.full((3,), float(sum(range(size)))), "all_reduce before the destroy"):
        return problem
    comms = group.communicators()
    private = [weakref.ref(group.vendor)] + [weakref.ref(c.intra_torch.group) for c in comms]
    dist.destroy_process_group(group)
    gc.collect()
    if not all(c.closed for c in comms):
        return "a communicator of the destroyed group is still open"
    alive = sum(ref() is not None for ref in private)
    if alive:
        return f"{alive} of the group's {len(private)} private torch groups outlived destroy_process_group"
    try:
        group.vendor
    except RuntimeError as exc:
        return None if "destroyed" in str(exc) else f"the destroyed group's error does not say so: {exc}"
    return "a destroyed pccl group still hands out its vendor group"


def check_functional_and_mesh(pg, rank: int, size: int) -> str | None:
    """Functional collectives (by group, by group name, by DeviceMesh) and DTensor redistributions on a
    pccl group: right results, and their all-gathers, reduce-scatters and all-reduces counted by pccl."""
    before = pc.stats(pg)["calls"]
    x = torch.arange(6, dtype=torch.float32) + rank
    total = sum(torch.arange(6, dtype=torch.float32) + r for r in range(size))
    if problem := close(funcol.all_reduce(x, "sum", pg).wait(), total, "funcol.all_reduce (group)"):
        return problem
    gathered = funcol.all_gather_tensor(x, 0, pg.group_name).wait()
    if problem := close(gathered, torch.cat([torch.arange(6.0) + r for r in range(size)]), "funcol.all_gather (name)"):
        return problem
    mesh = DeviceMesh.from_group(pg, "cpu")
    scattered = funcol.reduce_scatter_tensor(torch.arange(2.0 * size) * (rank + 1), "sum", 0, mesh).wait()
    factor = size * (size + 1) / 2
    if problem := close(scattered, torch.arange(2.0 * size)[2 * rank:2 * rank + 2] * factor, "funcol.reduce_scatter (mesh)"):
        return problem
    full = torch.arange(4.0 * size)
    sharded = distribute_tensor(full, mesh, [Shard(0)])  # scatter: delegated to the vendor group
    if problem := close(sharded.redistribute(mesh, [Replicate()]).to_local(), full, "DTensor Shard -> Replicate"):
        return problem
    partial = DTensor.from_local(torch.ones(2 * size) * (rank + 1), mesh, [Partial()])
    if problem := close(partial.redistribute(mesh, [Shard(0)]).to_local(), torch.full((2,), factor),
                        "DTensor Partial -> Shard"):
        return problem
    if problem := close(partial.redistribute(mesh, [Replicate()]).to_local(), torch.full((2 * size,), factor),
                        "DTensor Partial -> Replicate"):
        return problem
    after = pc.stats(pg)["calls"]
    grew = {c: after.get(c, 0) - before.get(c, 0) for c in ("all_reduce", "all_gather", "reduce_scatter")}
    if min(grew.values()) < 2:
        return f"functional collectives on the pccl group were not all counted by pccl: {grew}"
    if bypassed(pg):
        return f"functional collectives bypassed pccl: {bypassed(pg)}"
    return None


def check_device_maps(rank: int, size: int) -> str | None:
    """``"cpu:gloo,cuda:pccl"``: CPU tensors go to gloo; ``"cpu:pccl,cuda:gloo"``: CPU tensors run in pccl."""
    expected = torch.full((3,), float(sum(range(size))))
    for spec, through_pccl in (("cpu:gloo,cuda:pccl", False), ("cpu:pccl,cuda:gloo", True)):
        group = dist.new_group(backend=spec)
        t = torch.full((3,), float(rank))
        dist.all_reduce(t, group=group)
        if problem := close(t, expected, f"all_reduce on a {spec!r} group"):
            return problem
        counted = pc.stats(group)["calls"].get("all_reduce", 0)
        if through_pccl != bool(counted) or through_pccl == bool(bypassed(group)):
            return (f"{spec!r}: CPU all_reduce should {'' if through_pccl else 'not '}run through pccl; "
                    f"pccl counted {counted}, handed to gloo {bypassed(group)}")
    return None


def check_mesh_2d(rank: int, size: int) -> str | None:
    """init_device_mesh with pccl as the default backend: each mesh dimension's group is a pccl group and
    all-reduces along it."""
    if size % 2:
        return None
    before = pc.stats("all")
    mesh = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("outer", "inner"))
    for dim, name in enumerate(("outer", "inner")):
        group = mesh.get_group(name)
        if not isinstance(group, PcclProcessGroup):
            return f"mesh dimension {name!r} got a {type(group).__name__}"
        members = dist.get_process_group_ranks(group)
        got = funcol.all_reduce(torch.full((2,), float(rank)), "sum", (mesh, dim)).wait()
        if problem := close(got, torch.full((2,), float(sum(members))), f"all_reduce along mesh dim {name}"):
            return problem
    after = pc.stats("all")  # the world group, the mesh's groups and every other pccl group, summed
    if after["bypassed"] != before["bypassed"] or after["calls"]["all_reduce"] - before["calls"]["all_reduce"] != 2:
        return f"stats('all') before and after two mesh all-reduces: {before} -> {after}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--default-pccl", action="store_true",
                        help="make pccl the default group (init_process_group('pccl')) instead of gloo")
    args = parser.parse_args()
    if args.default_pccl:
        pc.init_process_group("pccl")
    comm = pc.init()
    rank, size = comm.topology.rank, comm.topology.world_size
    pg = dist.group.WORLD if args.default_pccl else dist.new_group(backend="pccl")
    if args.default_pccl and not isinstance(pg, PcclProcessGroup):
        raise SystemExit(f"init_process_group('pccl') made a {type(pg).__name__}")
    gloo = dist.new_group(backend="gloo")  # the reference
    failures, passed = [], 0
    checks: list[tuple[str, Callable[[], str | None]]] = [
        ("collectives on a pccl group", lambda: check_collectives(pg, gloo, rank, size)),
        ("DDP", lambda: check_ddp(pg, gloo, rank)),
        ("pccl subgroup", lambda: check_subgroup(rank, size)),
        ("destroy_process_group frees a pccl group", lambda: check_destroy_frees_the_group(rank, size)),
        ("functional collectives and DeviceMesh", lambda: check_functional_and_mesh(pg, rank, size)),
        ("device-mapped backend strings", lambda: check_device_maps(rank, size)),
    ]
    if args.default_pccl:
        checks.append(("2-D DeviceMesh with pccl as default backend", lambda: check_mesh_2d(rank, size)))
    for name, check in checks:
        try:
            problem = check()
        except Exception as exc:  # noqa: BLE001 - reported below
            problem = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
        if problem:
            failures.append(f"rank {rank}: {name}: {problem}")
        else:
            passed += 1
    world = MPI.COMM_WORLD
    all_failures = [f for fs in world.gather(failures, root=0) or [] for f in fs]
    total = world.reduce(passed, op=MPI.SUM, root=0)
    if rank == 0:
        for f in all_failures:
            print("FAIL", f, file=sys.stderr)
        print(f"{total} passed, {len(all_failures)} failed")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"passed": total, "failed": len(all_failures), "failures": all_failures}, fh)
    failed = world.allreduce(len(failures), op=MPI.SUM)
    pc.shutdown()
    rank_result.write({"ranks": size, "checks": len(checks), "passed": passed, "failed": len(failures),
                       "failures": failures, "default_pccl": args.default_pccl}, rank)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
