"""The default algorithm choice (MPICH's rules): always a valid name, hierarchical exactly when useful."""

from __future__ import annotations

import pytest

from pccl_torch import heuristic
from pccl_torch.algorithms import COLLECTIVES
from pccl_torch.plan import valid_names
from pccl_torch.topology import Topology


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("world,local", [(1, 1), (2, 1), (5, 1), (6, 3), (2048, 8), (12, 12)])
@pytest.mark.parametrize("nbytes", [0, 4, 1 << 12, 1 << 17, 1 << 20, 1 << 28])
def test_heuristic_always_returns_a_valid_name(collective, world, local, nbytes) -> None:
    topo = Topology(0, world, local)
    name = heuristic.choose(collective, nbytes, topo)
    assert name in valid_names(collective)
    assert name.startswith("hier:") == topo.is_hierarchical


def test_heuristic_prefers_latency_schedules_for_small_and_bandwidth_for_large() -> None:
    flat = Topology(0, 8, 1)
    assert heuristic.choose("all_reduce", 64, flat) == "recursive_doubling"
    assert heuristic.choose("all_gather", 1024, flat) == "bruck"
    assert heuristic.choose("reduce_scatter", 1 << 26, flat) == "pairwise"
    assert heuristic.choose("all_reduce", 1 << 26, Topology(0, 6, 1)) == "ring"
