"""The default algorithm choice (MPICH's rules): always a valid name, hierarchical exactly when useful."""

from __future__ import annotations

import pytest

from pccl_torch.selection import heuristic
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
    if collective == "all_to_all":  # MPI's own at every layout (heuristic.NETWORK_ALL_TO_ALL: measured)
        assert name == "mpi"
    else:
        assert name.startswith("hier:") == topo.is_hierarchical


def test_heuristic_prefers_latency_schedules_for_small_and_bandwidth_for_large() -> None:
    flat = Topology(0, 8, 1)
    assert heuristic.choose("all_reduce", 64, flat) == "recursive_doubling"
    assert heuristic.choose("all_gather", 1024, flat) == "bruck"
    assert heuristic.choose("reduce_scatter", 1 << 26, flat) == "pairwise"
    assert heuristic.choose("all_reduce", 1 << 26, Topology(0, 6, 1)) == "ring"


def test_networked_rule_moves_with_the_measured_link() -> None:
    from pccl_torch.selection.heuristic import networked_choice

    # No link measured: the fixed thresholds (flat MPI below 256 KiB for all-gather/reduce-scatter, 4 MiB all-reduce).
    assert networked_choice("all_gather", 64 << 10, 2) == "mpi"
    assert networked_choice("all_gather", 256 << 10, 2) == "hier:mpi"
    assert networked_choice("reduce_scatter", 4 << 20, 2) == "hier:pipelined"
    assert networked_choice("all_reduce", 1 << 20, 2) == "mpi"
    # 1 Gbit/s (124 MB/s measured): 64 KiB stays flat; 200 Mbit/s (25 MB/s): it takes the hierarchy.
    assert networked_choice("all_gather", 64 << 10, 2, 124e6) == "mpi"
    assert networked_choice("reduce_scatter", 64 << 10, 2, 25e6) == "hier:mpi"
    assert networked_choice("all_gather", 32 << 10, 2, 25e6) == "mpi"
    # All-reduce: flat MPI up to 4 MiB whatever the link (small ones too: hierarchical recursive doubling lost to it
    # on 2026-12-05); a fast link never raises the fixed thresholds; uneven node counts keep the ring.
    assert networked_choice("all_reduce", 4 << 10, 2, 124e6) == "mpi"
    assert networked_choice("all_reduce", 256 << 10, 2, 124e6) == "mpi"
    assert networked_choice("all_reduce", 64 << 10, 2, 25e6) == "mpi"
    assert networked_choice("all_reduce", 256 << 10, 2, 25e6) == "mpi"
    assert networked_choice("all_reduce", 4 << 20, 2, 124e6) == "hier:pipelined"
    assert networked_choice("all_reduce", 1 << 20, 2, 25e6) == "mpi"
    assert networked_choice("all_reduce", 128 << 10, 3, 124e6) == "hier:ring"
    assert networked_choice("all_gather", 256 << 10, 2, 10e9) == "hier:mpi"
    assert networked_choice("reduce_scatter", 128 << 10, 3, 25e6) == "hier:ring"


def test_latency_bound_calls_take_the_fewest_steps_between_nodes() -> None:
    """Links measured at 10 ms one way, 107 MB/s (the testbed at RTT 20 ms): a call whose inter-node bytes take less
    than two latencies runs the lg N schedule between nodes; at 0.7 ms (RTT 1 ms) the rules of no latency stand but for
    MPICH's lg p schedules, which stay flat (test_lg_p_schedules_stay_flat_across_links_with_latency)."""
    from pccl_torch.selection.heuristic import networked_choice

    far = {"inter_latency_s": 10.2e-3, "local_size": 2}
    near = {"inter_latency_s": 0.72e-3, "local_size": 2}
    assert networked_choice("all_reduce", 64 << 10, 4, 107e6, **far) == "hier:recursive_doubling"
    assert networked_choice("all_reduce", 4 << 20, 4, 107e6, **far) == "hier:recursive_doubling"
    assert networked_choice("all_reduce", 16 << 20, 4, 107e6, **far) == "hier:pipelined"  # 8 MiB: 8 latencies
    assert networked_choice("all_gather", 1 << 20, 4, 107e6, **far) == "hier:bruck"
    assert networked_choice("reduce_scatter", 1 << 20, 4, 107e6, **far) == "hier:recursive_halving"
    assert networked_choice("reduce_scatter", 1 << 20, 3, 107e6, **far) == "hier:recursive_halving"  # folds
    # While MPICH runs its lg p schedules (below 512 KiB) all-gathers stay flat: one MPI call that crosses nodes as
    # often as the hierarchy would; reduce-scatters take the hierarchy, whose steps wait for their receives only.
    assert networked_choice("all_gather", 64 << 10, 4, 107e6, **far) == "mpi"
    assert networked_choice("all_gather", 256 << 10, 4, 107e6, **far) == "mpi"
    assert networked_choice("reduce_scatter", 256 << 10, 4, 107e6, **far) == "hier:recursive_halving"
    assert networked_choice("all_to_all", 64 << 10, 4, 107e6, **far) == "mpi"
    for collective, nbytes in [("all_reduce", 64 << 10), ("all_reduce", 4 << 20), ("all_gather", 1 << 20)]:
        assert networked_choice(collective, nbytes, 4, 107e6, **near) == networked_choice(collective, nbytes, 4, 107e6)
    # No bandwidth measured: no latency rule either.
    assert networked_choice("all_reduce", 64 << 10, 4, None, **far) == "mpi"


def test_lg_p_schedules_stay_flat_across_links_with_latency() -> None:
    """From 0.4 ms one way (the testbed at RTT 1 ms: 0.6 ms), an all-gather or reduce-scatter that MPICH runs in lg p
    steps (below 512 KiB on a power-of-two rank count) stays MPI's own; without latency, or where MPICH would step
    around a ring or pairwise, the hierarchy as before; all-reduce is untouched."""
    from pccl_torch.selection.heuristic import flat_runs_lg_p, networked_choice

    near = {"inter_latency_s": 0.6e-3, "local_size": 2}
    for collective in ("all_gather", "reduce_scatter"):
        assert networked_choice(collective, 256 << 10, 4, 122e6, **near) == "mpi"
        assert networked_choice(collective, 256 << 10, 4, 122e6) == "hier:mpi"
        assert networked_choice(collective, 256 << 10, 4, 122e6, inter_latency_s=0.2e-3, local_size=2) == "hier:mpi"
        assert networked_choice(collective, 1 << 20, 4, 122e6, **near) == networked_choice(collective, 1 << 20, 4, 122e6)
        assert not flat_runs_lg_p(collective, 256 << 10, 8, None, 0.6e-3)  # no link measured
    # 6 ranks: MPICH's 256 KiB all-gather is a ring (recursive doubling needs a power of two), its reduce-scatter
    # recursive halving.
    assert networked_choice("all_gather", 256 << 10, 3, 122e6, **near) == "hier:mpi"
    assert networked_choice("reduce_scatter", 256 << 10, 3, 122e6, **near) == "mpi"
    for nbytes in (64 << 10, 256 << 10, 4 << 20):
        assert networked_choice("all_reduce", nbytes, 4, 122e6, **near) == networked_choice("all_reduce", nbytes, 4, 122e6)


def test_a_rank_a_node_across_latency_takes_lg_p_schedules_then_the_vendor_library() -> None:
    """8 nodes x 1 rank, links measured at 10.5 ms one way and 108 MB/s (the testbed at RTT 20 ms, 1 Gbit/s): pccl's
    recursive doubling / halving (its steps wait for their receives only, MPICH's for each send too), recursive
    doubling all-reduce while its lg p whole-buffer sends take under two latencies, gloo for
    all-gathers and all-reduces of 8 latencies or more; near links (RTT 1 ms) keep the rules of no latency."""
    from pccl_torch.selection.heuristic import flat_latency_choice, networked_choice

    far = {"inter_latency_s": 10.5e-3, "local_size": 1}
    expected = {
        "all_gather": ["recursive_doubling"] * 4 + ["vendor"],
        "reduce_scatter": ["recursive_halving"] * 5,
        "all_reduce": ["recursive_doubling", "recursive_doubling", "mpi", "mpi", "vendor"],
    }
    for collective, names in expected.items():
        got = [networked_choice(collective, (64 << 10) << 2 * i, 8, 108e6, **far) for i in range(5)]
        assert got == names, collective
    # Not a power of two: Bruck, which needs no folding steps.
    assert flat_latency_choice("all_gather", 1 << 20, 6, 108e6, 10.5e-3) == "bruck"
    assert flat_latency_choice("reduce_scatter", 1 << 20, 6, 108e6, 10.5e-3) == "recursive_halving"
    # A slower link reaches the vendor library's share sooner (200 Mbit/s: 4 MiB is ~16 latencies, 1 MiB ~4).
    assert flat_latency_choice("all_gather", 4 << 20, 8, 25e6, 10.5e-3) == "vendor"
    assert flat_latency_choice("all_gather", 16 << 20, 8, 25e6, 10.5e-3) == "vendor"
    assert flat_latency_choice("all_gather", 1 << 20, 8, 25e6, 10.5e-3) == "recursive_doubling"
    # Blocks over 4 MiB (64 MiB over 8 ranks): MPI's own steps, for all-gather and all-to-all alike; all-reduce stays
    # with the vendor library.
    assert flat_latency_choice("all_gather", 64 << 20, 8, 108e6, 10.5e-3) == "mpi"
    assert flat_latency_choice("all_reduce", 64 << 20, 8, 108e6, 10.5e-3) == "vendor"
    assert networked_choice("all_to_all", 16 << 20, 8, 108e6, **far) == "vendor"
    assert networked_choice("all_to_all", 64 << 20, 8, 108e6, **far) == "mpi"
    assert networked_choice("all_to_all", 64 << 20, 4, 108e6, inter_latency_s=10.5e-3, local_size=2) == "mpi"
    # RTT 1 ms is outside the regime.
    assert networked_choice("all_to_all", 1 << 20, 8, 108e6, **far) == "vendor"
    for collective in expected:
        assert networked_choice(collective, 1 << 20, 8, 108e6, inter_latency_s=0.7e-3, local_size=1) == \
            networked_choice(collective, 1 << 20, 8, 108e6)
