"""The compiled hot path (``pccl_torch.hotpath``) under ``mpiexec -n N``: which calls it runs (``hits``), that
they give the Python path's results, numbers and counters, that every other call still reaches the Python path
(and its errors), a late peer on the polled path, and its table's end with the communicator.

Every rank writes its failures (``rank_result.write``); ``test_hotpath.py`` checks every rank and the exit status.
"""

from __future__ import annotations

import inspect
import time

import torch
import torch.distributed as dist

import pccl_torch as pc
from pccl_torch import api, calls, hotpath
from pccl_torch.communicator import create
from pccl_torch.selection import attach

from calls_driver import expect
from rank_result import Checks, write

DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16)
SIZES = (0, 1, 7, 256, 1500)
"""Elements of a block: persistent (up to 4 KiB) and plain calls."""


def value(rank: int, call: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    return ((torch.arange(numel) % 7) + 1 + rank + call).to(dtype)


def hits_of(comm: pc.Communicator, fn) -> int:
    """How many of ``fn``'s calls the hot path ran."""
    before = hotpath.hits(comm)
    fn()
    return hotpath.hits(comm) - before


def check_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert torch.equal(got, want), f"{what}: got {got[:8].tolist()}, want {want[:8].tolist()}"


def bound_calls_run_hot(comm: pc.Communicator, dtype: torch.dtype, numel: int) -> None:
    """The first call of each shape binds it in Python; the next ones run in the extension (MPI-typed reductions,
    any dtype for the moves) with the same results, sequence numbers and counters."""
    p, rank = comm.topology.world_size, comm.topology.rank
    reduces = dtype != torch.bfloat16  # MPI has no bfloat16: its reductions stay on the Python path
    stats_before, sequence_before = pc.stats(comm), comm.sequence
    ran = 0
    for call in range(4):
        mine = value(rank, call, numel, dtype)
        buf = mine.clone()
        ran += hits_of(comm, lambda: pc.all_reduce(buf, comm=comm))
        check_equal(buf, sum(value(r, call, numel, torch.float64) for r in range(p)).to(dtype), f"AR call {call}")
        out = torch.empty(p, numel, dtype=dtype)
        ran += hits_of(comm, lambda: pc.all_gather_into_tensor(out, mine, comm=comm))
        check_equal(out, torch.stack([value(r, call, numel, dtype) for r in range(p)]), f"AG call {call}")
        out[rank].copy_(mine)
        ran += hits_of(comm, lambda: pc.all_gather_into_tensor(out, out[rank], comm=comm))  # in place
        check_equal(out, torch.stack([value(r, call, numel, dtype) for r in range(p)]), f"AG in place call {call}")
        full = torch.cat([value(rank, call + b, numel, dtype) for b in range(p)])
        got = torch.empty(numel, dtype=dtype)
        ran += hits_of(comm, lambda: pc.reduce_scatter_tensor(got, full, comm=comm))
        want = sum(value(r, call + rank, numel, torch.float64) for r in range(p)).to(dtype)
        check_equal(got, want, f"RS call {call}")
        check_equal(full, torch.cat([value(rank, call + b, numel, dtype) for b in range(p)]), "RS input unchanged")
        a2a_in = torch.cat([value(rank * p + j, call, numel, dtype) for j in range(p)])
        a2a_out = torch.empty_like(a2a_in)
        ran += hits_of(comm, lambda: pc.all_to_all_single(a2a_out, a2a_in, comm=comm))
        check_equal(a2a_out, torch.cat([value(i * p + rank, call, numel, dtype) for i in range(p)]), "A2A")
        if p > 1:  # round 0 binds each shape; its in-place all-gather has the out-of-place one's shape
            expected = 1 + call * (3 + (2 if reduces else 0))
            assert ran == expected, f"{ran} calls ran hot after {call + 1} rounds, {expected} expected"
    after = pc.stats(comm)
    for collective, per_round in (("all_reduce", 1), ("all_gather", 2), ("reduce_scatter", 1), ("all_to_all", 1)):
        calls_made = after["calls"].get(collective, 0) - stats_before["calls"].get(collective, 0)
        assert calls_made == 4 * per_round, f"{collective}: {calls_made} calls counted, {4 * per_round} made"
    assert comm.sequence - sequence_before == 20, f"sequence moved {comm.sequence - sequence_before}, 20 calls"


def rounds_hit_exactly(comm: pc.Communicator) -> None:
    """Per round of a bound float32 shape, every call runs hot: 4 collectives, 5 calls."""
    p, rank = comm.topology.world_size, comm.topology.rank
    buf, out, inp = torch.ones(33), torch.empty(p * 33), torch.ones(33)
    rs_in, rs_out = torch.ones(p * 33), torch.empty(33)
    a2a_in, a2a_out = torch.ones(p * 33), torch.empty(p * 33)

    def round_() -> None:
        pc.all_reduce(buf, comm=comm)
        pc.all_gather_into_tensor(out, inp, comm=comm)
        pc.all_gather_into_tensor(out, out[rank * 33:(rank + 1) * 33], comm=comm)
        pc.reduce_scatter_tensor(rs_out, rs_in, comm=comm)
        pc.all_to_all_single(a2a_out, a2a_in, comm=comm)

    round_()  # binds
    ran = hits_of(comm, lambda: [round_() for _ in range(10)])
    assert ran == (50 if p > 1 else 0), f"{ran} of 50 bound calls ran hot"
    assert pc.stats(comm)["hotpath"] == {"calls": hotpath.hits(comm)}, pc.stats(comm)["hotpath"]


def ops_by_identity(comm: pc.Communicator) -> None:
    """pccl's and torch's SUM, PRODUCT, MIN, MAX run hot, positionally or as op=; other ops (AVG, PREMUL_SUM,
    strings) take the Python path with the right result."""
    p, rank = comm.topology.world_size, comm.topology.rank
    base = torch.tensor([1.0, 2.0, 3.0]) + rank
    stack = torch.stack([torch.tensor([1.0, 2.0, 3.0]) + r for r in range(p)])
    wants = {"sum": stack.sum(0), "product": stack.prod(0), "min": stack.min(0).values, "max": stack.max(0).values,
             "avg": stack.mean(0)}
    hot_ops = [(pc.ReduceOp.SUM, "sum"), (dist.ReduceOp.SUM, "sum"), (pc.ReduceOp.PRODUCT, "product"),
               (dist.ReduceOp.PRODUCT, "product"), (pc.ReduceOp.MIN, "min"), (dist.ReduceOp.MIN, "min"),
               (pc.ReduceOp.MAX, "max"), (dist.ReduceOp.MAX, "max")]
    for op, name in hot_ops + [(pc.ReduceOp.AVG, "avg"), (dist.ReduceOp.AVG, "avg"), ("sum", "sum")]:
        for keyword in (False, True):
            for call in range(2):
                buf = base.clone()
                ran = hits_of(comm, lambda: pc.all_reduce(buf, op=op, comm=comm) if keyword
                              else pc.all_reduce(buf, op, comm=comm))
                check_equal(buf, wants[name], f"all-reduce {op}")
                if call == 1 and p > 1:
                    assert ran == ((op, name) in hot_ops), f"{op} (op= {keyword}) ran hot: {ran}"
    out = torch.empty(1)
    pc.reduce_scatter_tensor(out, torch.ones(p), pc.ReduceOp.MAX, comm=comm)
    ran = hits_of(comm, lambda: pc.reduce_scatter_tensor(out, torch.full((p,), 2.0), pc.ReduceOp.MAX, comm=comm))
    check_equal(out, torch.tensor([2.0]), "reduce-scatter MAX")
    assert ran == (p > 1), f"reduce-scatter MAX ran hot: {ran}"


def everything_else_takes_python(comm: pc.Communicator) -> None:
    """A bound shape called with another keyword, another layout or an error still gets the Python path: its
    results and its errors, and none of these counts as a hot call."""
    p, rank = comm.topology.world_size, comm.topology.rank
    buf = torch.ones(8)
    pc.all_reduce(buf, comm=comm)
    if p > 1:  # explicit defaults are still a plain call
        assert hits_of(comm, lambda: pc.all_reduce(buf.fill_(1), compression=None, algorithm=None,
                                                   async_op=False, comm=comm)) == 1, "explicit defaults not hot"
        check_equal(buf, torch.full((8,), float(p)), "explicit defaults")
    cases = {
        "algorithm=mpi": lambda: pc.all_reduce(buf.fill_(1), algorithm="mpi", comm=comm),
        "async_op": lambda: pc.all_reduce(buf.fill_(1), async_op=True, comm=comm).wait(),
        "non-contiguous": lambda: expect(ValueError, "not contiguous",
                                         lambda: pc.all_reduce(torch.ones(8, 2).t()[0], comm=comm)),
        "not a tensor": lambda: expect(TypeError, "must be a torch.Tensor", lambda: pc.all_reduce([1.0], comm=comm)),
        "meta tensor": lambda: expect(ValueError, "is on meta",
                                      lambda: pc.all_reduce(torch.empty(8, device="meta"), comm=comm)),
        "unknown keyword": lambda: expect(TypeError, "unexpected keyword",
                                          lambda: pc.all_reduce(buf, comm=comm, nonsense=1)),
        "sparse": lambda: expect(TypeError, "dense", lambda: pc.all_reduce(torch.ones(8).to_sparse(), comm=comm)),
    }
    for name, case in cases.items():
        assert hits_of(comm, case) == 0, f"{name} ran hot"
    out = torch.empty(p * 4)
    pc.all_gather_into_tensor(out, torch.ones(4), comm=comm)
    if p > 1:
        wrong = out[((rank + 1) % p) * 4:][:4]
        assert hits_of(comm, lambda: expect(ValueError, "overlaps output",
                                            lambda: pc.all_gather_into_tensor(out, wrong, comm=comm))) == 0
    expect(TypeError, "must match", lambda: pc.all_gather_into_tensor(out.double(), torch.ones(4), comm=comm))
    # a reduce-scatter whose output overlaps its input: the Python path's temporary, the right result
    rs_in = torch.arange(p * 4, dtype=torch.float32) + rank
    pc.reduce_scatter_tensor(torch.empty(4), rs_in.clone(), comm=comm)
    target = rs_in[:4]
    want = sum(torch.arange(p * 4, dtype=torch.float32) + r for r in range(p))[rank * 4:(rank + 1) * 4]
    assert hits_of(comm, lambda: pc.reduce_scatter_tensor(target, rs_in, comm=comm)) == 0
    check_equal(target, want, "reduce-scatter into its own input")
    # an all-to-all whose dim 0 does not split evenly, and split sizes given as None positionally
    a2a = torch.ones(2 * p, 3)
    pc.all_to_all_single(torch.empty_like(a2a), a2a, comm=comm)
    if p > 1:
        assert hits_of(comm, lambda: pc.all_to_all_single(torch.empty_like(a2a), a2a, None, None, comm=comm)) == 1
        expect(ValueError, "do not split equally",
               lambda: pc.all_to_all_single(torch.empty(1, 6 * p), torch.ones(1, 6 * p), comm=comm))


def late_peer(comm: pc.Communicator) -> None:
    """Rank 0 comes 50 ms late: the others' hot calls wait for it (on the polled path, the transport's own wait
    takes over after the fast poll) and all finish with the right result."""
    p, rank = comm.topology.world_size, comm.topology.rank
    buf = torch.ones(64)
    pc.all_reduce(buf, comm=comm)
    for _ in range(3):
        if rank == 0:
            time.sleep(0.05)
        buf.fill_(1.0)
        assert hits_of(comm, lambda: pc.all_reduce(buf, comm=comm)) == (p > 1)
        check_equal(buf, torch.full((64,), float(p)), "all-reduce with a late peer")


def public_calls_look_like_functions(comm: pc.Communicator) -> None:
    for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"):
        public = getattr(pc, name)
        implementation = getattr(public, "__wrapped__", public)
        assert public.__name__ == name and public.__doc__ == implementation.__doc__, name
        assert inspect.signature(public) == inspect.signature(implementation), name
    assert pc.all_gather_single is pc.all_gather_into_tensor


def table_ends_with_communicator(comm: pc.Communicator) -> None:
    """A communicator of its own binds into its own table; the table empties when it closes, and when the call
    cache starts over (MAX_SHAPES)."""
    own = create()
    attach(own)
    buf = torch.ones(5)
    for _ in range(3):
        pc.all_reduce(buf, comm=own)
    if own.topology.world_size > 1:
        assert len(own.hot) == 1 and hotpath.hits(own) == 2, (len(own.hot), hotpath.hits(own))
    limit, calls.MAX_SHAPES = calls.MAX_SHAPES, 3
    try:
        for numel in range(40, 50):
            pc.all_reduce(torch.ones(numel), comm=own)
            assert len(own.hot) <= 3, len(own.hot)
    finally:
        calls.MAX_SHAPES = limit
    own.close()
    assert len(own.hot) == 0 and not own.calls, (len(own.hot), len(own.calls))


def main() -> None:
    comm = pc.init()
    checks = Checks(comm.topology.rank)
    checks.check("the hot path is built and used", lambda: _available(comm))
    for dtype in DTYPES:
        for numel in SIZES:
            checks.check(f"bound calls {dtype} {numel}", lambda: bound_calls_run_hot(comm, dtype, numel))
    checks.check("rounds hit exactly", lambda: rounds_hit_exactly(comm))
    checks.check("ops by identity", lambda: ops_by_identity(comm))
    checks.check("everything else takes Python", lambda: everything_else_takes_python(comm))
    checks.check("late peer", lambda: late_peer(comm))
    checks.check("public calls look like functions", lambda: public_calls_look_like_functions(comm))
    checks.check("table ends with its communicator", lambda: table_ends_with_communicator(comm))
    hits = hotpath.hits(comm)
    pc.shutdown()
    checks.check("default communicator's table cleared", lambda: _cleared(comm))
    checks.check("calls after shutdown", lambda: expect(pc.NotInitializedError, "shut down",
                                                         lambda: pc.all_reduce(torch.ones(5))))
    write({"passed": checks.passed, "failures": checks.failures, "world": comm.topology.world_size, "hits": hits,
           "blocking": comm.blocking_waits})


def _available(comm: pc.Communicator) -> None:
    assert hotpath.available, f"the hot path is not available: {hotpath.why_not}"
    assert type(pc.all_reduce).__name__ == "Entry" and api.all_reduce is pc.all_reduce
    assert comm.hot is not None


def _cleared(comm: pc.Communicator) -> None:
    assert len(comm.hot) == 0, f"{len(comm.hot)} shapes left after shutdown"


if __name__ == "__main__":
    main()
