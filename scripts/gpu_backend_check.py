"""The ``pccl`` torch.distributed backend on CUDA tensors (``"cpu:gloo,cuda:pccl"``), and a few DDP / FSDP2
steps on CUDA against the same steps on CPU over gloo. Run by ``scripts/gpu_check.sh`` under mpiexec; the
ranks may share one GPU (nothing here builds an NCCL communicator of several ranks: the collectives' algorithm
is the heuristic's flat choice on one node, DDP skips its initial broadcast, which pccl hands to NCCL).

    mpiexec -n 2 python scripts/gpu_backend_check.py --json backend.json --steps 4
    mpiexec -n 2 env PCCL_LOCAL_SIZE=1 python scripts/gpu_backend_check.py --steps 40 --min-calls 200 --hang-after 150

Every check runs on every rank and is reported (status pass / fail / xfail with a reason, losses of both
runs); rank 0 writes ``--json``. Exit status 1 if a check failed (an xfail is not a failure).
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import inspect
import json
import sys
import traceback
from pathlib import Path
from collections.abc import Callable

import torch
import torch.distributed as dist
from mpi4py import MPI

import pccl_torch as pc
from pccl_torch.integrations.torch_backend import PcclProcessGroup, bypassed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere: the repo's tests/
from tests.multiprocess._training import sgd_steps  # noqa: E402

SPEC = "cpu:gloo,cuda:pccl"
RTOL, ATOL = 1e-4, 1e-5  # CUDA against CPU float32 (different kernels, same maths)
TIMEOUT = datetime.timedelta(seconds=90)


class Expected(Exception):
    """A failure the review predicted (reported as xfail with the reason)."""


def model_fn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.GELU(),
                               torch.nn.Linear(32, 1))


def sgd(model: torch.nn.Module, rank: int, device: torch.device, steps: int,
        before_step: Callable[[], object] | None = None) -> list[float]:
    """``steps`` SGD steps of MSE regression (the framework drivers' loop); the data is made on the CPU
    (identical for both devices)."""
    return sgd_steps(model, rank, features=12, batch=6, lr=0.05, seed=7, steps=steps, before_step=before_step,
                     device=device)


def compare(got: list[float], want: list[float], what: str) -> None:
    if not torch.allclose(torch.tensor(got), torch.tensor(want), rtol=RTOL, atol=ATOL):
        raise AssertionError(f"{what}: CUDA/pccl losses {got} vs CPU/gloo {want}")


def close(a: torch.Tensor, b: torch.Tensor, what: str, rtol: float = 1e-6, atol: float = 1e-6) -> None:
    a, b = a.detach().cpu().float(), b.detach().cpu().float()
    if not torch.allclose(a, b, rtol=rtol, atol=atol):
        raise AssertionError(f"{what}: {a.flatten()[:4].tolist()} vs {b.flatten()[:4].tolist()}")


class Checks:
    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.pg = dist.group.WORLD
        self.gloo = dist.new_group(backend="gloo")
        self.losses: dict[str, dict[str, list[float]]] = {}

    def cuda_calls(self) -> dict[str, int]:
        """pccl's calls on CUDA communicators of the default group, by collective."""
        calls: dict[str, int] = {}
        if isinstance(self.pg, PcclProcessGroup):
            for comm in self.pg.communicators():
                if comm.device.type == "cuda":
                    for k, v in pc.stats(comm)["calls"].items():
                        calls[k] = calls.get(k, 0) + v
        return calls

    def grew(self, before: dict[str, int], collectives: tuple[str, ...], what: str) -> None:
        after = self.cuda_calls()
        grew = {c: after.get(c, 0) - before.get(c, 0) for c in collectives}
        if min(grew.values()) <= 0:
            raise AssertionError(f"{what} did not run through pccl on CUDA: calls grew by {grew}")

    # -- checks ----------------------------------------------------------------------------------------
    def routing(self) -> None:
        if not isinstance(self.pg, PcclProcessGroup):
            raise AssertionError(f"init_process_group({SPEC!r}) made a {type(self.pg).__name__}, not a pccl group")
        config = dist.get_backend_config(self.pg)
        served = self.pg.served_devices()
        if "cuda" not in served or "cpu" in served:
            raise AssertionError(f"backend config {config!r}: pccl serves {sorted(served)}, expected cuda only")

    def collectives(self) -> None:
        before = self.cuda_calls()
        r, p = self.rank, self.size
        x = torch.arange(10, dtype=torch.float32) + r
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
            a, b = x.to(self.dev), x.clone()
            dist.all_reduce(a, op=op)
            dist.all_reduce(b, op=op, group=self.gloo)
            close(a, b, f"all_reduce {op}")
        a = x.to(self.dev)
        dist.all_reduce(a, op=dist._make_nccl_premul_sum(0.5))
        b = x.clone()
        dist.all_reduce(b, group=self.gloo)
        close(a, 0.5 * b, "all_reduce PREMUL_SUM(0.5)")
        h = (torch.randn(1000, generator=torch.Generator().manual_seed(r)) * 3).to(torch.bfloat16)
        a, b = h.to(self.dev), h.float()
        dist.all_reduce(a)
        dist.all_reduce(b, group=self.gloo)
        close(a, b, "all_reduce bfloat16", rtol=2e-2, atol=4e-2 * p)
        a = x.to(self.dev)
        work = dist.all_reduce(a, async_op=True)
        work.wait()
        b = x.clone()
        dist.all_reduce(b, group=self.gloo)
        close(a, b, "async all_reduce")
        out_a, out_b = torch.empty(10 * p, device=self.dev), torch.empty(10 * p)
        dist.all_gather_into_tensor(out_a, x.to(self.dev))
        dist.all_gather_into_tensor(out_b, x, group=self.gloo)
        close(out_a, out_b, "all_gather_into_tensor")
        lists_a = [torch.empty(10, device=self.dev) for _ in range(p)]
        lists_b = [torch.empty(10) for _ in range(p)]
        dist.all_gather(lists_a, x.to(self.dev))
        dist.all_gather(lists_b, x, group=self.gloo)
        close(torch.cat(lists_a), torch.cat(lists_b), "all_gather (list)")
        inp = torch.arange(4 * p, dtype=torch.float32) * (r + 1)
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            ra, rb = torch.empty(4, device=self.dev), torch.empty(4)
            dist.reduce_scatter_tensor(ra, inp.to(self.dev), op=op)
            dist.reduce_scatter_tensor(rb, inp, op=op, group=self.gloo)
            close(ra, rb, f"reduce_scatter_tensor {op}")
        self.grew(before, ("all_reduce", "all_gather", "reduce_scatter"), "CUDA collectives")
        if isinstance(self.pg, PcclProcessGroup) and bypassed(self.pg):
            raise AssertionError(f"CUDA collectives bypassed pccl: {bypassed(self.pg)}")

    def ddp(self, hook: bool) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        from pccl_torch.integrations.ddp import allreduce_hook

        name = "ddp-hook" if hook else "ddp"
        ref = DDP(model_fn(), process_group=self.gloo)
        want = sgd(ref, self.rank, torch.device("cpu"), self.steps)
        kwargs = {"device_ids": [self.dev.index], "broadcast_buffers": False}
        if "init_sync" in inspect.signature(DDP.__init__).parameters:
            kwargs["init_sync"] = False  # its broadcast goes to the vendor group (NCCL), which refuses a shared GPU
        model = DDP(model_fn().to(self.dev), **kwargs)
        before = self.cuda_calls()
        default_before = pc.stats()["calls"].get("all_reduce", 0)
        if hook:
            model.register_comm_hook(None, allreduce_hook)  # the default communicator: pc.init(device=cuda)
        got = sgd(model, self.rank, self.dev, self.steps)
        self.losses[name] = {"cuda_pccl": got, "cpu_gloo": want}
        compare(got, want, name)
        close(torch.cat([q.detach().flatten() for q in model.parameters()]),
              torch.cat([q.detach().flatten() for q in ref.parameters()]), f"{name} final parameters", RTOL, ATOL)
        if hook:
            if pc.stats()["calls"].get("all_reduce", 0) <= default_before:
                raise AssertionError("the DDP hook's all-reduces were not counted by the default communicator")
        else:
            self.grew(before, ("all_reduce",), "DDP's gradient all-reduce")

    def _fsdp_reference(self) -> list[float]:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        if "fsdp-ref" not in self.losses:
            mesh = DeviceMesh.from_group(self.gloo, "cpu")
            model = model_fn()
            for layer in (model[0], model[2], model[4]):
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            self.losses["fsdp-ref"] = {"cpu_gloo": sgd(model, self.rank, torch.device("cpu"), self.steps)}
        return self.losses["fsdp-ref"]["cpu_gloo"]

    def fsdp2(self, variant: str) -> None:
        """``group``: torch's fully_shard on a mesh of the pccl-mapped default group (FSDP's own collectives
        through the pccl backend); ``hooks-pccl-group``: pccl's fully_shard (custom AG/RS hooks) on that mesh;
        ``hooks-gloo-group``: pccl's hooks with a gloo group as FSDP's group (the hooks use ``pc.init``'s
        CUDA communicator)."""
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard as torch_fully_shard

        from pccl_torch.integrations.fsdp import fully_shard as pccl_fully_shard

        want = self._fsdp_reference()
        group = self.gloo if variant == "hooks-gloo-group" else self.pg
        mesh = DeviceMesh.from_group(group, "cuda")
        model = model_fn().to(self.dev)
        before = self.cuda_calls()
        default_before = dict(pc.stats()["calls"])
        try:
            for layer in (model[0], model[2], model[4]):
                if variant == "group":
                    torch_fully_shard(layer, mesh=mesh)
                else:
                    pccl_fully_shard(layer, mesh=mesh, comm="pccl")
            if variant == "group":
                torch_fully_shard(model, mesh=mesh)
            else:
                pccl_fully_shard(model, mesh=mesh, comm="pccl")
            clip = (lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)) if variant == "group" else None
            got = sgd(model, self.rank, self.dev, self.steps, before_step=clip)
        except Exception as exc:  # noqa: BLE001 - FSDP may wrap the hook's ValueError
            if variant == "hooks-pccl-group" and "initialised for cpu" in str(exc):
                raise Expected("integrations/fsdp.py communicator_for() gives the pccl group's CPU communicator "
                               f"(PcclProcessGroup.comm) for CUDA tensors: {str(exc).splitlines()[0]}") from exc
            raise
        self.losses[f"fsdp2-{variant}"] = {"cuda_pccl": got, "cpu_gloo": want}
        compare(got, want, f"fsdp2-{variant}")
        if variant == "group":
            self.grew(before, ("all_gather", "reduce_scatter"), "FSDP2's collectives on the pccl group")
        else:
            after = pc.stats()["calls"]
            grew = {c: after.get(c, 0) - default_before.get(c, 0) for c in ("all_gather", "reduce_scatter")}
            counted = grew if variant == "hooks-gloo-group" else {
                c: n + self.cuda_calls().get(c, 0) - before.get(c, 0) for c, n in grew.items()}
            if min(counted.values()) <= 0:
                raise AssertionError(f"FSDP2 hooks did not run through pccl: calls grew by {counted}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--min-calls", type=int, default=0,
                        help="fail unless pccl ran at least this many calls on the group's CUDA communicators (the "
                             "soak: with PCCL_LOCAL_SIZE=1 under mpiexec every one is host-driven)")
    parser.add_argument("--hang-after", type=float, default=0,
                        help="seconds after which every thread's stack is printed and the rank exits (a device "
                             "deadlock cannot be interrupted otherwise); 0: never")
    args = parser.parse_args()
    if args.hang_after > 0:
        faulthandler.dump_traceback_later(args.hang_after, exit=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    results: dict[str, dict] = {}
    checks: Checks | None = None
    try:
        torch.cuda.set_device(rank % max(torch.cuda.device_count(), 1))
        pc.init_process_group(SPEC, timeout=TIMEOUT)
        pc.init(device="cuda", timeout=TIMEOUT)  # the default communicator (DDP hook, FSDP hooks on a gloo group)
        checks = Checks(args.steps)
        results["init"] = {"status": "pass", "reason": f"default group {type(dist.group.WORLD).__name__}"}
    except Exception as exc:  # noqa: BLE001
        results["init"] = {"status": "fail", "reason": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc(limit=6)}
    if checks is not None:
        plan: list[tuple[str, Callable[[], None]]] = [
            ("routing", checks.routing),
            ("collectives", checks.collectives),
            ("ddp", lambda: checks.ddp(hook=False)),
            ("fsdp2-group", lambda: checks.fsdp2("group")),
            ("ddp-hook", lambda: checks.ddp(hook=True)),
            ("fsdp2-hooks-gloo-group", lambda: checks.fsdp2("hooks-gloo-group")),
            ("fsdp2-hooks-pccl-group", lambda: checks.fsdp2("hooks-pccl-group")),
        ]
        for name, fn in plan:
            try:
                fn()
                results[name] = {"status": "pass", "reason": ""}
            except Expected as exc:
                results[name] = {"status": "xfail", "reason": str(exc)}
            except Exception as exc:  # noqa: BLE001 - reported, the next check runs
                results[name] = {"status": "fail", "reason": f"{type(exc).__name__}: {str(exc)[:800]}",
                                 "traceback": traceback.format_exc(limit=6)}
            if name in checks.losses:
                results[name]["losses"] = checks.losses[name]
            world.Barrier()
        if args.min_calls:
            ran = sum(checks.cuda_calls().values())
            results["soak"] = {"status": "pass" if ran >= args.min_calls else "fail",
                               "reason": f"{ran} calls on the CUDA communicators (at least {args.min_calls} asked)"}
    faulthandler.cancel_dump_traceback_later()
    gathered = world.gather(results, root=0)
    code = 0
    if rank == 0:
        merged: dict[str, dict] = {}  # per check: the first failing rank's result, else rank 0's
        for r, per_rank in enumerate(gathered or []):
            for name, res in per_rank.items():
                if name not in merged or (res["status"] == "fail" and merged[name]["status"] != "fail"):
                    merged[name] = dict(res, reason=f"rank {r}: {res.get('reason', '')}")
        failed = sum(1 for v in merged.values() if v["status"] == "fail")
        summary = {"ranks": world.Get_size(), "spec": SPEC, "steps": args.steps, "torch": torch.__version__,
                   "checks": merged, "failed": failed,
                   "passed": sum(1 for v in merged.values() if v["status"] == "pass")}
        for name, v in merged.items():
            print(f"{v['status']:<5} {name}: {v.get('reason', '')}")
            if v.get("traceback") and v["status"] == "fail":
                print(v["traceback"], file=sys.stderr)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(summary, fh, indent=1)
        code = 1 if failed else 0
    code = world.bcast(code, root=0)
    try:
        pc.shutdown()
    except Exception:  # noqa: BLE001 - the results are written
        pass
    return code


if __name__ == "__main__":
    sys.exit(main())
