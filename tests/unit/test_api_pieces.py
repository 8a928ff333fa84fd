"""Reduce ops, topology, layouts, algorithm names and the heuristic: the pieces the API is built from."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pccl_torch.algorithms import COLLECTIVES, Blocks, Fold
from pccl_torch.ops import ReduceOp, as_reduction, premul_sum
from pccl_torch.plan import resolve, valid_names
from pccl_torch.topology import Topology, TopologyError, local_size_override
from pccl_torch.validation import overlaps


@pytest.mark.parametrize("torch_op,ours", [
    (dist.ReduceOp.SUM, ReduceOp.SUM), (dist.ReduceOp.AVG, ReduceOp.AVG), (dist.ReduceOp.MAX, ReduceOp.MAX),
    (dist.ReduceOp.MIN, ReduceOp.MIN), (dist.ReduceOp.PRODUCT, ReduceOp.PRODUCT), ("sum", ReduceOp.SUM),
    (ReduceOp.MAX, ReduceOp.MAX)])
def test_reduce_ops_from_torch_and_names(torch_op, ours) -> None:
    assert as_reduction(torch_op).op is ours


def test_avg_and_premul_sum_are_sum_plus_a_scale() -> None:
    avg = as_reduction("avg")
    assert avg.combine is ReduceOp.SUM and avg.divide_by_world
    pre = premul_sum(torch.tensor(0.5))
    assert pre.combine is ReduceOp.SUM and pre.pre_scale == 0.5
    with pytest.raises(ValueError, match="needs a factor"):
        as_reduction(ReduceOp.PREMUL_SUM)
    with pytest.raises(ValueError, match="unsupported reduction"):
        as_reduction(dist.ReduceOp.BXOR)


def test_topology_geometry() -> None:
    t = Topology(rank=5, world_size=6, local_size=3)
    assert (t.node, t.local_rank, t.num_nodes, t.is_hierarchical) == (1, 2, 2, True)
    assert t.node_ranks(1) == [3, 4, 5] and t.peer_ranks(2) == [2, 5]
    assert not Topology(0, 4, 1).is_hierarchical and not Topology(0, 4, 4).is_hierarchical


def test_unequal_nodes_are_rejected_clearly(monkeypatch) -> None:
    with pytest.raises(TopologyError, match="does not divide the world size 5"):
        Topology(rank=0, world_size=5, local_size=2)
    monkeypatch.setenv("PCCL_LOCAL_SIZE", "two")
    with pytest.raises(TopologyError, match="not an integer"):
        local_size_override()
    monkeypatch.setenv("PCCL_LOCAL_SIZE", "0")
    with pytest.raises(TopologyError, match="at least 1"):
        local_size_override()
    monkeypatch.setenv("PCCL_LOCAL_SIZE", "3")
    assert local_size_override() == 3


@pytest.mark.parametrize("p", range(1, 20))
def test_fold_covers_every_rank_once(p: int) -> None:
    fold = Fold.of(p)
    assert fold.pof2 + fold.rem == p and fold.pof2 & (fold.pof2 - 1) == 0
    owned = []
    for v in range(fold.pof2):
        owned.extend(range(fold.first_rank(v), fold.first_rank(v + 1)))
    assert owned == list(range(p)) and fold.first_rank(fold.pof2) == p
    for r in range(p):
        assert fold.is_extra(r) or fold.first_rank(fold.virtual(r)) == r


def test_blocks_balanced_and_rotated() -> None:
    b = Blocks.balanced(10, 4)
    assert b.counts == (3, 3, 2, 2) and b.offsets == (0, 3, 6, 8, 10)
    assert b.rotated(1).counts == (3, 2, 2, 3)
    buf = torch.arange(10)
    assert torch.equal(b.span(buf, 1, 3), torch.arange(3, 8))


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_valid_name_resolves_and_unknown_names_list_them(collective) -> None:
    for name in valid_names(collective):
        assert resolve(collective, name).name == name
    with pytest.raises(ValueError, match=f"valid: {valid_names(collective)[0]}, "):
        resolve(collective, "nope")
    with pytest.raises(ValueError, match="unknown"):
        resolve(collective, "hier:vendor")


def test_overlap_detection() -> None:
    base = torch.zeros(10)
    assert overlaps(base[:5], base[4:])
    assert not overlaps(base[:5], base[5:])
    assert not overlaps(base[:0], base)


def test_torch_premul_sum_ops_carry_their_factor() -> None:
    """FSDP's dist._make_nccl_premul_sum(factor), float or tensor, becomes pccl's premul_sum(factor)."""
    assert as_reduction(dist._make_nccl_premul_sum(2.0)).pre_scale == 2.0
    assert as_reduction(dist._make_nccl_premul_sum(torch.tensor([0.25]))).pre_scale == 0.25
    with pytest.raises(ValueError, match="needs a factor"):
        as_reduction(dist.ReduceOp.PREMUL_SUM)


@pytest.mark.parametrize("config,served", [
    ("cpu:pccl,cuda:pccl", {"cpu", "cuda"}),
    ("pccl", {"cpu", "cuda"}),
    ("cpu:gloo,cuda:pccl", {"cuda"}),
    ("cpu:pccl,cuda:nccl", {"cpu"}),
    ("cpu:gloo,cuda:nccl", set()),
    ("CPU:PCCL", {"cpu"}),
])
def test_backend_device_map_says_which_devices_pccl_serves(config: str, served: set[str]) -> None:
    from pccl_torch.integrations.torch_backend import _pccl_devices

    assert _pccl_devices(config) == served


def test_premul_factor_is_read_from_the_ops_state_where_torch_has_no_factor_property() -> None:
    """torch 2.11 (the GPU machine's) has no ``ReduceOp.factor``: the factor comes from the op's pickled state."""
    from pccl_torch.ops import torch_premul_factor

    class Torch211PremulSum:  # what that torch's dist._make_nccl_premul_sum(0.25) offers
        def __getstate__(self):
            return (dist.ReduceOp.PREMUL_SUM, 0.25)

    assert torch_premul_factor(Torch211PremulSum()) == 0.25
    assert torch_premul_factor(dist._make_nccl_premul_sum(0.5)) == 0.5
    assert float(torch_premul_factor(dist._make_nccl_premul_sum(torch.tensor([2.0])))) == 2.0
    assert torch_premul_factor(dist.ReduceOp(dist.ReduceOp.SUM)) is None
