"""c10d's conventions on a pccl group, against a gloo group of the same ranks (issue 59), under mpiexec:

- ``--futures``: every Work a pccl group returns (each ProcessGroup call form and the ``dist.*`` calls over them)
  has a future holding what gloo's holds for the same call: the list of output tensors (views of the outputs),
  a list of lists for the coalesced all-gather, ``[]`` for a barrier; reduce-scatter, whose gloo Work has no
  future, holds NCCL's list of outputs. DDP with a comm hook chaining ``.then`` on that future, and with torch's
  PowerSGD hook, trains to gloo's parameters on the pccl group.
- ``--monitored-barrier``: ``pccl_torch.monitored_barrier`` on a pccl group passes when every rank arrives (after
  queued async collectives), and when the last rank does not arrive rank 0's error names it and the other ranks'
  errors name rank 0, as gloo's do; ``torch.distributed.monitored_barrier`` does the same on a pccl group once
  ``pccl_torch.run.force_torch_backend()`` ran.

Every rank writes its own result (``rank_result``): the checks passed and failed.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP

import pccl_torch as pc
import rank_result  # this folder is on sys.path when the driver runs as a script
from _training import sgd_steps  # this folder is on sys.path when the driver runs as a script
from dropin_driver import Check, run_checks  # this folder is on sys.path when the driver runs as a script
from pccl_torch.run import force_torch_backend

Call = Callable[[dist.ProcessGroup, int, int], tuple[dist.Work, list[torch.Tensor]]]
"""One call form: issue it on a group (rank, size given) with fresh tensors; its Work and its output tensors."""


def _x(rank: int, n: int = 4) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + 10 * rank


def _empties(size: int, n: int = 4) -> list[torch.Tensor]:
    return [torch.empty(n) for _ in range(size)]


def _allreduce(pg, rank, size):
    t = [_x(rank)]
    return pg.allreduce(t), t


def _allreduce_coalesced(pg, rank, size):
    t = [_x(rank), _x(rank, 3)]
    return pg.allreduce_coalesced(t, dist.AllreduceCoalescedOptions()), t


def _allgather(pg, rank, size):
    outs = _empties(size)
    return pg.allgather([outs], [_x(rank)]), outs


def _allgather_base(pg, rank, size):
    out = torch.empty(4 * size)
    return pg._allgather_base(out, _x(rank)), [out]


def _allgather_into_tensor_coalesced(pg, rank, size):
    outs = [torch.empty(4 * size), torch.empty(2 * size), torch.empty(3 * size)]
    return pg.allgather_into_tensor_coalesced(outs, [_x(rank), _x(rank, 2), _x(rank, 3)]), outs


def _reduce_scatter(pg, rank, size):
    out = [torch.empty(4)]
    return pg.reduce_scatter(out, [[_x(rank) for _ in range(size)]]), out


def _reduce_scatter_base(pg, rank, size):
    out = torch.empty(4)
    return pg._reduce_scatter_base(out, _x(rank, 4 * size)), [out]


def _reduce_scatter_tensor_coalesced(pg, rank, size):
    outs = [torch.empty(4), torch.empty(2)]
    return pg.reduce_scatter_tensor_coalesced(outs, [_x(rank, 4 * size), _x(rank, 2 * size)]), outs


def _alltoall_base(pg, rank, size):
    out = torch.empty(4 * size)
    return pg.alltoall_base(out, _x(rank, 4 * size), [], []), [out]


def _alltoall(pg, rank, size):
    outs = _empties(size)
    return pg.alltoall(outs, [_x(rank) for _ in range(size)]), outs


def _broadcast(pg, rank, size):
    t = [_x(rank)]
    return pg.broadcast(t), t


def _barrier(pg, rank, size):
    return pg.barrier(), []


def _allreduce_uint8(pg, rank, size):  # pccl hands it to gloo
    t = [torch.full((3,), rank + 1, dtype=torch.uint8)]
    return pg.allreduce(t), t


def _gather(pg, rank, size):
    outs = _empties(size) if rank == 0 else []
    return pg.gather([outs] if rank == 0 else [], [_x(rank)]), outs


def _scatter(pg, rank, size):
    out = [torch.empty(4)]
    return pg.scatter(out, [[_x(r) for r in range(size)]] if rank == 0 else []), out


def _reduce(pg, rank, size):
    t = [_x(rank)]
    return pg.reduce(t), t


def _dist_all_reduce(pg, rank, size):
    t = _x(rank)
    return dist.all_reduce(t, group=pg, async_op=True), [t]


def _dist_all_gather_into_tensor(pg, rank, size):
    out = torch.empty(4 * size)
    return dist.all_gather_into_tensor(out, _x(rank), group=pg, async_op=True), [out]


def _dist_all_to_all_single(pg, rank, size):
    out = torch.empty(4 * size)
    return dist.all_to_all_single(out, _x(rank, 4 * size), group=pg, async_op=True), [out]


def _dist_reduce_scatter_tensor(pg, rank, size):
    out = torch.empty(4)
    return dist.reduce_scatter_tensor(out, _x(rank, 4 * size), group=pg, async_op=True), [out]


CALLS: dict[str, Call] = {call.__name__.lstrip("_"): call for call in (
    _allreduce, _allreduce_coalesced, _allgather, _allgather_base, _allgather_into_tensor_coalesced,
    _reduce_scatter, _reduce_scatter_base, _reduce_scatter_tensor_coalesced, _alltoall_base, _alltoall,
    _broadcast, _barrier, _allreduce_uint8, _gather, _scatter, _reduce, _dist_all_reduce,
    _dist_all_gather_into_tensor, _dist_all_to_all_single, _dist_reduce_scatter_tensor)}
"""Every call form gloo defines (routed through pccl, delegated, handed over for its dtype) and ``dist.*`` ones."""

NO_GLOO_FUTURE = frozenset(("reduce_scatter", "reduce_scatter_base", "reduce_scatter_tensor_coalesced",
                            "dist_reduce_scatter_tensor"))
"""Calls whose gloo Work has no future ("Work::getFuture not implemented"): pccl's holds NCCL's value, the list
of output tensors."""


def _value_problem(got: object, want: object, outputs: list[torch.Tensor], where: str = "value") -> str | None:
    """Why ``got`` is not ``want`` (same nesting of lists, equal tensors, each a view of one of ``outputs``)."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{where}: {type(got).__name__} where gloo's is a Tensor"
        if got.shape != want.shape or not torch.equal(got, want):
            return f"{where}: {got.tolist()} vs gloo's {want.tolist()}"
        if not any(got.untyped_storage().data_ptr() == o.untyped_storage().data_ptr() for o in outputs):
            return f"{where}: not a view of the call's outputs"
        return None
    if not isinstance(got, list) or len(got) != len(want):
        return f"{where}: {_shape(got)} vs gloo's {_shape(want)}"
    return next(filter(None, (_value_problem(g, w, outputs, f"{where}[{i}]")
                              for i, (g, w) in enumerate(zip(got, want)))), None)


def _shape(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}"
    if isinstance(value, list):
        return "[" + ", ".join(map(_shape, value)) + "]"
    return type(value).__name__


def _gloo_value(name: str, call: Call, gloo: dist.ProcessGroup, rank: int, size: int) -> object:
    """What a gloo Work's future holds after ``call``; NCCL's list of outputs where gloo's Work has none."""
    work, outputs = call(gloo, rank, size)
    work.wait()
    return list(outputs) if name in NO_GLOO_FUTURE else work.get_future().wait()


def check_future(name: str, call: Call, pg, gloo, rank: int, size: int) -> str | None:
    """``call`` on the pccl group: its Work's future (``wait()`` and ``value()``, before and after the Work's own
    ``wait``) holds gloo's value; ``is_success()``, ``exception()`` and ``result()`` as c10d's."""
    want = _gloo_value(name, call, gloo, rank, size)
    work, outputs = call(pg, rank, size)
    future = work.get_future()
    if problem := _value_problem(future.wait(), want, outputs):
        return problem
    work.wait()
    if problem := _value_problem(work.get_future().value(), want, outputs, "value() after wait"):
        return problem
    if not work.is_success() or work.exception() is not None:
        return f"is_success() {work.is_success()}, exception() {work.exception()!r}"
    flat = [t for entry in want for t in (entry if isinstance(entry, list) else [entry])]
    return _value_problem(work.result(), flat, outputs, "result()")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4), torch.nn.Tanh(),
                               torch.nn.Linear(4, 1))


def allreduce_with_then_hook(group, bucket):  # no annotations: DDP checks them, and here they would be strings
    """torch's test base hook (``test_accumulate_gradients_no_sync_allreduce_with_then_hook``): the bucket's sum,
    times 2, then divided by 2 x world size, chained on the all-reduce's future (``fut.wait()[0]``)."""
    size = group.size()
    fut = group.allreduce([bucket.buffer()]).get_future()
    return fut.then(lambda f: 2 * f.wait()[0]).then(lambda f: f.wait() / (2 * size))


def _trained(group, rank: int, register: Callable[[DDP], None]) -> torch.Tensor:
    """The parameters after a few SGD steps of DDP over ``group`` with the hook ``register`` installs."""
    model = DDP(_model(), process_group=group)
    register(model)
    sgd_steps(model, rank, features=8, batch=4, lr=0.1, seed=100, steps=6)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def check_ddp_hook(pg, gloo, rank: int, register_on: Callable[[DDP, dist.ProcessGroup], None]) -> str | None:
    """DDP with a comm hook (``register_on(model, group)``) on the pccl group ends with gloo's parameters."""
    want = _trained(gloo, rank, lambda model: register_on(model, gloo))
    got = _trained(pg, rank, lambda model: register_on(model, pg))
    if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        return f"parameters {got[:4].tolist()} vs gloo's {want[:4].tolist()} (max diff {(got - want).abs().max()})"
    return None


def _then_hook(model: DDP, group) -> None:
    model.register_comm_hook(group, allreduce_with_then_hook)


def _power_sgd(model: DDP, group) -> None:
    """torch's PowerSGD hook, rank 1, compressing from the third step (the first two all-reduce plainly)."""
    state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                   min_compression_rate=0.5, use_error_feedback=True, warm_start=True)
    model.register_comm_hook(state, powerSGD.powerSGD_hook)


def future_checks(pg, gloo, rank: int, size: int) -> list[tuple[str, Check]]:
    checks: list[tuple[str, Check]] = [
        (f"future: {name}", lambda name=name, call=call: check_future(name, call, pg, gloo, rank, size))
        for name, call in CALLS.items()]
    checks += [("DDP: allreduce_with_then_hook", lambda: check_ddp_hook(pg, gloo, rank, _then_hook)),
               ("DDP: powerSGD_hook", lambda: check_ddp_hook(pg, gloo, rank, _power_sgd))]
    return checks


def _raises(call: Callable[[], object], expected: str) -> str | None:
    """Why ``call()`` did not raise a RuntimeError whose message holds ``expected``."""
    try:
        call()
    except RuntimeError as exc:
        return None if expected in str(exc) else f"error {str(exc)[:300]!r} does not say {expected!r}"
    return f"passed where it should have raised {expected!r}"


def check_missing_rank(barrier: Callable[..., object], rank: int, size: int, wait_all_ranks: bool) -> str | None:
    """The last rank does not arrive: rank 0's error names it, the others' name rank 0 (gloo's messages). On a
    pccl group of its own: a failed monitored barrier leaves gloo's connections closed, as on a gloo group."""
    pg = dist.new_group(backend="pccl")
    missing = size - 1
    expected = {0: f"{'Ranks' if wait_all_ranks else 'Rank'} {missing} failed to pass monitoredBarrier"}
    try:
        if rank == missing:
            return None
        return _raises(lambda: barrier(group=pg, timeout=datetime.timedelta(seconds=2), wait_all_ranks=wait_all_ranks),
                       expected.get(rank, "received errors while waiting for send/recv from rank 0"))
    finally:
        MPI.COMM_WORLD.Barrier()  # the missing rank waits here until the others are through, whatever they raised


def check_every_rank_arrives(barrier: Callable[..., object], pg, rank: int, size: int) -> str | None:
    """Every rank arrives, with async all-reduces still queued on the group: passes, after them."""
    works = [dist.all_reduce(torch.full((1000,), float(rank)), group=pg, async_op=True) for _ in range(5)]
    barrier(group=pg, timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)
    if not all(work.is_completed() for work in works):
        return "the monitored barrier returned before the collectives issued before it completed"
    return None


def monitored_barrier_checks(pg, rank: int, size: int) -> list[tuple[str, Check]]:
    def torch_barrier(**kwargs):
        force_torch_backend()  # what pccl_torch.run does: gloo scripts keep their monitored barriers
        return dist.monitored_barrier(**kwargs)

    return [
        ("pccl_torch.monitored_barrier: every rank arrives",
         lambda: check_every_rank_arrives(pc.monitored_barrier, pg, rank, size)),
        ("dist.monitored_barrier under force_torch_backend: every rank arrives",
         lambda: check_every_rank_arrives(torch_barrier, pg, rank, size)),
        ("pccl_torch.monitored_barrier: the last rank missing",
         lambda: check_missing_rank(pc.monitored_barrier, rank, size, wait_all_ranks=False)),
        ("pccl_torch.monitored_barrier: the last rank missing, wait_all_ranks",
         lambda: check_missing_rank(pc.monitored_barrier, rank, size, wait_all_ranks=True)),
        ("dist.monitored_barrier under force_torch_backend: the last rank missing",
         lambda: check_missing_rank(torch_barrier, rank, size, wait_all_ranks=False)),
    ]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--futures", action="store_true", help="the futures' values and DDP hooks")
    parser.add_argument("--monitored-barrier", action="store_true", help="monitored_barrier on a pccl group")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # the reference group; under mpiexec rank and rendezvous come from MPI
    rank, size = dist.get_rank(), dist.get_world_size()
    pg, gloo = dist.new_group(backend="pccl"), dist.new_group(backend="gloo")
    checks: list[tuple[str, Check]] = []
    if args.futures:
        checks += future_checks(pg, gloo, rank, size)
    if args.monitored_barrier:
        checks += monitored_barrier_checks(pg, rank, size)
    passed, failures = run_checks(checks)
    dist.destroy_process_group()
    rank_result.write({"passed": passed, "failures": failures, "world_size": size}, rank)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
