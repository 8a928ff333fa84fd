"""The two-level compositions on in-process transports: N nodes x L ranks, any inter-node schedule."""

from __future__ import annotations

import pytest
import torch

from pccl_torch.algorithms import get, hierarchical
from pccl_torch.ops import ReduceOp
from pccl_torch.plan import family
from pccl_torch.transport import ThreadedWorld
from pccl_torch.triton_kernels import HAS_TRITON, use_backend

GRIDS = [(1, 1), (1, 3), (3, 1), (2, 2), (3, 2), (2, 3), (5, 3), (4, 4)]


def run_grid(nodes: int, local: int, fn):
    """Run ``fn(intra, inter, global_rank)`` on every rank of an N x L grid; results in global order."""
    intra = [ThreadedWorld(local) for _ in range(nodes)]
    inter = [ThreadedWorld(nodes) for _ in range(local)]
    world = ThreadedWorld(nodes * local)
    args = [(intra[g // local].transports[g % local], inter[g % local].transports[g // local], g)
            for g in range(nodes * local)]
    return world.run(lambda _t, a, b, g: fn(a, b, g), args)


def ints(p: int, numel: int, seed: int) -> list[torch.Tensor]:
    """Per-rank integers in +-[1, 4]: never 0, so a rank left out or counted twice changes every element of a SUM."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 5, (numel,), generator=g, dtype=torch.int64) * (torch.randint(0, 2, (numel,), generator=g) * 2 - 1)
            for _ in range(p)]


@pytest.mark.parametrize("nodes,local", GRIDS)
@pytest.mark.parametrize("inter", family("all_gather") + ["native"])
def test_all_gather(nodes: int, local: int, inter: str) -> None:
    p, n = nodes * local, 5
    inputs = ints(p, n, seed=p)

    def fn(intra_t, inter_t, g):
        out = torch.empty(p * n, dtype=torch.int64)
        hierarchical.all_gather(intra_t, inter_t, get("all_gather", inter).fn, out, inputs[g].clone())
        return out

    for out in run_grid(nodes, local, fn):
        assert torch.equal(out, torch.cat(inputs))


@pytest.mark.parametrize("nodes,local", GRIDS)
@pytest.mark.parametrize("inter", family("reduce_scatter") + ["native"])
def test_reduce_scatter(nodes: int, local: int, inter: str) -> None:
    p, n = nodes * local, 3
    inputs = ints(p, p * n, seed=p + 1)
    expected = torch.stack(inputs).sum(0)

    def fn(intra_t, inter_t, g):
        out = torch.empty(n, dtype=torch.int64)
        hierarchical.reduce_scatter(intra_t, inter_t, get("reduce_scatter", inter).fn, inputs[g], out,
                                    ReduceOp.SUM)
        return out

    for g, out in enumerate(run_grid(nodes, local, fn)):
        assert torch.equal(out, expected[g * n:(g + 1) * n])


@pytest.mark.parametrize("nodes,local", GRIDS)
@pytest.mark.parametrize("inter", family("all_reduce") + ["native"])
@pytest.mark.parametrize("numel", [0, 1, 7, 24])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX], ids=lambda o: o.name)
def test_all_reduce(nodes: int, local: int, inter: str, numel: int, op: ReduceOp) -> None:
    """SUM sees a rank dropped or counted twice (MAX, idempotent, cannot see a double count); MAX checks
    that the op reaches both levels."""
    p = nodes * local
    inputs = ints(p, numel, seed=p + numel)
    stack = torch.stack(inputs) if numel else torch.empty(p, 0, dtype=torch.int64)
    expected = stack.sum(0) if op == ReduceOp.SUM else stack.max(0).values

    def fn(intra_t, inter_t, g):
        buf = inputs[g].clone()
        hierarchical.all_reduce(intra_t, inter_t, get("all_reduce", inter).fn, buf, op)
        return buf

    for out in run_grid(nodes, local, fn):
        assert torch.equal(out, expected)


@pytest.mark.parametrize("nodes,local", [(2, 3), (3, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_interpreter_kernels_give_the_torch_results(nodes: int, local: int, dtype: torch.dtype) -> None:
    """Hierarchical RS, AG and AR with every kernel (pack, reduce, rotate) through the Triton interpreter
    give bitwise the results of the torch kernels."""
    if not HAS_TRITON:
        pytest.fail("triton is not installed: `make test` installs the [triton] extra")
    p, n = nodes * local, 7
    g = torch.Generator().manual_seed(p)
    inputs = [torch.randn(p * n, generator=g).to(dtype) for _ in range(p)]

    def fn(intra_t, inter_t, rank):
        rs = torch.empty(n, dtype=dtype)
        hierarchical.reduce_scatter(intra_t, inter_t, get("reduce_scatter", "recursive_halving").fn,
                                    inputs[rank], rs, ReduceOp.SUM)
        ag = torch.empty(p * n, dtype=dtype)
        hierarchical.all_gather(intra_t, inter_t, get("all_gather", "bruck").fn, ag, inputs[rank][:n])
        ar = inputs[rank].clone()
        hierarchical.all_reduce(intra_t, inter_t, get("all_reduce", "ring").fn, ar, ReduceOp.SUM)
        return rs, ag, ar

    with use_backend("torch"):
        expected = run_grid(nodes, local, fn)
    with use_backend("triton"):
        interpreted = run_grid(nodes, local, fn)
    for want, got in zip(expected, interpreted):
        for w, x in zip(want, got):
            assert torch.equal(w.view(torch.uint8), x.view(torch.uint8))
