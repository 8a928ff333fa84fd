"""Every schedule of the family on the in-process transport, p = 1..17, 64 and 128, against torch.

Exact references: float64 inputs holding small integers (sums are exact whatever the order) and int64.
"""

from __future__ import annotations

import pytest
import torch

from pccl_torch.algorithms import Blocks, get
from pccl_torch.ops import ReduceOp
from pccl_torch.plan import family
from pccl_torch.transport import ThreadedWorld

RANKS = list(range(1, 18)) + [64, 128]
OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX)


def inputs_for(p: int, numel: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-2, 3, (numel,), generator=g).to(dtype) for _ in range(p)]


def reduced(inputs: list[torch.Tensor], op: ReduceOp) -> torch.Tensor:
    stack = torch.stack(inputs)
    if op is ReduceOp.SUM:
        return stack.sum(0)
    if op is ReduceOp.PRODUCT:
        return stack.prod(0)
    return stack.min(0).values if op is ReduceOp.MIN else stack.max(0).values


def block_sizes(p: int) -> tuple[int, ...]:
    return (0, 1, 3) if p <= 17 else (2,)


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("name", family("all_gather"))
def test_all_gather(p: int, name: str) -> None:
    world = ThreadedWorld(p)
    schedule = get("all_gather", name).fn
    for n in block_sizes(p):
        inputs = inputs_for(p, n, torch.float64, seed=p * 31 + n)

        def rank_fn(t, n=n, inputs=inputs):
            out = torch.full((p * n,), 99.0, dtype=torch.float64)
            mine = inputs[t.rank].clone()
            schedule(t, out, mine, Blocks.even(p, n))
            assert torch.equal(mine, inputs[t.rank]), "input modified"
            return out

        for out in world.run(rank_fn):
            assert torch.equal(out, torch.cat(inputs))


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("name", family("reduce_scatter"))
def test_reduce_scatter(p: int, name: str) -> None:
    world = ThreadedWorld(p)
    schedule = get("reduce_scatter", name).fn
    ops = OPS if p <= 17 else (ReduceOp.SUM,)
    for n in block_sizes(p):
        for op in ops:
            inputs = inputs_for(p, p * n, torch.int64, seed=p * 37 + n)
            expected = reduced(inputs, op)

            def rank_fn(t, n=n, op=op, inputs=inputs):
                out = torch.full((n,), 99, dtype=torch.int64)
                mine = inputs[t.rank].clone()
                schedule(t, mine, out, Blocks.even(p, n), op)
                assert torch.equal(mine, inputs[t.rank]), "input modified"
                return out

            for r, out in enumerate(world.run(rank_fn)):
                assert torch.equal(out, expected[r * n:(r + 1) * n]), (op, n, r)


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("name", family("all_reduce"))
def test_all_reduce(p: int, name: str) -> None:
    world = ThreadedWorld(p)
    schedule = get("all_reduce", name).fn
    ops = OPS if p <= 17 else (ReduceOp.SUM,)
    # Buffer lengths not divisible by p exercise the uneven shards of ring and Rabenseifner.
    for n in ((0, 1, 2 * p + 3) if p <= 17 else (p + 5,)):
        for op in ops:
            inputs = inputs_for(p, n, torch.float64, seed=p * 41 + n)
            expected = reduced(inputs, op)

            def rank_fn(t, op=op, inputs=inputs):
                buf = inputs[t.rank].clone()
                schedule(t, buf, op)
                return buf

            for out in world.run(rank_fn):
                assert torch.equal(out, expected), (op, n)


@pytest.mark.parametrize("p", [3, 5, 6, 8, 12])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", family("all_reduce"))
def test_all_reduce_is_bitwise_identical_on_every_rank(p: int, dtype: torch.dtype, name: str) -> None:
    """Rounding makes float sums order-dependent; every rank must still hold the same bits."""
    g = torch.Generator().manual_seed(p)
    inputs = [torch.randn(101, generator=g).to(dtype) for _ in range(p)]

    def rank_fn(t):
        buf = inputs[t.rank].clone()
        get("all_reduce", name).fn(t, buf, ReduceOp.SUM)
        return buf

    results = ThreadedWorld(p).run(rank_fn)
    for out in results[1:]:
        assert torch.equal(out.view(torch.uint8), results[0].view(torch.uint8))
    reference = torch.stack([x.double() for x in inputs]).sum(0)
    tolerance = 1e-4 if dtype is torch.float32 else 0.1
    assert torch.allclose(results[0].double(), reference, atol=tolerance * p, rtol=tolerance)


def test_a_misrouted_schedule_is_caught_by_the_transport() -> None:
    """The threaded transport must fail loudly (not hang) when a schedule receives a wrong-size message."""
    world = ThreadedWorld(2, timeout_s=2)

    def rank_fn(t):
        t.sendrecv(torch.zeros(3), 1 - t.rank, torch.zeros(4), 1 - t.rank)

    with pytest.raises(RuntimeError, match="expected 4"):
        world.run(rank_fn)


def test_a_deadlocked_schedule_times_out() -> None:
    world = ThreadedWorld(2, timeout_s=0.5)
    with pytest.raises(TimeoutError, match="no message"):
        world.run(lambda t: t.recv(torch.zeros(1), 1 - t.rank))


def test_a_send_buffer_written_while_in_flight_is_caught() -> None:
    """The in-process transport checks what ``sendrecv_posted`` relies on (the schedules above run under it): a
    schedule that writes a posted send's buffer before ``complete_posted`` fails."""
    world = ThreadedWorld(2)

    def careless(t):
        buf, incoming, posted = torch.arange(4.0), torch.empty(4), []
        t.sendrecv_posted(buf, 1 - t.rank, incoming, 1 - t.rank, posted)
        buf += incoming  # written while its send may still be in flight
        t.complete_posted(posted)

    with pytest.raises(RuntimeError, match="written while its send was in flight"):
        world.run(careless)


@pytest.mark.parametrize("collective, name", [("all_gather", "ring"), ("all_gather", "recursive_doubling"),
                                               ("all_gather", "bruck"), ("reduce_scatter", "recursive_halving"),
                                               ("reduce_scatter", "pairwise")])
def test_schedules_post_their_sends_and_complete_them_at_the_end(collective: str, name: str) -> None:
    """The schedules whose send buffers are never written again exchange through ``sendrecv_posted`` (a send's
    completion costs a round trip over MPI across TCP) and complete every posted send before they return."""
    world, schedule, calls = ThreadedWorld(5), get(collective, name).fn, []

    def rank_fn(t):
        post, complete = t.sendrecv_posted, t.complete_posted

        def posting(*args):
            calls.append("posted")
            return post(*args)

        def completing(posted):
            calls.append(("completed", len(posted)))
            return complete(posted)

        t.sendrecv_posted, t.complete_posted = posting, completing
        inp = torch.ones(5 * 3 if collective == "reduce_scatter" else 3, dtype=torch.float64)
        out = torch.empty(3 if collective == "reduce_scatter" else 5 * 3, dtype=torch.float64)
        if collective == "reduce_scatter":
            schedule(t, inp, out, Blocks.even(5, 3), ReduceOp.SUM)
        else:
            schedule(t, out, inp, Blocks.even(5, 3))

    world.run(rank_fn)
    completions = [c[1] for c in calls if c != "posted"]
    assert calls.count("posted") > 0, "no send was posted"
    assert calls.count("posted") == sum(completions), "a posted send was never completed"
