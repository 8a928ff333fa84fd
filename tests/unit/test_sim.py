"""pccl-sim: cost formulas against their closed forms, hierarchical compositions, the fit, machine
profiles and the CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

import pccl_torch
from pccl_torch.sim import PARAMS, MachineProfile, algorithms, fit, format_report, load, predict, terms
from pccl_torch.selection import heuristic
from pccl_torch.sim import costs, machine
from pccl_torch.sim.cli import main, parse_gpus, sweep
from pccl_torch.sim.fit import measured_vendor_library, report, samples
from pccl_torch.sim.pipeline import pipeline_chunks, predict_as_run

N = 3 << 20  # bytes of the full buffer
MACHINES = Path(pccl_torch.__file__).resolve().parents[1] / "configs" / "machines"


def coef(t: costs.Terms) -> dict[str, float]:
    return {k: v for k, v in t.coef.items() if v}


def assert_terms(t: costs.Terms, expected: dict[str, float]) -> None:
    """``t`` has exactly ``expected``'s coefficients; the wire's latency (``link_latency``, one per step that
    crosses nodes) only where ``expected`` names it (its own tests: ``test_every_step_across_nodes_pays_the_wire``)."""
    got = coef(t)
    if "link_latency" not in expected:
        got.pop("link_latency", None)
    assert set(got) == {k for k, v in expected.items() if v}, (got, expected)
    for k, v in expected.items():
        assert got.get(k, 0.0) == pytest.approx(v, rel=1e-12), k


def closed_form(collective: str, algorithm: str, p: int, n: float, a: str, b: str) -> dict[str, float]:
    """DESIGN.md's costs for p a power of two, plus Bruck's rotation and the per-call overhead."""
    lg, share = math.log2(p), (p - 1) / p
    forms = {
        ("all_gather", "ring"): {a: p - 1, b: share * n},
        ("all_gather", "recursive_doubling"): {a: lg, b: share * n},
        ("all_gather", "bruck"): {a: math.ceil(lg), b: share * n, "copy": n},
        ("reduce_scatter", "ring"): {a: p - 1, b: share * n, "gamma": share * n},
        ("reduce_scatter", "pairwise"): {a: p - 1, b: share * n, "gamma": share * n},
        ("reduce_scatter", "recursive_halving"): {a: lg, b: share * n, "gamma": share * n},
        ("all_reduce", "ring"): {a: 2 * (p - 1), b: 2 * share * n, "gamma": share * n},
        ("all_reduce", "rabenseifner"): {a: 2 * lg, b: 2 * share * n, "gamma": share * n},
        ("all_reduce", "recursive_doubling"): {a: lg, b: lg * n, "gamma": lg * n},
        ("all_to_all", "pairwise"): {a: p - 1, b: share * n, "copy": n / p},  # n: one rank's buffer; own block copied
    }
    return {**forms[(collective, algorithm)], "overhead": 1.0}


FLAT = [(c, a) for c in costs.FAMILY for a in costs.FAMILY[c]]


# ---- flat formulas -------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("collective,algorithm", FLAT)
def test_flat_single_node_matches_closed_form(collective, algorithm, p):
    assert_terms(terms(collective, algorithm, N, 1, p, 1),
                 closed_form(collective, algorithm, p, N, "alpha_intra", "beta_intra"))


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("collective,algorithm", FLAT)
def test_flat_one_rank_per_node_matches_closed_form(collective, algorithm, p):
    assert_terms(terms(collective, algorithm, N, p, 1, 1),
                 closed_form(collective, algorithm, p, N, "alpha_inter", "beta_inter"))


@pytest.mark.parametrize("p", [3, 5, 6])
def test_fold_adds_two_steps(p):
    q = 1 << (p.bit_length() - 1)
    lg, a, b = math.log2(q), "alpha_intra", "beta_intra"
    base = {"overhead": 1.0}
    assert_terms(terms("all_gather", "recursive_doubling", N, 1, p, 1),
                 {**base, a: lg + 2, b: (q - 1) / q * N + N / p + N})
    assert_terms(terms("reduce_scatter", "recursive_halving", N, 1, p, 1),
                 {**base, a: lg + 2, b: (q - 1) / q * N + N + N / p, "gamma": (q - 1) / q * N + N})
    assert_terms(terms("all_reduce", "recursive_doubling", N, 1, p, 1),
                 {**base, a: lg + 2, b: lg * N + 2 * N, "gamma": (lg + 1) * N})
    rab = terms("all_reduce", "rabenseifner", N, 1, p, 1)  # each half folds on its own
    rs, ag = (terms(c, a, N, 1, p, 1) for c, a in [("reduce_scatter", "recursive_halving"),
                                                    ("all_gather", "recursive_doubling")])
    assert_terms(rab, {**coef(rs + ag), "overhead": 1.0})


@pytest.mark.parametrize("p", [3, 5, 6])
def test_ring_pairwise_bruck_need_no_fold(p):
    share, a, b = (p - 1) / p, "alpha_intra", "beta_intra"
    assert_terms(terms("all_gather", "bruck", N, 1, p, 1),
                 {"overhead": 1, a: math.ceil(math.log2(p)), b: share * N, "copy": N})
    for collective, algorithm in [("reduce_scatter", "ring"), ("reduce_scatter", "pairwise")]:
        assert_terms(terms(collective, algorithm, N, 1, p, 1),
                     {"overhead": 1, a: p - 1, b: share * N, "gamma": share * N})


def test_flat_links_by_distance_and_nic_sharing():
    # 4 nodes x 4 ranks, 2 NICs: distances 1, 2 stay on the node; 4, 8 cross it with 2 ranks per NIC.
    t = terms("all_gather", "recursive_doubling", N, 4, 4, 2)
    assert_terms(t, {"overhead": 1, "alpha_intra": 2, "beta_intra": 3 * N / 16,
                     "alpha_inter": 2, "beta_inter": 2 * 12 * N / 16})
    # A flat ring across nodes: every step at the speed of one stream over the node boundary.
    assert_terms(terms("all_gather", "ring", N, 4, 4, 2),
                 {"overhead": 1, "alpha_inter": 15, "beta_inter": 15 * N / 16})
    # The vendor ring stripes over the NICs: its own per-step latency and aggregate bandwidth.
    assert_terms(terms("reduce_scatter", "vendor", N, 4, 4, 2),
                 {"overhead": 1, "alpha_vendor_step": 15, "beta_vendor_inter": 15 * N / 16})  # reductions overlapped
    assert_terms(terms("all_reduce", "vendor", N, 1, 4, 2),
                 {"overhead": 1, "alpha_vendor_intra": 6, "beta_vendor_intra": 1.5 * N})


def test_nic_share():
    assert costs.nic_share(8, 4) == 2
    assert costs.nic_share(4, 4) == 1
    assert costs.nic_share(2, 4) == 1  # never below one


def test_mpi_is_mpich_choice_with_its_own_latency():
    # 1 KiB all-gather on 8 ranks: MPICH picks Bruck.
    assert_terms(terms("all_gather", "mpi", 1024, 1, 8, 1),
                 {"overhead": 1, "alpha_mpi_native": 3, "beta_intra": 7 / 8 * 1024, "copy": 1024})
    big = coef(terms("reduce_scatter", "mpi", 64 << 20, 4, 2, 2))  # pairwise, no fold
    assert big["alpha_mpi_native"] == 7 and "alpha_inter" not in big and "alpha_intra" not in big


# ---- the machine: node links, shared cores, the vendor library -------------------------------------------

def test_pairwise_reduce_scatter_crosses_node_links_like_an_all_to_all():
    # 2 nodes x 2 ranks, one NIC: step 1 and 3 send one block off each node, step 2 two (both ranks at once):
    # the node's link carries n in all, as MPICH's measured 16 MiB reduce-scatter on the testbed showed.
    t = coef(terms("reduce_scatter", "pairwise", N, 2, 2, 1))
    assert t["beta_inter"] == pytest.approx(N / 4 * (1 + 2 + 1)) and t["alpha_inter"] == 3
    assert "beta_intra" not in t  # every step has a pair crossing nodes: the step is the slow pair's
    assert "alpha_inter" not in coef(terms("reduce_scatter", "pairwise", N, 1, 4, 1))  # one node: nothing crosses
    # 3 nodes (not a power of two) x 2: 5 steps, all crossing.
    assert coef(terms("reduce_scatter", "pairwise", N, 3, 2, 1))["alpha_inter"] == 5


def test_mpich_all_reduce_keeps_its_largest_exchanges_inside_the_node():
    # One node, or one rank a node: MPICH's reduce-scatter + all-gather halves from the nearest partner out, so
    # on 4 x 1 the distance-2 step carries n/4 a rank (twice: RS and AG); pccl's own Rabenseifner starts with
    # the farthest partner and carries n/2 there.
    mpich, ours = coef(terms("all_reduce", "mpi", N, 4, 1, 1)), coef(terms("all_reduce", "rabenseifner", N, 4, 1, 1))
    assert mpich["beta_inter"] == pytest.approx(2 * (N / 2 + N / 4)) == ours["beta_inter"]
    flat = coef(terms("all_reduce", "mpi", N, 1, 4, 1))
    assert flat["beta_intra"] == pytest.approx(2 * (N / 2 + N / 4)) and flat["gamma"] == pytest.approx(3 / 4 * N)
    # Several nodes of several ranks: reduce to a leader a node (RS n/2 + gather n/2 on 2 ranks), the leaders'
    # all-reduce alone on each node's link (n/2 each way, twice), broadcast (scatter n/2 + all-gather n/2).
    smp = coef(terms("all_reduce", "mpi", N, 2, 2, 1))
    assert smp["beta_inter"] == pytest.approx(N) and smp["beta_intra"] == pytest.approx(2 * N)
    assert smp["gamma"] == pytest.approx(N)
    # Three leaders (not a power of two): the extra one folds in and out over whole buffers.
    assert coef(terms("all_reduce", "mpi", N, 3, 2, 1))["gamma"] == pytest.approx(N / 2 + N / 2 + N)
    assert coef(terms("all_reduce", "mpi", 1024, 2, 2, 1))["gamma"] == pytest.approx(2 * 1024)  # recursive doubling


def test_gloo_reduce_scatter_is_an_all_reduce_of_a_copy():
    gloo = terms("reduce_scatter", "vendor", N, 2, 2, 1, vendor_library="gloo")
    ring = terms("all_reduce", "vendor", N, 2, 2, 1)
    assert_terms(gloo, {**coef(ring), "copy": N + N / 4})
    # NCCL: a ring whose reductions overlap its transfers (no gamma term)
    assert set(coef(terms("reduce_scatter", "vendor", N, 2, 2, 1))) == {"overhead", "alpha_vendor_step",
                                                                         "link_latency", "beta_vendor_inter"}


def test_contention():
    assert costs.contention(8, 2) == 4 and costs.contention(3, 2) == 1.5
    assert costs.contention(1, 2) == 1 and costs.contention(64, 0) == 1  # never below 1; 0: a core a rank


@pytest.mark.parametrize("name", ["ring", "mpi", "vendor", "hier:ring", "hier-mpi:mpi", "hier:recursive_doubling"])
def test_shared_cores_stretch_the_cores_work_and_not_the_network(name):
    for nodes, local in [(2, 2), (3, 2), (4, 2), (1, 4), (4, 1)]:
        alone = terms("all_reduce", name, N, nodes, local, 1)
        shared = terms("all_reduce", name, N, nodes, local, 1, host_cores=2)
        factor = max(1, nodes * local / 2)
        for param, value in alone.coef.items():
            expected = value * factor if param in costs.HOST_PARAMS else value
            assert shared[param] == pytest.approx(expected), (name, nodes, local, param)


def test_pipelined_chunks_wait_for_the_cores_they_share():
    # Only the cores' work (no network cost): the chunks cannot overlap, the pipeline costs all of it.
    cpu_only = dataclasses.replace(TRUTH, alpha_inter=0, beta_inter=0, alpha_mpi_native=0, overhead=0,
                                   alpha_intra=0, host_cores=2)
    one = costs.pipelined_time("all_gather", N, 2, 2, cpu_only, 1)
    assert costs.pipelined_time("all_gather", N, 2, 2, cpu_only, 8) == pytest.approx(one)
    # Network only: the classic pipeline, the first chunk through every phase and the slowest phase after it.
    net_only = dataclasses.replace(TRUTH, beta_intra=0, gamma=0, copy=0, overhead=0, alpha_intra=0)
    phases = [c.time(net_only) for _, c in costs.hierarchical_phases("all_gather", "pipelined", N / 8, 2, 2, 2, "mpi")]
    assert costs.pipelined_time("all_gather", N, 2, 2, net_only, 8) == pytest.approx(sum(phases) + 7 * max(phases))


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "all_reduce", "all_to_all"])
def test_model_limits_one_node_one_rank_a_node_odd_node_counts(collective):
    shared = dataclasses.replace(TRUTH, nics_per_node=1, host_cores=2, vendor_library="gloo")
    for nodes, local in [(1, 1), (1, 4), (4, 1), (3, 2), (5, 2), (6, 3)]:
        for name in algorithms(collective):
            t = predict(collective, name, N, nodes, local, shared)
            assert math.isfinite(t) and t > 0, (name, nodes, local)
            if nodes == 1 and not name.endswith("pipelined"):
                off_node = {"alpha_inter", "beta_inter", "alpha_vendor_step", "beta_vendor_inter"}
                assert not off_node & set(coef(terms(collective, name, N, 1, local, 1))), name
    # One rank a node: the two-level algorithm's intra phases move nothing.
    assert "beta_intra" not in coef(terms(collective, "hier-mpi:ring" if collective != "all_to_all"
                                          else "hier-mpi:pairwise", N, 4, 1, 1))


# ---- hierarchical -------------------------------------------------------------------------------------

def test_hierarchical_closed_forms():
    # 4 nodes x 2 ranks, 1 NIC: the inter phase moves n/2 with 2 ranks on the NIC.
    inter = {"alpha_inter": 3, "beta_inter": 3 / 4 * N / 2 * 2}
    ag_intra = {"alpha_vendor_intra": 1, "beta_vendor_intra": N / 2}
    assert_terms(terms("all_gather", "hier:ring", N, 4, 2, 1), {"overhead": 1, **inter, **ag_intra, "copy": N})
    assert_terms(terms("reduce_scatter", "hier:ring", N, 4, 2, 1),
                 {"overhead": 1, "copy": N, **ag_intra, **inter, "gamma": 3 / 4 * N / 2})  # intra: vendor ring
    ar = terms("all_reduce", "hier:rabenseifner", N, 4, 2, 1)
    assert_terms(ar, {"overhead": 1, "alpha_vendor_intra": 2, "beta_vendor_intra": N,
                      "alpha_inter": 4, "beta_inter": 2 * 3 / 4 * N / 2 * 2, "gamma": 3 / 4 * N / 2})


# Hand-computed from the module's formulas (costs.py docstring; hierarchical_phases): n = N bytes, N_n nodes,
# L ranks per node, k NICs. Inter phase among the N_n local-rank peers on n/L bytes, its bytes times the
# NIC share max(1, L/k) (gamma is not); intra phases a vendor ring on n bytes among L, its reductions hidden
# behind its transfers (no gamma); AG unpacks and RS packs n bytes (copy). Each value below is written out, not summed by the code under test.
HIER_CASES = [
    # all-gather hier:ring, 3 nodes x 4, 2 NICs (share 2): inter ring 2 steps of (2/3)(N/4)*2 = N/3 bytes,
    # intra ring 3 steps, 3/4 N; unpack N.
    ("all_gather", "hier:ring", 3, 4, 2,
     {"alpha_inter": 2, "beta_inter": N / 3, "alpha_vendor_intra": 3, "beta_vendor_intra": 0.75 * N, "copy": N}),
    # reduce-scatter hier:ring, same layout: pack N; intra RS ring 3 steps, 3/4 N bytes (reductions overlapped);
    # inter RS ring on N/4: 2 steps, N/3 bytes (share 2), (2/3)(N/4) = N/6 reduced.
    ("reduce_scatter", "hier:ring", 3, 4, 2,
     {"copy": N, "alpha_vendor_intra": 3, "beta_vendor_intra": 0.75 * N, "alpha_inter": 2, "beta_inter": N / 3,
      "gamma": N / 6}),
    # all-reduce hier:ring, same layout: intra RS + intra AG (6 steps, 1.5 N), inter ring AR on N/4:
    # 4 steps, 2 (2/3)(N/4) 2 = 2N/3 bytes, N/6 reduced; the intra RS's reductions overlapped.
    ("all_reduce", "hier:ring", 3, 4, 2,
     {"alpha_vendor_intra": 6, "beta_vendor_intra": 1.5 * N, "alpha_inter": 4, "beta_inter": 2 * N / 3,
      "gamma": N / 6}),
    # all-reduce hier:recursive_doubling, 4 nodes x 2, 2 NICs (share 1): intra RS/AG ring of 2 (1 step each,
    # N/2 bytes each, the reduction overlapped); inter recursive doubling on N/2 among 4: lg 4 = 2 steps of
    # N/2 bytes, N/2 reduced per step.
    ("all_reduce", "hier:recursive_doubling", 4, 2, 2,
     {"alpha_vendor_intra": 2, "beta_vendor_intra": N, "alpha_inter": 2, "beta_inter": N, "gamma": N}),
    # all-gather hier:recursive_doubling, 3 nodes x 2, 1 NIC (share 2), a fold (q = 2): inter lg 2 + 2 = 3
    # steps, bytes ((q-1)/q n' + n'/3 + n') * 2 with n' = N/2; intra ring of 2: 1 step, N/2; unpack N.
    ("all_gather", "hier:recursive_doubling", 3, 2, 1,
     {"alpha_inter": 3, "beta_inter": (0.5 * N / 2 + N / 6 + N / 2) * 2, "alpha_vendor_intra": 1,
      "beta_vendor_intra": N / 2, "copy": N}),
    # One node of 4: the inter phase has one peer and costs nothing; what is left is the intra ring and
    # the unpack / pack.
    ("all_gather", "hier:ring", 1, 4, 4, {"alpha_vendor_intra": 3, "beta_vendor_intra": 0.75 * N, "copy": N}),
    ("reduce_scatter", "hier:ring", 1, 4, 4,
     {"copy": N, "alpha_vendor_intra": 3, "beta_vendor_intra": 0.75 * N}),
    # One rank per node: the intra phases cost nothing; the inter ring moves the whole buffer.
    ("all_reduce", "hier:ring", 4, 1, 1,
     {"alpha_inter": 6, "beta_inter": 1.5 * N, "gamma": 0.75 * N}),
]


@pytest.mark.parametrize("collective,name,nodes,local,nics,expected", HIER_CASES,
                         ids=[f"{c}-{a}-{n}x{l}-k{k}" for c, a, n, l, k, _ in HIER_CASES])
def test_hierarchical_terms_match_hand_computed_values(collective, name, nodes, local, nics, expected):
    assert_terms(terms(collective, name, N, nodes, local, nics), {"overhead": 1.0, **expected})


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "all_reduce"])
def test_hierarchical_phases_run_in_order(collective):
    """AG: inter, intra AG, unpack; RS: pack, intra RS, inter; AR: intra RS, inter, intra AG."""
    labels = [label for label, _ in costs.hierarchical_phases(collective, "ring", N, 3, 4, 2)]
    assert labels == {"all_gather": ["inter ring", "intra vendor all_gather", "unpack"],
                      "reduce_scatter": ["pack", "intra vendor reduce_scatter", "inter ring"],
                      "all_reduce": ["intra vendor reduce_scatter", "inter ring", "intra vendor all_gather"]}[collective]
    # Fewer NICs than ranks: only the inter phase's bytes grow, by L / nics.
    one, four = (terms(collective, "hier:ring", N, 4, 8, k) for k in (8, 2))
    assert four["beta_inter"] == pytest.approx(4 * one["beta_inter"])
    assert four["beta_vendor_intra"] == one["beta_vendor_intra"]


# ---- all-to-all ---------------------------------------------------------------------------------------

# Hand-computed (costs.py docstring): n = N bytes is one rank's send buffer, p = nodes x L blocks of N/p. A flat
# step k (rank r sends to r + k) costs one far-link message as soon as any pair crosses nodes, its bytes times
# max(1, c / nics) where c of the node's L ranks cross at that step; pairwise copies its own block. The
# hierarchy: pack (copy N), intra all-to-all among L (blocks N/L), regroup (copy N), inter all-to-all among the
# nodes (blocks N/nodes, bytes times the NIC share max(1, L/nics)); one rank a node: the inter phase alone.
A2A_CASES = [
    # 2 nodes x 2, 1 NIC: steps k = 1, 2, 3 cross with 1, 2, 1 ranks of a node: bytes N/4 x (1 + 2 + 1) = N,
    # which is what the node must send off it (L (nodes-1)/nodes N = N) through its one NIC.
    ("pairwise", 2, 2, 1, {"alpha_inter": 3, "beta_inter": N, "copy": N / 4}),
    # the same with a NIC per rank: every step one block at one NIC's speed (the on-node pair of steps 1 and 3
    # waits for the crossing one).
    ("pairwise", 2, 2, 2, {"alpha_inter": 3, "beta_inter": 3 * N / 4, "copy": N / 4}),
    # pccl's mpi is MPI_Alltoallv: MPICH runs it as scattered, priced as pairwise with MPI's own latency.
    ("mpi", 2, 2, 2, {"alpha_mpi_native": 3, "beta_inter": 3 * N / 4, "copy": N / 4}),
    # the vendor library: the node's aggregate bandwidth shared by the crossing ranks' streams (1, 2, 1).
    ("vendor", 2, 2, 2, {"alpha_vendor_step": 3, "beta_vendor_inter": N, "copy": N / 4}),
    # 3 nodes x 2, 1 NIC: steps 1..5 cross with 1, 2, 2, 2, 1 ranks: N/6 x 8 = 4N/3 (= L (3-1)/3 N).
    ("pairwise", 3, 2, 1, {"alpha_inter": 5, "beta_inter": 4 * N / 3, "copy": N / 6}),
    # hier:pairwise, 2 x 2, 1 NIC: pack N; intra vendor pairwise of 2 (1 step, N/2, own N/2 copied); regroup N;
    # inter pairwise of 2 nodes (1 step of N/2, two ranks on the NIC: N; own N/2 copied).
    ("hier:pairwise", 2, 2, 1, {"alpha_vendor_intra": 1, "beta_vendor_intra": N / 2, "alpha_inter": 1,
                                "beta_inter": N, "copy": 3 * N}),
    # hier-mpi:mpi, 2 x 2, 2 NICs: MPI (Alltoallv, pairwise) on both levels; NIC share 1.
    ("hier-mpi:mpi", 2, 2, 2, {"alpha_mpi_native": 2, "beta_intra": N / 2, "beta_inter": N / 2, "copy": 3 * N}),
    # hier:pairwise, 3 x 2, 1 NIC: intra as above; inter 2 steps of N/3 with share 2: 4N/3; copies
    # N + N/2 + N + N/3.
    ("hier:pairwise", 3, 2, 1, {"alpha_vendor_intra": 1, "beta_vendor_intra": N / 2, "alpha_inter": 2,
                                "beta_inter": 4 * N / 3, "copy": 17 * N / 6}),
    # One node of 4: flat pairwise stays on the node; the hierarchy adds pack, regroup and the one-peer inter
    # phase's copy of the whole buffer.
    ("pairwise", 1, 4, 4, {"alpha_intra": 3, "beta_intra": 3 * N / 4, "copy": N / 4}),
    ("hier:pairwise", 1, 4, 4, {"alpha_vendor_intra": 3, "beta_vendor_intra": 3 * N / 4, "copy": 3.25 * N}),
    # One rank a node: the hierarchy is its inter phase, the flat schedule among the nodes.
    ("hier:pairwise", 4, 1, 1, {"alpha_inter": 3, "beta_inter": 3 * N / 4, "copy": N / 4}),
    ("pairwise", 4, 1, 1, {"alpha_inter": 3, "beta_inter": 3 * N / 4, "copy": N / 4}),
]


@pytest.mark.parametrize("name,nodes,local,nics,expected", A2A_CASES,
                         ids=[f"{a}-{n}x{l}-k{k}" for a, n, l, k, _ in A2A_CASES])
def test_all_to_all_terms_match_hand_computed_values(name, nodes, local, nics, expected):
    assert_terms(terms("all_to_all", name, N, nodes, local, nics), {"overhead": 1.0, **expected})


def test_all_to_all_hierarchical_phases_run_in_order():
    labels = [label for label, _ in costs.hierarchical_phases("all_to_all", "pairwise", N, 3, 4, 2)]
    assert labels == ["pack", "intra vendor all_to_all", "regroup", "inter pairwise"]
    labels = [label for label, _ in costs.hierarchical_phases("all_to_all", "mpi", N, 3, 4, 2, "mpi")]
    assert labels == ["pack", "intra mpi all_to_all", "regroup", "inter mpi"]
    assert [label for label, _ in costs.hierarchical_phases("all_to_all", "mpi", N, 3, 1, 1)] == ["inter mpi"]


def test_all_to_all_mpich_choice_and_bruck():
    # MPICH 5.0's built-in selection for MPI_Alltoall: Bruck from 8 ranks with blocks of at most 256 bytes.
    assert costs.mpich_all_to_all(256, 8, vector=False) == "bruck"
    assert costs.mpich_all_to_all(257, 8, vector=False) == "scattered"
    assert costs.mpich_all_to_all(64 << 10, 8, vector=False) == "pairwise"
    assert costs.mpich_all_to_all(4, 7, vector=False) == "scattered"
    assert costs.mpich_all_to_all(4, 64, vector=True) == "scattered"  # MPI_Alltoallv: always scattered
    assert costs.mpich_all_to_all(4, 64) == ("scattered" if heuristic.MPI_A2A_VECTOR else "bruck")  # equal blocks
    # Bruck on one node of 8: 3 steps (distances 1, 2, 4), each carrying the 4 blocks of 1..7 with that bit
    # set (N/2); rotations in and out (2N) and each step's pack and unpack (2 x N/2).
    assert_terms(costs.a2a_bruck(costs.mpi_intra_net(8).native(), N),
                 {"alpha_mpi_native": 3, "beta_intra": 1.5 * N, "copy": 2 * N + 3 * N})
    # 2 nodes x 4 with 1 NIC (share 4): distances 1 and 2 cross with 1 and 2 ranks, 4 with all 4.
    bruck = costs.a2a_bruck(costs.flat_net(2, 4, 1), N)
    assert_terms(bruck, {"alpha_inter": 3, "beta_inter": N / 2 * (1 + 2 + 4), "copy": 5 * N})


def _slow_network(profile: MachineProfile) -> MachineProfile:
    """``profile`` behind a slow network: 50 us and 1 GB/s between nodes."""
    return profile.with_inter_link(50e-6, 1e-9)


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_all_to_all_hierarchy_wins_between_nodes_on_a_slow_link(nodes):
    # Perlmutter's layout, 4 ranks and 4 NICs a node: flat steps wait for their crossing pair, (p-1)/p N at one
    # NIC's speed; the hierarchy moves (nodes-1)/nodes N between nodes, in nodes-1 messages, not p-1.
    # Small calls: against the flat schedule that steps in turn; the scattered ones (MPI's, the vendor's) post every
    # message at once and pay the wire's latency once, as the hierarchy does.
    slow = _slow_network(load("perlmutter"))
    for nbytes, flats in ((64 << 10, ("pairwise",)), (64 << 20, ("pairwise", "mpi", "vendor"))):
        hier = predict("all_to_all", "hier:pairwise", nbytes, nodes, 4, slow)
        for flat in flats:
            assert hier < predict("all_to_all", flat, nbytes, nodes, 4, slow), (flat, nbytes)
    assert costs.best("all_to_all", 64 << 20, nodes, 4, slow)[0].startswith("hier")


def test_all_to_all_hierarchy_does_not_pay_on_one_node():
    slow = _slow_network(load("perlmutter"))
    for nbytes in (64 << 10, 64 << 20):
        # the same intra-node library, plus the pack, the regroup and the one-peer copy
        assert predict("all_to_all", "hier-mpi:pairwise", nbytes, 1, 4, slow) > predict(
            "all_to_all", "pairwise", nbytes, 1, 4, slow)
        assert predict("all_to_all", "hier:pairwise", nbytes, 1, 4, slow) > predict(
            "all_to_all", "vendor", nbytes, 1, 4, slow)
        assert not costs.best("all_to_all", nbytes, 1, 4, slow)[0].startswith("hier")


def test_hier_mpi_uses_native_latency_between_nodes():
    t = coef(terms("all_reduce", "hier:mpi", N, 4, 2, 2))
    assert t["alpha_mpi_native"] > 0 and "alpha_inter" not in t and t["beta_inter"] > 0


@pytest.mark.parametrize("name,vendor,intra", [
    ("hier:ring", "gloo", "mpi"), ("hier:ring", "nccl", "vendor"), ("hier:ring", "rccl", "vendor"),
    ("hier-gloo:ring", "gloo", "vendor"), ("hier-mpi:ring", "nccl", "mpi"), ("hier:pipelined", "nccl", "mpi"),
])
def test_hier_runs_the_devices_default_library_inside_the_node(name, vendor, intra):
    """Plain ``hier:`` is MPI inside the node on a CPU machine (vendor gloo), as Communicator.intra runs it."""
    assert costs.split_hierarchical(name, vendor) == (intra, name.partition(":")[2])
    assert costs.split_hierarchical("ring", vendor) is None
    if name == "hier:ring":
        forced = "hier-mpi:ring" if intra == "mpi" else f"hier-{vendor}:ring"
        if forced in algorithms("all_reduce"):
            assert terms("all_reduce", name, N, 3, 2, 1, vendor_library=vendor) == \
                terms("all_reduce", forced, N, 3, 2, 1, vendor_library=vendor)


# ---- names and errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("collective", list(costs.FAMILY))
def test_names_match_pccl(collective):
    assert algorithms(collective) == pccl_torch.algorithms(collective)


def test_unknown_names_list_valid_ones():
    with pytest.raises(ValueError, match=r"valid: ring, recursive_doubling, bruck, mpi, vendor, hier:ring"):
        terms("all_gather", "tree", N, 2, 2, 1)
    with pytest.raises(ValueError, match="valid: .*hier:pairwise"):
        terms("reduce_scatter", "hier:vendor", N, 2, 2, 1)
    with pytest.raises(ValueError, match="valid: all_gather, reduce_scatter, all_reduce"):
        algorithms("broadcast")
    with pytest.raises(ValueError, match="available: .*frontier.*perlmutter"):
        load("summit")


# ---- fit ----------------------------------------------------------------------------------------------

TRUTH = MachineProfile(
    name="truth", ranks_per_node=2, nics_per_node=2,
    alpha_intra=3e-6, beta_intra=1 / 20e9, alpha_inter=12e-6, beta_inter=1 / 5e9,
    alpha_vendor_intra=40e-6, beta_vendor_intra=1 / 8e9, alpha_vendor_step=90e-6, beta_vendor_inter=1 / 10e9,
    alpha_mpi_native=6e-6, gamma=1 / 3e9, copy=1 / 6e9, overhead=30e-6,
)


def synthetic_rows(profile: MachineProfile, noise: float = 0.0, seed: int = 0,
                   layouts=((1, 2), (2, 2), (3, 2), (4, 2), (4, 1))) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for collective in costs.FAMILY:
        for name in algorithms(collective):
            backend, algorithm = {"vendor": (profile.vendor_library, "native"),
                                  "mpi": ("mpi", "native")}.get(name, ("pccl", name))
            for nbytes in (4 << 10, 64 << 10, 1 << 20, 16 << 20):
                for nodes, local in layouts:
                    t = predict_as_run(collective, name, nbytes, nodes, local, profile) * \
                        (1 + noise * rng.standard_normal())
                    rows.append({"collective": collective, "backend": backend, "algorithm": algorithm,
                                 "size_bytes": nbytes, "count": nbytes // 4, "dtype": "float32",
                                 "time_us": t * 1e6, "algbw_gbps": 0.0, "busbw_gbps": 0.0, "wrong": 0,
                                 "ranks": nodes * local, "local_size": local, "nodes": nodes,
                                 "hostname": "synthetic", "versions": {}})
    return rows


def test_fit_recovers_exact_parameters():
    profile, rep = fit(synthetic_rows(TRUTH), name="local")
    assert (profile.name, profile.ranks_per_node, profile.nics_per_node) == ("local", 2, 2)
    for p in PARAMS:
        assert getattr(profile, p) == pytest.approx(getattr(TRUTH, p), rel=1e-6), p
    assert rep.max < 1e-6 and rep.kept == () and set(rep.fitted) == set(PARAMS)
    assert {(e.collective, e.algorithm) for e in rep.per_algorithm} == {
        (c, a) for c in costs.FAMILY for a in algorithms(c) if not a.endswith(":pipelined")}
    assert profile.chunk_overhead == 0.0 and "pipelined pccl-bench rows" in profile.sources["chunk_overhead"]


def test_fit_prices_pipelined_rows_in_their_recorded_chunks():
    """A pipelined row that records its chunk count (pccl-bench's ``chunks``) is fitted in those chunks: rows made
    with 8 chunks give back the overhead they were made with, where the 1 MiB rule would price other counts."""
    testbed = dataclasses.replace(TRUTH, nics_per_node=1, host_cores=2, vendor_library="gloo",
                                  beta_vendor_inter=TRUTH.beta_inter, chunk_overhead=150e-6)
    rows = synthetic_rows(testbed, layouts=((2, 2), (3, 2)))
    piped = [r for r in rows if r["algorithm"].endswith(":pipelined")]
    assert piped
    for r in piped:
        r["chunks"] = 8
        r["time_us"] = costs.pipelined_time(r["collective"], r["size_bytes"], r["nodes"], r["local_size"], testbed,
                                            8) * 1e6
    assert [s.chunks for s in samples(rows, pipelined=True)] == [8] * len(piped)
    profile, _ = fit(rows, nics_per_node=1, host_cores=2, vendor_library="gloo")
    assert profile.chunk_overhead == pytest.approx(150e-6, abs=1e-9)


def test_fit_recovers_the_chunk_overhead_of_pipelined_rows():
    """Pipelined rows (priced in the chunks pccl ran: 1 MiB) fit ``chunk_overhead`` after the linear parameters;
    it grows a pipelined call by chunks x phases x overhead x the cores' contention, and survives YAML."""
    testbed = dataclasses.replace(TRUTH, nics_per_node=1, host_cores=2, vendor_library="gloo",
                                  beta_vendor_inter=TRUTH.beta_inter, chunk_overhead=150e-6)
    profile, _ = fit(synthetic_rows(testbed, layouts=((2, 2), (3, 2))), nics_per_node=1, host_cores=2,
                     vendor_library="gloo")
    assert profile.chunk_overhead == pytest.approx(150e-6, abs=1e-9)
    plain = dataclasses.replace(testbed, chunk_overhead=0.0)
    grown = costs.pipelined_time("all_gather", 16 << 20, 4, 2, testbed, 16) - \
        costs.pipelined_time("all_gather", 16 << 20, 4, 2, plain, 16)
    assert grown == pytest.approx(16 * 3 * 150e-6 * 4)  # 16 chunks x 3 phases x 150 us x 8 ranks / 2 cores
    assert predict_as_run("all_gather", "hier:pipelined", 16 << 20, 4, 2, testbed) == \
        costs.pipelined_time("all_gather", 16 << 20, 4, 2, testbed, pipeline_chunks("all_gather", 16 << 20, 4, 2, None))
    again = MachineProfile.from_dict(profile.to_dict())
    assert again.chunk_overhead == pytest.approx(150e-6) and again.sources["chunk_overhead"].startswith("fitted")
    assert MachineProfile.from_dict({k: v for k, v in profile.to_dict().items()
                                     if k not in ("chunk_overhead_us", "sources")}).chunk_overhead == 0.0
    with pytest.raises(ValueError, match="chunk_overhead must be a finite number >= 0"):
        dataclasses.replace(TRUTH, chunk_overhead=-1e-6)


def test_fit_with_noise_predicts_within_noise():
    profile, rep = fit(synthetic_rows(TRUTH, noise=0.05, seed=1))
    assert 0.01 < rep.median < 0.06  # the fit cannot explain the noise, and explains everything else
    clean = samples(synthetic_rows(TRUTH))
    assert report(clean, profile).median < 0.03
    for p in ("alpha_inter", "beta_inter", "alpha_vendor_step", "beta_vendor_inter", "overhead"):
        assert getattr(profile, p) == pytest.approx(getattr(TRUTH, p), rel=0.25), p


def test_fit_keeps_base_values_nothing_depends_on():
    base = dataclasses.replace(TRUTH, name="base", alpha_inter=1e-3, beta_inter=1e-9, alpha_vendor_step=2e-3)
    profile, rep = fit(synthetic_rows(TRUTH, layouts=((1, 2),)), base)
    assert set(rep.kept) == {"alpha_inter", "beta_inter", "alpha_vendor_step", "beta_vendor_inter"}
    assert (profile.alpha_inter, profile.alpha_vendor_step) == (1e-3, 2e-3)
    assert profile.sources["alpha_inter"] == "no row depends on it: kept from base"
    assert profile.alpha_intra == pytest.approx(TRUTH.alpha_intra, rel=1e-6)
    assert "kept (no row depends on them): alpha_inter" in format_report(rep)


def test_fit_row_selection_and_report():
    rows = synthetic_rows(TRUTH, layouts=((2, 2),))
    rows.append({**rows[0], "backend": "nothing", "time_us": 1.0})  # ignored: not a known backend
    rows.append({**rows[0], "wrong": 3, "time_us": 1.0})  # ignored: wrong results
    rows.append({**rows[0], "compression": "int8", "time_us": 1.0})  # ignored: the wire format is not priced
    used = samples(rows)
    pipelined = sum(r["algorithm"].endswith(":pipelined") for r in rows)
    assert pipelined and len(used) == len(rows) - 3 - pipelined  # pipelined rows are not linear: not fitted
    assert all(s.seconds != 1e-6 for s in used)
    assert {s.algorithm for s in used if s.collective == "all_gather"} >= {"vendor", "mpi", "hier:bruck"}
    slow = [dataclasses.replace(s, seconds=s.seconds * 1.25) for s in used]
    rep = report(slow, TRUTH)
    assert rep.median == pytest.approx(0.2) and rep.max == pytest.approx(0.2)
    table = format_report(rep)
    assert re.search(r"all_reduce\s+hier:rabenseifner\s+4\s+20\.0%\s+20\.0%", table)
    assert re.search(r"overall\s+\d+\s+20\.0%\s+20\.0%", table)
    with pytest.raises(ValueError, match="no usable rows"):
        fit([{**rows[0], "backend": "nothing"}])


def test_fit_shared_cores_one_link_and_gloo_recovers_every_parameter():
    # The testbed's shape: one NIC a node, every rank on 2 cores, gloo as the baseline; the vendor ring crosses
    # the same links as MPI (tied), so one bandwidth serves both.
    testbed = dataclasses.replace(TRUTH, nics_per_node=1, host_cores=2, vendor_library="gloo",
                                  beta_vendor_inter=TRUTH.beta_inter)
    rows = synthetic_rows(testbed, layouts=((1, 2), (2, 2), (3, 2), (4, 2)))
    profile, rep = fit(rows, nics_per_node=1, host_cores=2, vendor_library="gloo")
    assert (profile.nics_per_node, profile.host_cores, profile.vendor_library) == (1, 2, "gloo")
    for p in PARAMS:
        assert getattr(profile, p) == pytest.approx(getattr(testbed, p), rel=1e-6), p
    assert rep.max < 1e-6 and profile.sources["beta_vendor_inter"].startswith("beta_inter / nics_per_node")
    # Fitted without the shared cores, the same rows cannot be explained.
    assert fit(rows, nics_per_node=1, vendor_library="gloo")[1].max > 0.05


def test_fit_takes_the_vendor_library_the_rows_measured():
    """Without --vendor-library or a base profile, gloo rows make a gloo (CPU) profile, whose hier: runs MPI inside
    the node; given or based, the library is as given; rows of two vendor libraries name none (NCCL)."""
    testbed = dataclasses.replace(TRUTH, nics_per_node=1, host_cores=2, vendor_library="gloo",
                                  beta_vendor_inter=TRUTH.beta_inter)
    rows = synthetic_rows(testbed, layouts=((2, 2), (3, 2)))
    assert measured_vendor_library(rows) == "gloo"
    profile, rep = fit(rows, nics_per_node=1, host_cores=2)
    assert profile.vendor_library == "gloo" and rep.max < 1e-6
    assert fit(rows, nics_per_node=1, host_cores=2, vendor_library="nccl")[0].vendor_library == "nccl"
    assert fit(rows, base=TRUTH)[0].vendor_library == "nccl"
    assert measured_vendor_library(rows + [{**rows[0], "backend": "nccl"}]) is None
    assert measured_vendor_library([r for r in rows if r["backend"] == "pccl"]) is None


def test_fit_untied_links_recover_a_vendor_bandwidth_of_its_own():
    own = dataclasses.replace(TRUTH, beta_vendor_inter=1 / 4e9)  # not beta_inter / nics_per_node
    rows = synthetic_rows(own)
    untied, rep = fit(rows, tie_links=False)
    assert untied.beta_vendor_inter == pytest.approx(own.beta_vendor_inter, rel=1e-6) and rep.max < 1e-6
    tied = fit(rows)[0]
    assert tied.beta_vendor_inter == pytest.approx(tied.beta_inter / tied.nics_per_node)


# ---- profiles -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["frontier", "perlmutter"])
def test_profiles_load_and_cite_every_number(name):
    profile = load(name)
    assert profile.nics_per_node == 4 and profile.ranks_per_node == {"frontier": 8, "perlmutter": 4}[name]
    text = (MACHINES / f"{name}.yaml").read_text()
    for line in text.splitlines():
        if re.match(r"^\w+:\s*[\d.]+", line):
            assert "#" in line and len(line.split("#", 1)[1].strip()) > 10, line
    data = yaml.safe_load(text)
    assert set(data["sources"]) == set(data) - {"name", "sources"}


def test_profile_round_trip(tmp_path):
    profile = load("frontier")
    again = load(profile.save(tmp_path / "copy.yaml"))
    for f in dataclasses.fields(MachineProfile):
        value = getattr(profile, f.name)
        assert getattr(again, f.name) == (pytest.approx(value, rel=1e-12) if isinstance(value, float) else value)
    zero = dataclasses.replace(profile, beta_intra=0.0)  # free bandwidth: .inf in YAML
    assert load(zero.save(tmp_path / "zero.yaml")).beta_intra == 0.0


def test_profile_topology_keys(tmp_path):
    data = load("frontier").to_dict()
    assert (data["host_cores"], data["vendor_library"]) == (0, "nccl")
    del data["host_cores"], data["vendor_library"]
    assert MachineProfile.from_dict(data).host_cores == 0  # optional: a machine's own cores, NCCL
    shared = dataclasses.replace(TRUTH, host_cores=2, vendor_library="gloo")
    again = load(shared.save(tmp_path / "tb.yaml"))
    assert (again.host_cores, again.vendor_library) == (2, "gloo")
    with pytest.raises(ValueError, match="host_cores must be an integer of at least 0"):
        MachineProfile.from_dict({**data, "host_cores": -1})
    with pytest.raises(ValueError, match="vendor_library must be one of nccl, rccl, gloo, got 'mpich'"):
        MachineProfile.from_dict({**data, "vendor_library": "mpich"})


def test_profile_lookup_in_machines_dir(tmp_path, monkeypatch):
    dataclasses.replace(TRUTH, name="mini").save(tmp_path / "mini.yaml")
    monkeypatch.setenv(machine.MACHINES_DIR_ENV, str(tmp_path))
    assert load("mini").alpha_inter == pytest.approx(TRUTH.alpha_inter)
    assert {"mini", "frontier"} <= set(machine.available())


def test_profile_validation(tmp_path):
    good = TRUTH.to_dict()
    with pytest.raises(ValueError, match="alpha_inter must be a finite number >= 0"):
        dataclasses.replace(TRUTH, alpha_inter=-1.0)
    with pytest.raises(ValueError, match="ranks_per_node must be an integer of at least 1"):
        dataclasses.replace(TRUTH, ranks_per_node=0)
    with pytest.raises(TypeError, match="unexpected argument 'alpha_typo_us'"):
        MachineProfile.from_dict({**good, "alpha_typo_us": 1.0})
    with pytest.raises(ValueError, match="lacks 'bw_inter_GBps'"):
        MachineProfile.from_dict({k: v for k, v in good.items() if k != "bw_inter_GBps"})
    with pytest.raises(ValueError, match="bw_intra_GBps must be a bandwidth > 0"):
        MachineProfile.from_dict({**good, "bw_intra_GBps": 0})
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**good, "nics_per_node": 0}))
    with pytest.raises(ValueError, match=r"bad\.yaml: nics_per_node"):
        load(bad)


# ---- sweep and CLI ------------------------------------------------------------------------------------

def test_parse_gpus():
    assert parse_gpus("8..4096") == [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    assert parse_gpus("6..20") == [8, 16]
    assert parse_gpus("8,96") == [8, 96]


def test_frontier_sweep_hierarchical_wins_at_scale():
    gpus = parse_gpus("8..2048")
    points = sweep(load("frontier"), gpus, [64 << 20], ["reduce_scatter", "all_gather"])
    for collective in ("reduce_scatter", "all_gather"):
        speedups = [p.speedup for p in points if p.collective == collective]
        assert speedups[-1] > 10, (collective, speedups)
        assert all(a < b for a, b in zip(speedups, speedups[1:])), (collective, speedups)


def test_frontier_sweep_all_to_all():
    points = sweep(load("frontier"), parse_gpus("8..2048"), [1 << 20, 64 << 20], ["all_to_all"])
    assert len(points) == 2 * 9 and {p.collective for p in points} == {"all_to_all"}
    for nbytes in (1 << 20, 64 << 20):
        speedups = [p.speedup for p in points if p.nbytes == nbytes]
        assert all(a < b for a, b in zip(speedups[1:], speedups[2:])), speedups  # growing from 2 nodes on
        assert speedups[-1] > 2, speedups
    assert all(p.hier_algorithm in algorithms("all_to_all") for p in points)


def test_default_sweep_covers_every_collective_and_keeps_the_others_unchanged():
    frontier = load("frontier")
    everything = sweep(frontier, [64], [16 << 20])
    three = sweep(frontier, [64], [16 << 20], ["all_gather", "reduce_scatter", "all_reduce"])
    assert [p for p in everything if p.collective != "all_to_all"] == three
    assert [p.collective for p in everything] == ["all_gather", "reduce_scatter", "all_reduce", "all_to_all"]


def test_cli(tmp_path, capsys):
    assert main(["predict", "-c", "all_reduce", "--bytes", "1M", "--gpus", "2048", "--machine", "frontier"]) == 0
    out = capsys.readouterr().out
    assert "256 nodes x 8" in out and "hier:rabenseifner" in out and "best:" in out
    assert main(["sweep", "--machine", "frontier", "--gpus", "8..64", "--sizes", "1M", "-c", "all_gather",
                 "--json", str(tmp_path / "s.json"), "--plot", str(tmp_path / "s.png")]) == 0
    assert len(json.loads((tmp_path / "s.json").read_text())) == 4 and (tmp_path / "s.png").stat().st_size > 0
    (tmp_path / "rows.json").write_text(json.dumps(synthetic_rows(TRUTH)))
    assert main(["fit", str(tmp_path / "rows.json"), "-o", str(tmp_path / "local-cpu.yaml")]) == 0
    assert "overall" in capsys.readouterr().out
    assert load(tmp_path / "local-cpu.yaml").name == "local-cpu"
    assert main(["predict", "-c", "all_gather", "--bytes", "1M", "--gpus", "12", "--machine", "frontier"]) == 2
    assert main(["sweep", "--machine", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert "unknown machine 'nowhere'" in err and "frontier" in err and "perlmutter" in err


# ---- the wire's own latency (link_latency: the testbed's added round trip, halved) ------------------------------

@pytest.mark.parametrize("collective, name, nodes, local, crossings, posted", [
    ("all_gather", "ring", 4, 1, 3, 3),                 # every ring step crosses (pccl's: posted)
    ("all_gather", "ring", 2, 2, 3, 3),                 # a ring step across a node boundary (flat, distance None)
    ("all_gather", "recursive_doubling", 4, 2, 2, 2),   # distances 1 (on the node), 2, 4 (across)
    ("all_gather", "hier:ring", 4, 2, 3, 3),            # the inter ring among 4 nodes; the vendor inside pays none
    ("all_reduce", "hier:ring", 3, 2, 4, 2),            # inter all-reduce ring: 2 (nodes - 1); its all-gather posts
    ("all_gather", "mpi", 4, 1, 3, 0),                  # MPICH's own ring pays a round trip a step
    ("all_gather", "vendor", 4, 2, 3, 0),               # the vendor ring's steps across the 4 node boundaries... p-1
    ("all_to_all", "mpi", 4, 2, 7, 0),                  # MPICH's all-to-all of 384 KiB blocks: pairwise, 7 steps
    ("all_to_all", "vendor", 4, 2, 1, 0),               # gloo's / NCCL's: every message in flight at once
    ("all_to_all", "hier:pairwise", 4, 2, 3, 0),        # the inter all-to-all among 4 nodes
])
def test_every_step_across_nodes_pays_the_wire(collective, name, nodes, local, crossings, posted):
    """Each message step between nodes pays a round trip of ``link_latency`` (a send completes when the peer
    acknowledges it), whatever library runs it: MPI's own collectives and the vendor ring; messages in flight
    together (a scattered all-to-all) pay it once. pccl's schedules that post their sends (``posted`` of the
    ``crossings``) pay one latency a step and one more at the end. Before, MPI's native collectives priced a step
    across a 10 ms link at their fitted 48 us, below one link latency."""
    got = coef(terms(collective, name, N, nodes, local, 1))
    steps = crossings if name != "vendor" or collective == "all_to_all" else nodes * local - 1
    expected = costs.WIRE_LATENCIES_PER_STEP * (steps - posted) + costs.WIRE_LATENCIES_POSTED * posted
    if posted:
        expected += costs.WIRE_LATENCIES_PER_STEP - costs.WIRE_LATENCIES_POSTED  # the last sends' acknowledgement
    assert got.get("link_latency", 0.0) == pytest.approx(expected)


def test_link_rtt_adds_half_a_round_trip_to_every_step_across_nodes():
    base = machine.load("local-cpu")
    delayed = base.with_link_rtt(0.020)
    assert delayed.link_latency == pytest.approx(0.010) and base.link_latency == 0.0
    t = terms("all_gather", "mpi", N, 4, 2, 2)
    assert t.time(delayed) - t.time(base) == pytest.approx(0.010 * coef(t)["link_latency"])
    assert t.time(delayed) > 0.010 * 3  # MPICH's all-gather across 4 nodes: at least one latency a step
    with pytest.raises(ValueError, match="round-trip"):
        base.with_link_rtt(-1.0)


def test_a_measured_inter_link_keeps_pccls_step_and_gives_mpi_the_wire_beyond_the_fit():
    """``with_inter_link`` (the selector's measured link): pccl's step costs the measured latency and a vendor step
    at least that, as before; MPI's native step pays what the measurement exceeds the fitted ``alpha_inter`` by."""
    base = machine.load("local-cpu")
    measured = base.with_inter_link(0.010, base.beta_inter)
    assert measured.alpha_inter + measured.link_latency == pytest.approx(0.010)
    assert measured.alpha_vendor_step + measured.link_latency == pytest.approx(max(base.alpha_vendor_step, 0.010))
    assert measured.link_latency == pytest.approx(0.010 - base.alpha_inter)
    fast = base.with_inter_link(base.alpha_inter / 2, base.beta_inter)  # below the fit: no wire beyond it
    assert fast.link_latency == 0.0 and fast.alpha_inter == pytest.approx(base.alpha_inter / 2)
