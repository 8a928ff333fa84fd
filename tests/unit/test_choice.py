"""The API layer's choice (pccl_torch.selection.choice): order of the rules, the networked rule, device-valid names,
pipelined chunk counts, and the layering that keeps the choice out of the communicator."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pccl_torch.selection import heuristic
from pccl_torch.selection import Choice
from pccl_torch.plan import names_for, resolve, valid_names
from pccl_torch.sim import costs
from pccl_torch.sim.machine import load as load_machine
from pccl_torch.sim.pipeline import pipeline_chunks
from pccl_torch.topology import Topology

PACKAGE = Path(__file__).resolve().parents[2] / "pccl_torch"


class FakeComm(SimpleNamespace):
    """What Choice reads of a communicator: topology, device, the intra-node levels it has."""

    def intra_level(self, library):
        if library not in (None, "mpi", {"cpu": "gloo", "cuda": "nccl"}[self.device.type]):
            raise ValueError(f"intra-node library {library!r} does not serve {self.device.type} tensors")
        return object()


def comm(hosts: int, world: int = 4, local: int = 2, device: str = "cpu") -> FakeComm:
    return FakeComm(topology=Topology(0, world, local, hosts), device=torch.device(device), choice=None)


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "all_reduce"])
def test_networked_rule_flat_then_hierarchical_then_pipelined(collective) -> None:
    choice = Choice(overrides={})
    networked = comm(hosts=2)
    small = choice.plan(networked, collective, None, 4096, torch.float32)
    large = choice.plan(networked, collective, None, 64 << 20, torch.float32)
    assert small.name == "mpi"
    assert large.name == "hier:pipelined" and large.chunks == 32  # 1 MiB chunks, at most 32
    middle = heuristic.NETWORK_HIER_FROM[collective]
    assert choice.plan(networked, collective, None, middle, torch.float32).hierarchical


def test_networked_non_power_of_two_nodes_reduce_over_the_ring() -> None:
    choice = Choice(overrides={})
    three = comm(hosts=3, world=6, local=2)
    assert choice.plan(three, "all_reduce", None, 16 << 20, torch.float32).name == "hier:ring"
    assert choice.plan(three, "reduce_scatter", None, 16 << 20, torch.float32).name == "hier:ring"
    assert choice.plan(three, "all_gather", None, 16 << 20, torch.float32).name == "hier:pipelined"
    assert choice.plan(three, "all_reduce", None, 64 << 10, torch.float32).name == "hier:ring"
    assert choice.plan(three, "all_reduce", None, 4 << 10, torch.float32).name == "mpi"


def test_links_with_latency_move_the_choice_and_the_chunks() -> None:
    """The links measured at ``init()`` reach the choice: at 10 ms one way (RTT 20 ms), 107 MB/s, a latency-bound
    all-reduce runs recursive doubling between nodes, and a pipelined one is cut into chunks that each last three
    latencies between nodes (2 of a 16 MiB call, not 16); at RTT 1 ms into chunks of 2 MiB (8, not 16)."""
    from pccl_torch.selection import links

    far = Choice(overrides={}, links=links.Links(links.Link(2e-5, 3e9), links.Link(10.2e-3, 107e6), "measured"))
    networked = comm(hosts=4, world=8, local=2)
    assert far.plan(networked, "all_reduce", None, 64 << 10, torch.float32).name == "hier:recursive_doubling"
    large = far.plan(networked, "all_reduce", None, 16 << 20, torch.float32)
    assert large.name == "hier:pipelined" and large.chunks == 2
    for flat in (networked, comm(hosts=8, world=8, local=1)):  # all-to-all: gloo posts every message at once
        assert far.plan(flat, "all_to_all", None, 1 << 20, torch.float32).name == "vendor"
        assert far.plan(flat, "all_to_all", None, 256 << 10, torch.float32).name == "mpi"
        assert far.plan(flat, "all_to_all", None, 1 << 20, torch.float32, "int8").name.startswith("mpi+int8")
    # A rank a node: pccl's lg p schedules where MPICH would step around a ring, gloo for many latencies' bytes.
    spread = comm(hosts=8, world=8, local=1)
    far_links = far.links
    far = Choice(overrides={}, links=far_links)  # a Choice serves one communicator: its decisions are kept
    assert far.plan(spread, "all_gather", None, 1 << 20, torch.float32).name == "recursive_doubling"
    assert far.plan(spread, "all_gather", None, 256 << 10, torch.float32).name == "recursive_doubling"
    assert far.plan(spread, "all_reduce", None, 64 << 10, torch.float32).name == "recursive_doubling"
    assert far.plan(spread, "all_reduce", None, 16 << 20, torch.float32).name == "vendor"
    assert Choice(overrides={}, links=far_links).plan(comm(hosts=8, world=8, local=1, device="cuda"), "all_gather",
                                                      None, 1 << 20, torch.float32).name == "ring"  # CUDA: not this rule
    near = Choice(overrides={}, links=links.Links(links.Link(2e-5, 3e9), links.Link(0.72e-3, 135e6), "measured"))
    assert near.plan(spread, "all_gather", None, 1 << 20, torch.float32).name != "recursive_doubling"
    near = Choice(overrides={}, links=near.links)
    assert near.plan(networked, "all_to_all", None, 1 << 20, torch.float32).name == "mpi"
    assert near.plan(networked, "all_reduce", None, 16 << 20, torch.float32).chunks == 8
    assert near.plan(networked, "all_reduce", None, 64 << 10, torch.float32).name == "mpi"


@pytest.mark.parametrize("device, native", [("cpu", "mpi"), ("cuda", "vendor")])
@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("world, local", [(2, 2), (4, 2), (6, 3), (5, 1)])
def test_one_machine_runs_the_native_library_flat(collective, device, native, world, local) -> None:
    """Emulated nodes sharing one host's memory (and a single node) never pay for a hierarchy: every size runs
    the native library's own collective (MPI for CPU tensors, NCCL through torch.distributed for CUDA)."""
    choice = Choice(overrides={})
    one_host = comm(hosts=1, world=world, local=local, device=device)
    for nbytes in (0, 1024, 512 << 10, 4 << 20, 64 << 20):
        assert choice.plan(one_host, collective, None, nbytes, torch.float32).name == native


def test_one_chunk_of_pipeline_runs_unpipelined() -> None:
    """pccl's own choice never runs a pipeline of one chunk (nothing to overlap): its unpipelined form instead;
    a pipelined plan the user names keeps its name."""
    choice = Choice(overrides={})
    networked = comm(hosts=2)
    one_chunk = choice.plan(networked, "all_gather", None, heuristic.NETWORK_PIPELINE_FROM, torch.float32)
    assert pipeline_chunks("all_gather", heuristic.NETWORK_PIPELINE_FROM, 2, 2, None) == 1
    assert one_chunk.name == "hier:mpi" and not one_chunk.pipelined
    named = choice.plan(networked, "all_gather", "hier:pipelined", heuristic.NETWORK_PIPELINE_FROM, torch.float32)
    assert named.name == "hier:pipelined"


def test_explicit_and_pccl_algo_come_first() -> None:
    choice = Choice(overrides={"all_reduce": "ring"})
    networked = comm(hosts=2)
    assert choice.plan(networked, "all_reduce", None, 64 << 20, torch.float32).name == "ring"
    assert choice.plan(networked, "all_reduce", "hier:mpi", 64 << 20,
                       torch.float32).name == "hier:mpi"


def test_compressed_plans_pipeline_from_enough_chunks_and_only_between_nodes() -> None:
    choice = Choice(overrides={}, compression={"all_gather": "int8", "all_reduce": "lossless"})
    networked = comm(hosts=2)
    large = choice.plan(networked, "all_gather", None, 64 << 20, torch.float32)
    assert large.name == "hier:pipelined+int8" and large.chunks == 32 and large.compression == "int8"
    few = choice.plan(networked, "all_gather", None, 4 << 20, torch.float32)  # 4 chunks of 1 MiB: not worth it
    assert few.name == "hier:mpi+int8" and not few.pipelined
    named = choice.plan(networked, "all_gather", "hier:pipelined", 4 << 20, torch.float32)
    assert named.name == "hier:pipelined+int8" and named.chunks == 4
    variable = choice.plan(networked, "all_reduce", None, 64 << 20, torch.float32)  # lossless: unpipelined
    assert variable.name == "hier:mpi+lossless" and not variable.pipelined
    exact = choice.plan(networked, "reduce_scatter", None, 64 << 20, torch.float32)
    assert exact.compression is None
    one_node, choice = comm(hosts=1, world=4, local=4), Choice(overrides={}, compression={"all_gather": "int8"})
    assert choice.plan(one_node, "all_gather", None, 64 << 20, torch.float32).compression is None
    assert choice.plan(one_node, "all_gather", None, 64 << 20, torch.float32, "bf16").compression is None
    with pytest.raises(TypeError, match="'bf16' does not apply to torch.bfloat16"):  # checked on one node too
        choice.plan(one_node, "all_gather", None, 1024, torch.bfloat16, "bf16")


def test_compressed_all_reduce_across_a_network_goes_two_level() -> None:
    """A compressed all-reduce of pccl's own choice runs two-level across a network (it was 1.6-1.9x faster than the
    compressed flat one on the testbed, 256 KiB-4 MiB), however small; a named flat plan and the exact call stay
    flat; the other collectives keep their choice."""
    choice = Choice(overrides={}, compression={"all_reduce": "int8", "all_gather": "int8"})
    networked = comm(hosts=2)
    for nbytes in (4096, 256 << 10, 3 << 20):
        assert choice.plan(networked, "all_reduce", None, nbytes, torch.float32).name == "hier:mpi+int8"
        assert choice.plan(networked, "all_reduce", None, nbytes, torch.int64).name == "mpi"  # exact: flat
        assert choice.plan(networked, "all_gather", None, 4096, torch.float32).name == "mpi+int8"
    assert choice.plan(networked, "all_reduce", "mpi", 1 << 20, torch.float32).name == "mpi+int8"
    assert choice.plan(networked, "all_reduce", None, 64 << 20, torch.float32).name == "hier:pipelined+int8"
    assert Choice(overrides={"all_reduce": "ring"}, compression={"all_reduce": "int8"}).plan(
        networked, "all_reduce", None, 1 << 20, torch.float32).name == "ring+int8"
    emulated = comm(hosts=1)  # emulated nodes on one machine: nothing crosses a network, the flat choice stays
    assert Choice(overrides={}, compression={"all_reduce": "int8"}).plan(
        emulated, "all_reduce", None, 1 << 20, torch.float32).name == "mpi+int8"


def test_compressed_flat_all_to_all_runs_in_pieces_on_slow_links_only() -> None:
    """Pieces of 256 KiB of a rank's buffer where the measured inter-node link is slow (200 Mbit/s: they overlapped
    the encoding there), one piece on fast or unmeasured links; calls with split sizes cut as 1 MiB (every rank
    alike); hierarchical, exact and named-hierarchical plans are never cut."""
    from pccl_torch import api
    from pccl_torch.selection.links import Link, Links

    def choice(bytes_per_s: float | None) -> Choice:
        inter = None if bytes_per_s is None else Link(1e-4, bytes_per_s)
        return Choice(overrides={}, compression={"all_to_all": "int8"}, links=Links(Link(1e-6, 5e9), inter, "measured"))

    networked = comm(hosts=2)
    slow = choice(25e6)
    assert slow.plan(networked, "all_to_all", None, 4 << 20, torch.float32).chunks == 16
    assert slow.plan(networked, "all_to_all", None, api.UNEVEN_CHOICE_BYTES, torch.float32).chunks == 4
    assert slow.plan(networked, "all_to_all", None, 4 << 20, torch.int64).chunks == 1  # exact
    assert slow.plan(networked, "all_to_all", "hier:mpi", 4 << 20, torch.float32).chunks == 1
    for fast in (choice(119e6), choice(None)):
        assert fast.plan(networked, "all_to_all", None, 4 << 20, torch.float32).chunks == 1


def test_an_intra_library_the_device_lacks_fails_before_communication() -> None:
    choice = Choice(overrides={})
    with pytest.raises(ValueError, match="does not serve cpu tensors"):
        choice.plan(comm(hosts=2), "all_reduce", "hier-nccl:ring", 1024, torch.float32)
    with pytest.raises(ValueError, match="does not serve cuda tensors"):
        choice.plan(comm(hosts=2, device="cuda"), "all_reduce", "hier-gloo:ring", 1024, torch.float32)


def test_names_per_device_have_no_duplicates_and_no_foreign_library() -> None:
    for collective in ("all_gather", "reduce_scatter", "all_reduce"):
        cpu, cuda = names_for(collective, "cpu"), names_for(collective, "cuda")
        assert not any("nccl" in n or n.startswith("hier-mpi:") for n in cpu)
        assert not any("gloo" in n for n in cuda)
        assert set(cpu) | set(cuda) <= set(valid_names(collective))
        assert "hier:pipelined" in cpu and "hier-mpi:pipelined" in cuda
        for name in valid_names(collective):
            resolve(collective, name)  # every accepted name resolves


def test_selector_never_picks_a_name_of_another_device() -> None:
    """A profile that ranks hier-gloo:ring first (trained where gloo won): on CUDA tensors the selector
    skips it and returns the best-ranked name that runs there."""
    from pccl_torch.selection.learned.runtime import Selector

    ranking = ["hier-gloo:ring", "hier-nccl:ring", "hier:ring", "mpi"]
    profile = SimpleNamespace(metadata={}, machine_profile=None, in_range=lambda features: True,
                              rank=lambda features: ranking)
    selector = Selector(profile)  # type: ignore[arg-type]
    topo = Topology(0, 4, 2)
    assert selector.choose("all_gather", 1 << 20, topo, 4, "cpu") == "hier-gloo:ring"
    assert selector.choose("all_gather", 1 << 20, topo, 4, "cuda") == "hier:ring"


def test_pipeline_chunks(monkeypatch) -> None:
    assert pipeline_chunks("all_reduce", 1024, 2, 2, None) == 1
    assert pipeline_chunks("all_reduce", 4 << 20, 2, 2, None) == 4
    assert pipeline_chunks("all_reduce", 1 << 30, 2, 2, None) == 32
    machine = load_machine("perlmutter")
    k = pipeline_chunks("all_gather", 64 << 20, 4, 4, machine)
    times = {c: costs.pipelined_time("all_gather", 64 << 20, 4, 4, machine, c) for c in (1, 2, 4, 8, 16, 32)}
    assert times[k] == min(times.values())
    # A link of 10 ms one way at 107 MB/s: a chunk's inter-node bytes (full buffer / local size) last 3 latencies.
    assert pipeline_chunks("all_reduce", 16 << 20, 4, 2, None, inter_latency_s=10e-3, inter_bytes_per_s=107e6) == 2
    assert pipeline_chunks("all_reduce", 4 << 20, 4, 2, None, inter_latency_s=10e-3, inter_bytes_per_s=107e6) == 1
    assert pipeline_chunks("all_reduce", 16 << 20, 4, 2, None, inter_latency_s=20e-6, inter_bytes_per_s=107e6) == 16
    # RTT 1 ms (0.6 ms one way): chunks of 2 MiB or more, where the latency span alone would allow 1 MiB ones.
    assert pipeline_chunks("all_reduce", 16 << 20, 4, 2, None, inter_latency_s=0.6e-3, inter_bytes_per_s=122e6) == 8
    assert pipeline_chunks("all_gather", 4 << 20, 4, 2, None, inter_latency_s=0.6e-3, inter_bytes_per_s=122e6) == 2
    assert pipeline_chunks("all_gather", 3 << 20, 4, 2, None, inter_latency_s=0.6e-3, inter_bytes_per_s=122e6) == 1


def _imports(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_communicator_does_not_choose_and_plans_do_not_know_communicators() -> None:
    """DESIGN.md's layers: transports and topology in the communicator, the choice above it."""
    communicator = _imports(PACKAGE / "communicator.py")
    assert not any(m.startswith(("pccl_torch.selection", "pccl_torch.sim", "pccl_torch.plan")) for m in communicator)
    assert "pccl_torch.communicator" not in _imports(PACKAGE / "plan.py")


def test_selection_lives_in_one_package_behind_one_entry_point() -> None:
    """Issue 33: the per-call choice, the rules, the learned model, online tuning and the links all live in
    pccl_torch/selection/; outside it, run-time code reaches selection only through the package's entry point."""
    assert not any((PACKAGE / f"{old}.py").exists() for old in ("choice", "heuristic", "tuning", "links"))
    assert not (PACKAGE / "selector").exists()
    for user in ("api.py", "calls.py", "counters.py"):
        deep = {m for m in _imports(PACKAGE / user) if m.startswith("pccl_torch.selection.")}
        assert not deep, f"{user} imports {deep}: use pccl_torch.selection's entry point"


def test_a_tuned_shape_runs_its_choice_and_skips_the_tuner_once_decided() -> None:
    from pccl_torch.selection.tuning import Tuner, shape_key, valid_names as tunable

    choice = Choice(overrides={})
    networked = comm(hosts=2)
    choice.tuner = Tuner({"ranks": 4})
    shape = shape_key("all_gather", 1 << 20, torch.float32)
    choice.tuner.adopt({shape: "hier:ring"}, "test", tunable("cpu"))
    first = choice.plan(networked, "all_gather", None, 1 << 20, torch.float32)
    assert first.name == "hier:ring" and first.probe is None
    choice.tuner.plan = None  # a decided shape must not reach the tuner again
    assert choice.plan(networked, "all_gather", None, 1 << 20, torch.float32) is first
    assert choice.plan(networked, "all_gather", "mpi", 1 << 20, torch.float32).name == "mpi"  # explicit: untouched


def test_all_to_all_runs_flat_mpi_across_a_network_compressed_too_and_hierarchical_by_name() -> None:
    """Measured on the testbed: flat MPI at every size (the two-level one moves every byte once more inside the
    node); a wire format encodes the blocks that cross nodes and MPI moves the bytes; no pipelined form."""
    choice = Choice(overrides={}, compression={"all_to_all": "int8"})
    networked = comm(hosts=2)
    for nbytes in (0, 4096, 1 << 20, 64 << 20):
        assert choice.plan(networked, "all_to_all", None, nbytes, torch.float32).name == "mpi+int8"
        assert choice.plan(networked, "all_to_all", None, nbytes, torch.int64).name == "mpi"  # no format for ints
    assert choice.plan(networked, "all_to_all", "hier:pairwise", 1 << 20, torch.float32, "bf16").name == \
        "hier:pairwise+bf16"
    assert Choice(overrides={}).plan(comm(hosts=1), "all_to_all", None, 1 << 20, torch.float32).name == "mpi"
    assert "hier:pipelined" not in valid_names("all_to_all")
    with pytest.raises(ValueError, match="unknown all_to_all algorithm 'hier:pipelined'"):
        resolve("all_to_all", "hier:pipelined")
