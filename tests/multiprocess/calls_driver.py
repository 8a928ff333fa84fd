"""The call-shape cache under ``mpiexec -n N`` (``pccl_torch.calls``): repeated calls of one shape with new
tensors, reused tensors with new values, aliasing that changes between calls of one shape, torch's ReduceOp
objects, the per-call checks a cached shape still makes, exact counters, the bound on the cache and its end
with the communicator, async calls, and checking mode's agreement on cached shapes.

Every rank writes its failures (``rank_result.write``); ``test_calls.py`` checks every rank and the exit status.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

import pccl_torch as pc
from pccl_torch import calls
from pccl_torch.selection import attach
from pccl_torch.communicator import create
from pccl_torch.errors import PcclMismatchError

from rank_result import Checks, write

DTYPES = (torch.float32, torch.bfloat16, torch.int64)
SIZES = (0, 1, 7, 1000)
"""Elements per block (all-gather input, reduce-scatter output; all-reduce: the whole buffer)."""
REPEATS = 3


def contribution(rank: int, call: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s input of its ``call``-th call: small distinct integers (exact in every dtype here)."""
    return ((torch.arange(numel) % 5) + 1 + 2 * rank + call).to(dtype)


def factor(call: int) -> float:
    """PREMUL_SUM's factor on call ``call``: it changes between calls of one shape (torch's PREMUL_SUM objects all
    compare equal whatever their factor, so a shape keyed by one would run the first call's factor again)."""
    return 0.5 if call % 2 else 0.25


def reduce(parts: list[torch.Tensor], op: str, dtype: torch.dtype, call: int) -> torch.Tensor:
    """The reference: the reduction of every rank's contribution in float64, then in ``dtype``."""
    stack = torch.stack([p.double() for p in parts])
    if op == "max":
        return stack.max(0).values.to(dtype)
    total = stack.sum(0)
    return (total / len(parts) if op == "avg" else factor(call) * total if op == "premul" else total).to(dtype)


def as_op(op: str, torch_object: bool, call: int) -> object:
    if op == "premul":
        return dist._make_nccl_premul_sum(factor(call)) if torch_object else pc.premul_sum(factor(call))
    if torch_object:
        return {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX}[op]
    return {"sum": pc.ReduceOp.SUM, "avg": pc.ReduceOp.AVG, "max": pc.ReduceOp.MAX}[op]


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, want, atol=0, rtol=1e-2 if got.dtype == torch.bfloat16 else 1e-6,
                               msg=lambda m: f"{what}: {m}")


def expect(kind: type[Exception], fragment: str, call: Callable[[], object]) -> None:
    try:
        call()
    except kind as exc:
        assert fragment in str(exc), f"{kind.__name__} without {fragment!r}: {exc}"
        return
    raise AssertionError(f"expected {kind.__name__} ({fragment!r}); the call succeeded")


def repeated_calls(comm: pc.Communicator, algorithm: str | None, dtype: torch.dtype, numel: int, op: str,
                   torch_op: bool) -> None:
    """REPEATS calls of each collective's shape: new tensors, then the same tensors with new values, then
    aliasing (in-place all-gather, an output inside the reduce-scatter input) in the middle of the run."""
    p, rank = comm.topology.world_size, comm.topology.rank
    kept = {"ar": torch.empty(numel, dtype=dtype), "ag": torch.empty(p, numel, dtype=dtype),
            "rs_in": torch.empty(p * numel, dtype=dtype)}
    for call in range(REPEATS * 2):
        fresh = call < REPEATS
        label = f"{algorithm} {dtype} n={numel} {op} torch_op={torch_op} call {call}"
        reduction = as_op(op, torch_op, call)
        # all-reduce: new buffers, then the same buffer refilled
        buf = contribution(rank, call, numel, dtype) if fresh else kept["ar"].copy_(contribution(rank, call, numel, dtype))
        pc.all_reduce(buf, reduction, algorithm=algorithm, comm=comm)
        same(buf, reduce([contribution(r, call, numel, dtype) for r in range(p)], op, dtype, call), f"AR {label}")
        # all-gather: out of place, then in place (this rank's row of the output) on the same shape
        out = torch.empty(p, numel, dtype=dtype) if fresh else kept["ag"]
        mine = contribution(rank, call, numel, dtype)
        if call % 2:
            out[rank].copy_(mine)
            pc.all_gather_into_tensor(out, out[rank], algorithm=algorithm, comm=comm)
        else:
            pc.all_gather_into_tensor(out, mine, algorithm=algorithm, comm=comm)
            same(mine, contribution(rank, call, numel, dtype), f"AG input unchanged {label}")
        same(out, torch.stack([contribution(r, call, numel, dtype) for r in range(p)]), f"AG {label}")
        # reduce-scatter: distinct output, then (odd calls) an output that is the input's first block
        full = [torch.cat([contribution(r, call + b, numel, dtype) for b in range(p)]) for r in range(p)]
        inp = full[rank].clone() if fresh else kept["rs_in"].copy_(full[rank])
        target = inp[:numel] if call % 2 else torch.empty(numel, dtype=dtype)
        want = reduce([f[rank * numel:(rank + 1) * numel] for f in full], op, dtype, call)
        pc.reduce_scatter_tensor(target, inp, reduction, algorithm=algorithm, comm=comm)
        same(target, want, f"RS {label}")
        if not call % 2:
            same(inp, full[rank], f"RS input unchanged {label}")


def repeated_all_to_alls(comm: pc.Communicator, algorithm: str | None, dtype: torch.dtype, numel: int) -> None:
    """REPEATS all-to-alls of one shape (no split sizes: a bound call): new tensors, then the same ones refilled,
    then rows of another shape holding as many elements; and calls with split sizes (uneven, never bound) in
    between, with counters that count each call's own bytes."""
    p, rank = comm.topology.world_size, comm.topology.rank
    kept_in, kept_out = torch.empty(p * numel, dtype=dtype), torch.empty(p * numel, dtype=dtype)
    before = pc.stats(comm)["bytes"].get("all_to_all", 0)
    moved = 0
    for call in range(REPEATS * 2):
        label = f"A2A {algorithm} {dtype} n={numel} call {call}"
        mine = [contribution(rank * p + j, call, numel, dtype) for j in range(p)]
        if call < REPEATS:
            inp, out = torch.cat(mine), torch.empty(p * numel, dtype=dtype)
        else:
            inp, out = kept_in.copy_(torch.cat(mine)), kept_out
        if call % 3 == 2 and numel:  # the same numel in rows of 2: the same bound shape
            inp, out = inp.view(-1, 2) if numel % 2 == 0 else inp, out.view(-1, 2) if numel % 2 == 0 else out
        pc.all_to_all_single(out, inp, algorithm=algorithm, comm=comm)
        moved += inp.numel() * inp.element_size()
        same(out.reshape(-1), torch.cat([contribution(i * p + rank, call, numel, dtype) for i in range(p)]), label)
        same(inp.reshape(-1), torch.cat(mine), f"input unchanged {label}")
        sends = [(rank + j + call) % 3 for j in range(p)]
        recvs = [(i + rank + call) % 3 for i in range(p)]
        uneven = torch.cat([contribution(rank * p + j, call, sends[j], dtype) for j in range(p)])
        got = torch.empty(sum(recvs), dtype=dtype)
        pc.all_to_all_single(got, uneven, recvs, sends, algorithm=algorithm, comm=comm)
        moved += uneven.numel() * uneven.element_size()
        same(got, torch.cat([contribution(i * p + rank, call, recvs[i], dtype) for i in range(p)]), f"uneven {label}")
    counted = pc.stats(comm)["bytes"]["all_to_all"] - before
    assert counted == moved, f"all-to-all bytes counted {counted}, moved {moved}"


def cached_shapes_still_check(comm: pc.Communicator) -> None:
    """A bound shape re-checks what differs between its calls: contiguity, device, aliasing."""
    p, rank = comm.topology.world_size, comm.topology.rank
    square = torch.ones(4, 4)
    pc.all_reduce(square.clone(), comm=comm)
    expect(ValueError, "not contiguous", lambda: pc.all_reduce(square.t(), comm=comm))
    expect(ValueError, "is on meta", lambda: pc.all_reduce(torch.empty(4, 4, device="meta"), comm=comm))
    out, inp = torch.empty(p * 4), torch.ones(4)
    pc.all_gather_into_tensor(out, inp, comm=comm)
    if p > 1:
        wrong_slot = out[((rank + 1) % p) * 4:][:4]
        expect(ValueError, "overlaps output", lambda: pc.all_gather_into_tensor(out, wrong_slot, comm=comm))
    expect(ValueError, "not contiguous", lambda: pc.all_gather_into_tensor(out, torch.ones(8)[::2], comm=comm))
    expect(TypeError, "must be a torch.Tensor", lambda: pc.all_reduce([1.0], comm=comm))  # type: ignore[arg-type]
    a2a_in, a2a_out = torch.ones(2 * p), torch.empty(2 * p)
    pc.all_to_all_single(a2a_out, a2a_in, comm=comm)  # bound now: each call below must still be refused
    expect(ValueError, "overlaps", lambda: pc.all_to_all_single(a2a_in, a2a_in, comm=comm))
    expect(ValueError, "not contiguous", lambda: pc.all_to_all_single(a2a_out, torch.ones(4 * p)[::2], comm=comm))
    expect(ValueError, "input rows have 2", lambda: pc.all_to_all_single(a2a_out, a2a_in.view(p, 2),
                                                                                    comm=comm))
    expect(TypeError, "must match", lambda: pc.all_to_all_single(a2a_out.double(), a2a_in, comm=comm))
    if p > 1:
        expect(ValueError, "do not split equally", lambda: pc.all_to_all_single(
            torch.empty(1, 2 * p), torch.ones(1, 2 * p), comm=comm))


def counters_are_exact(comm: pc.Communicator) -> None:
    before = pc.stats(comm)
    buf = torch.ones(10)
    for _ in range(17):
        pc.all_reduce(buf, comm=comm)
    after = pc.stats(comm)
    assert after["calls"]["all_reduce"] - before["calls"].get("all_reduce", 0) == 17, (before, after)
    assert after["bytes"]["all_reduce"] - before["bytes"].get("all_reduce", 0) == 17 * 40, (before, after)
    comm.stats.reset()
    pc.all_reduce(buf, comm=comm)
    assert pc.stats(comm)["calls"] == {"all_reduce": 1}, pc.stats(comm)["calls"]


def cache_is_bounded(comm: pc.Communicator) -> None:
    """The cache starts over after MAX_SHAPES shapes, on every rank at the same call (where small shapes hold
    MPI persistent collectives, binding one is collective); results stay right across the restarts."""
    p, rank = comm.topology.world_size, comm.topology.rank
    limit, calls.MAX_SHAPES = calls.MAX_SHAPES, 8
    try:
        for numel in range(200, 230):  # shapes not called before, persistent-sized and not
            buf = torch.full((numel * (1 + numel % 3) ** 3,), float(rank))
            pc.all_reduce(buf, comm=comm)
            same(buf, torch.full_like(buf, float(sum(range(p)))), f"all-reduce of {buf.numel()} after restarts")
            assert comm.bound_shapes <= 8 and len({id(b) for b in comm.calls.values()}) <= 8, comm.bound_shapes
    finally:
        calls.MAX_SHAPES = limit


def async_calls(comm: pc.Communicator) -> None:
    p, rank = comm.topology.world_size, comm.topology.rank
    bufs = [torch.full((6,), float(rank + i)) for i in range(5)]
    works = [pc.all_reduce(b, async_op=True, comm=comm) for b in bufs]
    blocking = torch.full((6,), float(rank))
    pc.all_reduce(blocking, comm=comm)  # after the queued ones, in issue order
    for i, work in enumerate(works):
        work.wait()
        same(bufs[i], torch.full((6,), float(sum(range(p)) + p * i)), f"async call {i}")
    same(blocking, torch.full((6,), float(sum(range(p)))), "blocking call after async ones")


def checking_agrees_on_cached_shapes(comm: pc.Communicator) -> None:
    """With checking on, a cached shape still agrees on its signature: rank 0 calling another (cached) shape
    than the others fails on every rank before any data moves, and the communicator goes on."""
    p, rank = comm.topology.world_size, comm.topology.rank
    small, large = torch.ones(3), torch.ones(5)
    pc.all_reduce(small, comm=comm)
    pc.all_reduce(large, comm=comm)
    if p > 1:
        expect(PcclMismatchError, "numel", lambda: pc.all_reduce(small if rank == 0 else large, comm=comm))
        # shapes no rank has bound yet: binding must not itself be collective here (an MPI persistent collective's
        # *_init is), or the ranks' unmatched bindings would wedge the communicator before the mismatch is reported
        fresh = torch.ones(11 if rank == 0 else 13)
        expect(PcclMismatchError, "numel", lambda: pc.all_reduce(fresh, comm=comm))
    small.fill_(1.0)
    pc.all_reduce(small, comm=comm)
    same(small, torch.full((3,), float(p)), "checked call after a mismatch")


def dropped(comm: pc.Communicator) -> None:
    assert comm.closed and not comm.calls, f"{len(comm.calls)} bound calls left after close"


def main() -> None:
    comm = pc.init()
    checks = Checks(comm.topology.rank)
    algorithms: list[str | None] = [None, "mpi", "ring"] + (["hier:mpi"] if comm.topology.is_hierarchical else [])
    for algorithm in algorithms:
        for dtype in DTYPES:
            for numel in SIZES:
                ops = ["sum", "max"] + (["avg", "premul"] if dtype.is_floating_point else [])
                for op in ops:
                    for torch_op in (False, True):
                        checks.check(f"repeated {algorithm} {dtype} {numel} {op} torch_op={torch_op}",
                                     lambda: repeated_calls(comm, algorithm, dtype, numel, op, torch_op))
    for algorithm in [None, "mpi", "pairwise"] + (["hier:mpi"] if comm.topology.is_hierarchical else []):
        for dtype in DTYPES:
            for numel in SIZES:
                checks.check(f"repeated all-to-all {algorithm} {dtype} {numel}",
                             lambda: repeated_all_to_alls(comm, algorithm, dtype, numel))
    checks.check("cached shapes still check", lambda: cached_shapes_still_check(comm))
    checks.check("counters exact", lambda: counters_are_exact(comm))
    checks.check("cache bounded", lambda: cache_is_bounded(comm))
    checks.check("async calls", lambda: async_calls(comm))
    checked = create(check=True)
    attach(checked)
    checks.check("checking agrees on cached shapes", lambda: checking_agrees_on_cached_shapes(checked))
    checked.close()
    checks.check("cache dropped with its communicator", lambda: dropped(checked))
    pc.shutdown()
    write({"passed": checks.passed, "failures": checks.failures, "world": comm.topology.world_size})


if __name__ == "__main__":
    main()
