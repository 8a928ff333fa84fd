"""pccl's choice for CUDA tensors across a network (issue 52, item 2): NCCL inside every node, never host staging
there, and a hierarchy only where the cost model predicts it 1.2x as fast as NCCL's own collective.

The whole decision path runs: ``Choice.plan`` -> ``Choice._decide`` (rule, learned choice and its filter, pipeline
chunks, the intra-node level asked of the communicator) on a fake communicator that records the levels asked for.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from pccl_torch import plan as plan_module
from pccl_torch.plan import Plan, names_for, resolve
from pccl_torch.selection import Choice, cuda_rule, heuristic
from pccl_torch.sim import costs
from pccl_torch.sim.machine import MachineProfile, load
from pccl_torch.sim.pipeline import predict_as_run
from pccl_torch.topology import Topology

SIZES = [1 << k for k in range(10, 31)]  # 1 KiB .. 1 GiB
NODES = (2, 3, 4, 6, 8, 16, 32, 64, 128, 256, 512)
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")


class FakeLevel(SimpleNamespace):
    """A transport as the choice and the plans see it: where it keeps its bytes."""


class FakeCudaComm(SimpleNamespace):
    """What ``Choice`` reads of a communicator of CUDA tensors: topology, device, the inter-node level (MPI in host
    memory under mpiexec, NCCL under torchrun) and the intra-node levels (records every library asked for)."""

    def intra_level(self, library):
        if library not in (None, "mpi", "nccl"):
            raise ValueError(f"intra-node library {library!r} does not serve cuda tensors")
        self.asked.append(library)
        return FakeLevel(name="mpi" if library == "mpi" else "nccl", host_capable=library == "mpi")


def cuda_comm(nodes: int, local: int, *, staged_inter: bool) -> FakeCudaComm:
    return FakeCudaComm(topology=Topology(0, nodes * local, local, nodes), device=torch.device("cuda"), choice=None,
                        inter=FakeLevel(host_memory_only=staged_inter), asked=[])


def check_keeps_nccl_inside(plan: Plan, comm: FakeCudaComm) -> None:
    """No intra-node byte through the host: NCCL's own over all ranks, or a hierarchy with NCCL inside (a pipeline
    only where the inter-node level takes device memory, as ``Plan._pipeline_intra`` runs it)."""
    if not plan.hierarchical:
        assert plan.name == "vendor" and plan.transport == "vendor", plan  # not MPI (or pccl's schedules) over all
        return
    assert plan.intra in (None, "nccl"), plan
    assert comm.asked and all(lib in (None, "nccl") for lib in comm.asked), comm.asked
    if plan.pipelined:
        assert not comm.inter.host_memory_only, plan


@pytest.mark.parametrize("staged_inter", [True, False], ids=["mpiexec", "torchrun"])
@pytest.mark.parametrize("local", [4, 8])
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_cuda_choice_keeps_nccl_inside_and_beats_nccl_by_the_margin(collective, local, staged_inter) -> None:
    """The guard: 1 KiB-1 GiB, 2-512 nodes of 4 and 8 GPUs. Every plan pccl chooses keeps the intra-node bytes on
    NCCL, and every hierarchical one is predicted (as pccl runs it: its chunk count) at least 1.2x as fast as
    NCCL's own collective on the rule's GPU profile. On the code before this change it failed at the first case
    (all_gather, 1 KiB, 2 nodes: flat ``mpi``, every rank staged through host memory)."""
    hierarchical = 0
    for nodes in NODES:
        choice = Choice(overrides={})  # one a communicator: plans are cached per call shape
        for nbytes in SIZES:
            comm = cuda_comm(nodes, local, staged_inter=staged_inter)
            plan = choice.plan(comm, collective, None, nbytes, torch.float32)
            check_keeps_nccl_inside(plan, comm)
            if plan.hierarchical:
                hierarchical += 1
                machine = cuda_rule.cuda_machine()
                assert machine is not None and machine.device == "cuda"
                vendor = costs.predict(collective, "vendor", nbytes, nodes, local, machine)
                mine = predict_as_run(collective, plan.name, nbytes, nodes, local, machine, plan.chunks)
                assert vendor >= cuda_rule.CUDA_HIER_MARGIN * mine, (plan, nodes, nbytes, vendor / mine)
    assert hierarchical, "the model predicts the hierarchy >= 1.2x somewhere on every layout"


def test_cuda_rule_takes_the_hierarchy_wherever_the_model_gives_the_margin() -> None:
    """The rule is the model's own: NCCL's where no hierarchical candidate reaches the margin, the best candidate
    where one does (so the guard above is not met by never choosing a hierarchy)."""
    machine = cuda_rule.cuda_machine()
    for collective in COLLECTIVES:
        candidates = cuda_rule.cuda_candidates(collective)
        for nodes, local, nbytes in ((2, 8, 1 << 10), (3, 4, 1 << 20), (64, 8, 64 << 20), (512, 4, 1 << 30)):
            name, seconds = costs.best(collective, nbytes, nodes, local, machine, candidates)
            speedup = costs.predict(collective, "vendor", nbytes, nodes, local, machine) / seconds
            expected = name if speedup >= cuda_rule.CUDA_HIER_MARGIN else "vendor"
            assert cuda_rule.cuda_networked_choice(collective, nbytes, nodes, local) == expected


def test_pipelines_only_where_nccl_can_run_inside_them() -> None:
    """A pipelined schedule stages the whole call once for both levels: with MPI in host memory between nodes its
    NCCL phase would get host tensors, so the rule leaves pipelines out there (and takes them under torchrun)."""
    assert "hier:pipelined" not in cuda_rule.cuda_candidates("all_gather", pipelined=False)
    choice = Choice(overrides={})
    torchrun = choice.plan(cuda_comm(2, 8, staged_inter=False), "all_reduce", None, 1 << 30, torch.float32)
    assert torchrun.name == "hier:pipelined" and torchrun.intra is None
    assert torchrun.chunks == costs.best_chunks("all_reduce", 1 << 30, 2, 8, cuda_rule.cuda_machine())  # not 32
    mpiexec = Choice(overrides={}).plan(cuda_comm(2, 8, staged_inter=True), "all_reduce", None, 1 << 30,
                                        torch.float32)
    assert not mpiexec.pipelined


@pytest.mark.parametrize("ranking, staged_inter, expected", [
    (["mpi", "hier:ring"], True, None),  # flat MPI over every rank: filtered, the rule decides
    (["hier-mpi:ring"], True, None),  # MPI inside the node: filtered
    (["ring"], False, None),  # pccl's flat ring over the world MPI level: filtered
    (["hier:pipelined"], True, None),  # a pipeline over staged MPI would stage its NCCL phase: filtered
    (["hier:pipelined"], False, "hier:pipelined"),
    (["hier:ring", "mpi"], True, "hier:ring"),
    (["vendor"], True, "vendor"),
])
def test_a_learned_choice_on_cuda_never_stages_intra_node_bytes(ranking, staged_inter, expected) -> None:
    """A profile trained where MPI won (CPU nodes) answers with a name that stages a CUDA call's intra-node bytes:
    the choice falls back to the CUDA rule; an answer that keeps NCCL inside stands."""
    from pccl_torch.selection.learned.runtime import Selector

    profile = SimpleNamespace(metadata={}, machine_profile=None, in_range=lambda features: True,
                              rank=lambda features: ranking)
    choice = Choice(selector=Selector(profile), overrides={})  # type: ignore[arg-type]
    comm = cuda_comm(4, 4, staged_inter=staged_inter)
    plan = choice.plan(comm, "all_gather", None, 64 << 20, torch.float32)
    check_keeps_nccl_inside(plan, comm)
    rule = cuda_rule.cuda_networked_choice("all_gather", 64 << 20, 4, 4, not staged_inter)
    assert plan.name == (expected or rule)


def test_keeps_intra_on_device() -> None:
    keeps = cuda_rule.cuda_keeps_intra_on_device
    assert keeps("vendor", 8) and keeps("hier:ring", 8) and keeps("hier-nccl:ring", 8) and keeps("hier:mpi", 8)
    assert not keeps("mpi", 8) and not keeps("ring", 8) and not keeps("hier-mpi:ring", 8)
    assert keeps("mpi", 1) and keeps("ring", 1)  # one GPU a node: no intra-node bytes to stage
    assert keeps("hier:pipelined", 8) and not keeps("hier:pipelined", 8, pipelined=False)
    assert not keeps("hier-mpi:pipelined", 8)


def test_named_plans_and_cpu_choices_are_untouched() -> None:
    """``algorithm=`` and ``PCCL_ALGO`` are the user's; CPU tensors keep the measured rule, one machine NCCL's own."""
    comm = cuda_comm(2, 4, staged_inter=True)
    assert Choice(overrides={}).plan(comm, "all_gather", "mpi", 1024, torch.float32).name == "mpi"
    assert Choice(overrides={"all_reduce": "hier-mpi:ring"}).plan(comm, "all_reduce", None, 1024,
                                                                  torch.float32).name == "hier-mpi:ring"
    cpu = SimpleNamespace(topology=Topology(0, 8, 4, 2), device=torch.device("cpu"), choice=None,
                          intra_level=lambda library: None)
    for collective in COLLECTIVES:
        for nbytes in (4096, 1 << 20, 64 << 20):
            chosen = Choice(overrides={}).plan(cpu, collective, None, nbytes, torch.float32).name
            assert chosen in (heuristic.networked_choice(collective, nbytes, 2), "hier:mpi")  # one chunk: hier:mpi
    one_host = cuda_comm(1, 8, staged_inter=True)
    assert Choice(overrides={}).plan(one_host, "all_reduce", None, 1 << 20, torch.float32).name == "vendor"


def test_pipelined_plans_run_the_devices_library_inside(monkeypatch) -> None:
    """``hier:pipelined`` resolves to the device's intra-node library (NCCL on CUDA, MPI on CPU), ``hier-mpi:`` to
    MPI; with MPI in host memory between nodes the CUDA call stages once and runs MPI inside, as before."""
    assert resolve("all_reduce", "hier:pipelined").intra is None
    assert resolve("all_reduce", "hier-mpi:pipelined").intra == "mpi"
    assert "hier:pipelined" in names_for("all_reduce", "cuda") and "hier-mpi:pipelined" in names_for("all_reduce",
                                                                                                   "cuda")
    used = []
    monkeypatch.setattr(plan_module.pipelined, "all_reduce", lambda intra, inter, buf, op, chunks: used.append(intra))
    nccl, mpi = FakeLevel(host_capable=False), FakeLevel(host_capable=True)

    def levels(staged_inter: bool) -> SimpleNamespace:
        return SimpleNamespace(inter=FakeLevel(host_memory_only=staged_inter),
                               intra_level=lambda library: mpi if library == "mpi" else nccl)

    cuda_tensor = SimpleNamespace(is_cuda=True, dtype=torch.float32)  # no GPU here: what the plan reads of it
    pipelined = dataclasses.replace(resolve("all_reduce", "hier:pipelined"), chunks=4)
    pipelined.run_all_reduce(levels(False), cuda_tensor, None)  # type: ignore[arg-type]
    pipelined.run_all_reduce(levels(True), cuda_tensor, None)  # type: ignore[arg-type]
    pipelined.run_all_reduce(levels(True), torch.zeros(4), None)  # CPU: the default level (MPI's, on a communicator)
    resolve("all_reduce", "hier-mpi:pipelined").run_all_reduce(levels(False), cuda_tensor, None)  # type: ignore
    assert used == [nccl, mpi, nccl, mpi]


def test_gpu_profiles_price_pipelines_with_the_vendor_library_inside() -> None:
    """The model prices what runs: on a ``cuda`` profile ``hier:pipelined`` has NCCL inside and NCCL's all-reduce is
    the faster of its ring and its tree; a ``cpu`` profile (or one without the key) prices as before."""
    gpu = load("perlmutter")
    legacy = dataclasses.replace(gpu, device="cpu")
    assert costs.split_hierarchical("hier:pipelined", "nccl", "cuda") == ("vendor", "pipelined")
    assert costs.split_hierarchical("hier-mpi:pipelined", "nccl", "cuda") == ("mpi", "pipelined")
    assert costs.split_hierarchical("hier:pipelined", "nccl", "cpu") == ("mpi", "pipelined")
    assert costs.split_hierarchical("hier:pipelined", "gloo", "cpu") == ("mpi", "pipelined")
    assert costs.predict("all_gather", "hier:pipelined", 1 << 30, 2, 4, gpu) != \
        costs.predict("all_gather", "hier:pipelined", 1 << 30, 2, 4, legacy)
    assert costs.predict("all_gather", "hier-mpi:pipelined", 1 << 30, 2, 4, gpu) == \
        costs.predict("all_gather", "hier-mpi:pipelined", 1 << 30, 2, 4, legacy)
    ring = costs.profile_terms("all_reduce", "vendor", 1024, 512, 4, gpu).time(gpu)
    assert costs.predict("all_reduce", "vendor", 1024, 512, 4, gpu) < ring / 10  # the tree: lg N steps, not 2(P-1)
    assert costs.predict("all_reduce", "vendor", 1024, 512, 4, legacy) == pytest.approx(ring)
    assert load("local-cpu").device == "cpu"  # and frontier: its documented sweep compares with RCCL's ring
    with pytest.raises(ValueError, match="device must be one of cpu, cuda, got 'xpu'"):
        dataclasses.replace(gpu, device="xpu")
    with pytest.raises(ValueError, match="device cuda needs a GPU vendor library"):
        dataclasses.replace(gpu, vendor_library="gloo")
    assert MachineProfile.from_dict(gpu.to_dict()).device == "cuda"


def test_pccl_sim_cuda_choice_prints_the_rule(capsys) -> None:
    from pccl_torch.sim.cli import main

    assert main(["cuda-choice", "--nodes", "2,512", "--sizes", "1K,1G", "-c", "all_reduce",
                 "--gpus-per-node", "4"]) == 0
    out = capsys.readouterr().out
    assert "all_reduce, 4 GPUs a node (perlmutter)" in out and "nccl" in out and "pipe" in out
    assert main(["cuda-choice", "--machine", "local-cpu"]) != 0  # a CPU profile: an error naming a GPU one


@pytest.mark.parametrize("staged_inter", [True, False], ids=["mpiexec", "torchrun"])
def test_online_tuning_never_tries_a_plan_that_stages_a_nodes_bytes(staged_inter) -> None:
    """``PCCL_TUNE=online``'s candidates for CUDA tensors across nodes of several GPUs keep NCCL inside the node too
    (before: the pool's flat ``mpi``, pccl's flat schedules and ``hier-mpi:`` ones)."""
    for collective in COLLECTIVES:
        comm = cuda_comm(4, 8, staged_inter=staged_inter)
        candidates = Choice(overrides={})._alternatives(comm, collective, "vendor", 1 << 20)
        assert candidates, collective
        for name in candidates:
            assert cuda_rule.cuda_keeps_intra_on_device(name, 8, not staged_inter), (collective, name)
