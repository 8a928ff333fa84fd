"""Link-aware selection without ranks: the link ratio, its cache, the feature, and who decides a networked call
(a profile trained on such links, else the measured rule)."""
from __future__ import annotations

import json

import pytest
import torch

from pccl_torch.selection import links
from pccl_torch.selection.links import Link, Links
from pccl_torch.selection.learned.dataset import Case, cases_from_bench
from pccl_torch.selection.learned.features import FEATURE_NAMES, feature_vector
from pccl_torch.selection.learned.runtime import Selector
from pccl_torch.selection.learned.train import train
from pccl_torch.topology import Topology

GBIT = Links(Link(20e-6, 2.5e9), Link(40e-6, 1.2e8), "measured")  # ~1 Gbit/s between nodes, shared memory inside


def test_ratio_and_round_trip() -> None:
    assert GBIT.ratio() == pytest.approx(2.5e9 / 1.2e8)
    assert links.NONE.ratio() == 1.0 and Links(Link(1e-6, 1e9), None, "measured").ratio() == 1.0
    assert Links(Link(1e-6, 1e8), Link(1e-6, 1e9), "measured").ratio() == 1.0  # a faster network: no penalty
    again = Links.from_dict(json.loads(json.dumps(GBIT.as_dict())), "cache")
    assert (again.intra, again.inter, again.source) == (GBIT.intra, GBIT.inter, "cache")


def test_the_feature_is_the_log2_ratio_to_a_tenth() -> None:
    assert FEATURE_NAMES[-1] == "log2_link_ratio"
    assert feature_vector("all_reduce", 1 << 20, 4, 2, 4)[-1] == 0.0
    assert feature_vector("all_reduce", 1 << 20, 4, 2, 4, 20.8)[-1] == pytest.approx(4.4)


def test_cache_write_read_and_a_foreign_file_is_left_alone(tmp_path) -> None:
    path = tmp_path / "links.json"
    links._write_cache(path, "key", GBIT)
    assert links._read_cache(path)["entries"]["key"]["inter"] == {"latency_s": 40e-6, "bytes_per_s": 1.2e8}
    foreign = tmp_path / "profile.json"
    foreign.write_text('{"format": "pccl-selector"}')
    links._write_cache(foreign, "key", GBIT)
    assert foreign.read_text() == '{"format": "pccl-selector"}'


def _rows(ratio: float | None, winner: str) -> list[dict]:
    """pccl-bench rows of one 4x2 layout where ``winner`` is fastest at every size."""
    rows = []
    for collective in ("all_reduce", "all_gather", "reduce_scatter"):
        for size in (1 << 16, 1 << 18, 1 << 20, 1 << 22):
            for algorithm, us in ((winner, 100.0), ("ring", 300.0)):
                rows.append({"collective": collective, "backend": "pccl", "algorithm": algorithm, "auto": False,
                             "wrong": 0, "size_bytes": size, "ranks": 4, "local_size": 2, "dtype": "float32",
                             "time_us": us * size / 65536,
                             **({"links": {"ratio": ratio}} if ratio is not None else {})})
    return rows


def test_rows_carry_their_link_ratio_and_old_rows_count_as_one_machine() -> None:
    cases = cases_from_bench(_rows(None, "mpi") + _rows(20.0, "hier:mpi"))
    assert {c.link_ratio for c in cases} == {1.0, 20.0}
    assert {c.best for c in cases if c.link_ratio == 20.0} == {"hier:mpi"}


def test_a_profile_decides_networked_calls_only_for_links_it_was_trained_on() -> None:
    pytest.importorskip("sklearn")
    topo = Topology(0, 4, 2, hosts=2)
    local_only, _, _ = train(cases_from_bench(_rows(None, "mpi")), candidates=["tree"])
    both, _, _ = train(cases_from_bench(_rows(None, "mpi") + _rows(20.0, "hier:mpi")), candidates=["tree"])
    assert not Selector(local_only).covers("all_reduce", 1 << 20, topo, 4, GBIT)
    assert Selector(local_only).covers("all_reduce", 1 << 20, topo, 4, links.NONE)
    selector = Selector(both)
    assert selector.covers("all_reduce", 1 << 20, topo, 4, GBIT)
    assert selector.choose("all_reduce", 1 << 20, topo, 4, links=GBIT) == "hier:mpi"
    assert selector.choose("all_reduce", 1 << 20, topo, 4, links=links.NONE) == "mpi"
    # Trained on one machine and on a 20x slower network: a 5x slower one lies in the gap, not covered.
    between = Links(Link(20e-6, 2.5e9), Link(40e-6, 5e8), "measured")
    assert not selector.covers("all_reduce", 1 << 20, topo, 4, between)


def test_measured_links_replace_the_cost_model_s_inter_node_parameters() -> None:
    from pccl_torch.sim.machine import load

    machine = load("local-cpu")
    behind = machine.with_inter_link(40e-6, 1 / 1.2e8)
    assert (behind.alpha_inter, behind.beta_inter, behind.beta_vendor_inter) == (40e-6, 1 / 1.2e8, 1 / 1.2e8)
    assert behind.beta_intra == machine.beta_intra


def test_case_features_include_the_ratio() -> None:
    case = Case("all_gather", 1 << 20, 4, 2, 4, 20.0, {"mpi": 1.0, "ring": 2.0})
    assert case.features()[-1] == feature_vector("all_gather", 1 << 20, 4, 2, 4, 20.0)[-1] > 4


def test_bandwidth_exchange_outlasts_the_latency() -> None:
    """Without added latency the exchange keeps its size; at 10 ms one way (a 20 ms round trip) it grows to last
    at least LATENCY_SPAN latencies at 1 Gbit/s (a 256 KiB one measured 182 Mbit/s on a 1 Gbit/s testbed link),
    within the cap."""
    from pccl_torch.selection.links import LATENCY_SPAN, MAX_BANDWIDTH_BYTES, NOMINAL_BYTES_PER_S, bandwidth_bytes

    assert bandwidth_bytes(256 * 1024, 20e-6) == 256 * 1024
    grown = bandwidth_bytes(256 * 1024, 0.010)
    assert grown >= LATENCY_SPAN * 0.010 * NOMINAL_BYTES_PER_S and grown & (grown - 1) == 0
    assert bandwidth_bytes(256 * 1024, 10.0) == MAX_BANDWIDTH_BYTES


def test_a_profile_leaves_links_slower_to_answer_than_it_was_trained_on_to_the_latency_rules() -> None:
    """Trained where the link answered in 40 us, a profile does not decide across one of 10 ms one way (RTT 20 ms)
    at the same bandwidth ratio; trained with rows measured there, it does. The range rides in the profile."""
    pytest.importorskip("sklearn")
    topo = Topology(0, 4, 2, hosts=2)
    far = Links(Link(20e-6, 2.5e9), Link(10e-3, 1.2e8), "measured")
    near_rows = _rows(20.0, "hier:mpi")
    for row in near_rows:
        row["links"]["inter"] = {"latency_s": 40e-6, "bytes_per_s": 1.2e8}
    near_only, _, _ = train(cases_from_bench(near_rows), candidates=["tree"])
    assert near_only.metadata["link_latency_s"] == [40e-6, 40e-6]
    assert Selector(near_only).covers("all_reduce", 1 << 20, topo, 4, GBIT)
    assert not Selector(near_only).covers("all_reduce", 1 << 20, topo, 4, far)
    far_rows = _rows(20.0, "hier:mpi")
    for row in far_rows:
        row["links"]["inter"] = {"latency_s": 10.2e-3, "bytes_per_s": 1.2e8}
    trained_far, _, _ = train(cases_from_bench(far_rows), candidates=["tree"])
    assert Selector(trained_far).covers("all_reduce", 1 << 20, topo, 4, far)
    old = near_only  # a profile written before the range was recorded: trained at no latency
    old.metadata.pop("link_latency_s")
    assert not Selector(old).covers("all_reduce", 1 << 20, topo, 4, far)


def test_a_cached_entry_is_rechecked_long_enough_to_see_the_bandwidth(tmp_path, monkeypatch) -> None:
    """At 10 ms one way a 64 KiB exchange is one round trip at 200 Mbit/s and at 1 Gbit/s alike: the check grows with
    the cached latency, so a testbed re-shaped from 200 Mbit/s to 1 Gbit/s (same hosts) is measured again; and a small
    exchange checks the latency, so one re-shaped from RTT 20 ms to 1 ms is too."""
    from types import SimpleNamespace

    from pccl_torch.topology import Topology as Topo

    def wire(bytes_per_s: float, latency_s: float = 10e-3):
        return lambda transport, peer, nbytes, rounds, device=None: [latency_s + nbytes / bytes_per_s] * rounds

    control = SimpleNamespace(broadcast_json=lambda value, root=0: value)
    comm = SimpleNamespace(topology=Topo(0, 4, 2, hosts=2), control=control, inter=object(), intra=object(),
                           device=torch.device("cpu"))
    path = tmp_path / "links.json"
    links._write_cache(path, "key", Links(Link(2e-5, 3e9), Link(10e-3, 24.4e6), "measured"))  # 200 Mbit/s
    monkeypatch.setattr(links, "_exchange", wire(125e6))  # now 1 Gbit/s
    assert links._cached(comm, path, "key") is None
    monkeypatch.setattr(links, "_exchange", wire(24.4e6))  # still 200 Mbit/s
    assert links._cached(comm, path, "key").inter.bytes_per_s == 24.4e6
    # Re-shaped to RTT 1 ms at the same rate: the 8 MiB bandwidth check alone took 0.8 of its expected time.
    links._write_cache(path, "key", Links(Link(2e-5, 3e9), Link(10.2e-3, 108e6), "measured"))
    monkeypatch.setattr(links, "_exchange", wire(120e6, 0.6e-3))
    assert links._cached(comm, path, "key") is None
    # No delay either side: latencies of tens of microseconds, twice as long from run to run, keep the entry.
    links._write_cache(path, "key", Links(Link(2e-5, 3e9), Link(20e-6, 118e6), "measured"))
    monkeypatch.setattr(links, "_exchange", wire(118e6, 50e-6))
    assert links._cached(comm, path, "key") is not None
