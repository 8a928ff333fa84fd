"""The default algorithm choice until a trained selector exists (``algorithm=None``).

Rules after Thakur, Rabenseifner and Gropp (2005), MPICH's defaults: latency-optimal schedules for
small messages, bandwidth-optimal ones for large messages; hierarchical whenever there are several
nodes of several ranks, with the inter-node algorithm chosen on the inter-node message size.
``nbytes`` is the size of the full buffer (all-gather output, reduce-scatter input, all-reduce buffer).
CUDA tensors across a network follow the cost model (:func:`cuda_networked_choice`): NCCL inside every node.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from pccl_torch.algorithms import Collective
from pccl_torch.plan import HIER_PREFIX, PIPELINED, hierarchical_inner, intra_library
from pccl_torch.topology import Topology

if TYPE_CHECKING:  # pccl_torch.sim imports this module: the model is imported where the CUDA rule runs
    from pccl_torch.sim.machine import MachineProfile

log = logging.getLogger(__name__)

SMALL_ALL_GATHER = 80 * 1024  # Bruck below (ceil(lg p) steps), recursive doubling to MEDIUM
MEDIUM = 512 * 1024  # ring / pairwise / Rabenseifner above
SMALL_ALL_REDUCE = 2 * 1024  # recursive doubling below: whole buffer, lg p steps


def flat_choice(collective: Collective, nbytes: int, ranks: int) -> str:
    """MPICH's rule for a flat collective over ``ranks`` ranks (also the cost model's view of MPI's own)."""
    power_of_two = ranks & (ranks - 1) == 0
    if collective == "all_gather":
        if nbytes < SMALL_ALL_GATHER:
            return "bruck"
        return "recursive_doubling" if nbytes < MEDIUM and power_of_two else "ring"
    if collective == "reduce_scatter":
        return "recursive_halving" if nbytes < MEDIUM else "pairwise"
    if collective == "all_to_all":
        return "pairwise"  # MPICH: Bruck below 256 bytes a block, posted sends and receives, then pairwise
    if nbytes < SMALL_ALL_REDUCE:
        return "recursive_doubling"
    return "rabenseifner" if power_of_two or nbytes < MEDIUM else "ring"


ONE_MACHINE = {"cpu": "mpi", "cuda": "vendor"}
"""The choice where every rank shares one machine's memory: the native library's flat collective (MPI's for CPU
tensors, NCCL's for CUDA ones through torch.distributed): no hierarchy can pay without a network between nodes."""


def one_machine_choice(device: str) -> str:
    """The algorithm of a call on one machine (``Topology.networked`` false) for ``device`` tensors."""
    return ONE_MACHINE[device]


def choose(collective: Collective, nbytes: int, topology: Topology) -> str:
    """Algorithm name for a call of ``collective`` on a full buffer of ``nbytes`` bytes."""
    if topology.world_size == 1:
        return "mpi"  # one rank: every schedule is a copy, and MPI's own has the least Python around it
    if collective == "all_to_all":  # MPI's own picks its schedule by size (network_all_to_all_choice)
        return "mpi"
    if not topology.is_hierarchical:
        return flat_choice(collective, nbytes, topology.world_size)
    # The inter-node phase moves N/P of the buffer (AG, RS), or its 1/L shard (AR).
    inter_bytes = nbytes // topology.local_size
    return HIER_PREFIX + flat_choice(collective, inter_bytes, topology.num_nodes)


# Across a network (several hosts), the full-buffer size from which the hierarchy beats the MPI library's
# flat collective, and from which the pipelined schedule beats the unpipelined one. Measured on the
# testbed (2 nodes x 2 ranks at 1 Gbit/s and 200 Mbit/s, pccl-bench 1K..64M against MPICH's blocking
# collectives): flat MPI wins below 256 KiB for all three; MPICH's all-reduce stays within ~10% of the link
# bound up to 1 MiB, so the hierarchy only pays from 4 MiB there. On 3 nodes (200 Mbit/s) the pipelined
# schedule, which runs MPI's non-blocking collectives between nodes, lost to gloo and to MPI for
# all-reduce and reduce-scatter (0.63-0.76x), while the ring between nodes won (1.17x over gloo, 1.94x
# over MPI): with a node count that is not a power of two those two take the ring.
NETWORK_HIER_FROM = {"all_gather": 256 * 1024, "reduce_scatter": 256 * 1024, "all_reduce": 4 << 20}
# With the inter-node link measured (pccl_torch.selection.links), all-gather and reduce-scatter go hierarchical from the size
# that takes this long on it: at 200 Mbit/s (25 MB/s measured) the 64 KiB hierarchical all-gather and reduce-scatter
# were 1.8-3.1x faster than MPICH's flat ones (2.6 ms of link time), while at 1 Gbit/s (124 MB/s) flat MPI still won
# at 64 KiB (0.5 ms) and lost at 256 KiB (2.1 ms). All-reduce keeps its threshold: MPICH's flat all-reduce stayed
# within 10% of the best fixed algorithm up to 1 MiB at both rates.
NETWORK_HIER_LINK_SECONDS = 1.5e-3
# Small all-reduces stay flat: a rule that sent them hierarchical (recursive doubling between nodes) below 3 ms of
# link time, after MPICH's flat all-reduce was measured 1.9-2.4x slower at 64 KiB (2026-12-04), lost on 2026-12-05
# at every size it covered: 2 x 2 testbed, 4-256 KiB, pccl's flat `mpi` over that choice 1.7-1.8x (4-64 KiB) and
# 1.16x (256 KiB) at 1 Gbit/s, 1.27-1.79x (4-64 KiB) at 200 Mbit/s.
NETWORK_PIPELINE_FROM = 1 << 20
# All-to-all across a network: MPI's own at every size measured. On the testbed (2 nodes x 2, 1 Gbit/s and 200
# Mbit/s, 4 KiB-16 MiB) flat MPI ran at the link bound from 1 MiB, and the two-level all-to-all, which sends the same
# bytes across the link in fewer messages but moves L-1 of every L bytes once more inside the node, was 0.15-0.78x of
# it (ranks sharing 2 cores pay for every byte moved in memory); it pays where messages are many and small (many
# nodes), by name (``hier:mpi``). Compressed calls run flat too: each block is encoded at its source, MPI moves bytes.
NETWORK_ALL_TO_ALL = "mpi"
# 3 nodes, 200 Mbit/s: hier:ring all-reduce 1.33x / 1.37x / 1.16x over the best baseline at 64 KiB / 256 KiB /
# 1 MiB, where MPICH's flat all-reduce ran at half of gloo's speed.
NETWORK_RING_FROM = 64 * 1024


def networked_choice(collective: Collective, nbytes: int, nodes: int, inter_bytes_per_s: float | None = None) -> str:
    """The choice for ``nodes`` nodes of several ranks joined by a network (``Topology.networked``); with a
    node count that is not a power of two, all-reduce and reduce-scatter go over the ring between nodes from
    :data:`NETWORK_RING_FROM`. ``inter_bytes_per_s``: the inter-node link's measured bandwidth, which moves the
    all-gather and reduce-scatter threshold down on slow links (:data:`NETWORK_HIER_LINK_SECONDS`)."""
    if collective == "all_to_all":
        return NETWORK_ALL_TO_ALL
    uneven = nodes & (nodes - 1) and collective != "all_gather"
    hier_from = NETWORK_HIER_FROM[collective]
    if inter_bytes_per_s and collective != "all_reduce":
        hier_from = min(hier_from, int(inter_bytes_per_s * NETWORK_HIER_LINK_SECONDS))
    if nbytes < (NETWORK_RING_FROM if uneven else hier_from):
        return "mpi"
    if uneven:
        return HIER_PREFIX + "ring"
    return HIER_PREFIX + (PIPELINED if nbytes >= NETWORK_PIPELINE_FROM else "mpi")


def compressed_networked_choice(collective: Collective, name: str) -> str:
    """What pccl's own choice ``name`` runs as when the call is compressed across a network of several ranks a
    node: a flat all-reduce goes two-level (``hier:mpi``). Compressed, a flat all-reduce is pccl's compressed
    reduce-scatter and all-gather over every rank, each rank's encoded blocks crossing the link on their own,
    where the two-level one reduces inside the node first and encodes only what crosses: on the 2 x 2 testbed at
    200 Mbit/s, int8, ``hier:mpi+int8`` took 3.1 / 17.4 / 59.1 ms at 256 KiB / 1 MiB / 4 MiB against 6.1 / 28.6 /
    96.4 ms flat (``mpi+int8``; 2026-12-05, ``pccl-bench --testbed -np 4 --local-size 2 -c all_reduce``); at 1 Gbit/s,
    int8 and bf16, 0.66-0.91x of the flat one's time from 256 KiB, within 12% either way at 4-64 KiB."""
    if collective == "all_reduce" and not name.startswith(HIER_PREFIX):
        return HIER_PREFIX + "mpi"
    return name


# CUDA tensors across a network (several hosts of several GPUs). Inside a node NCCL always moves the bytes (NVLink,
# ~900 GB/s on an H100, where staging through the host gives PCIe's ~50 GB/s and MPI's copies): the choice is NCCL's own
# collective over all ranks (``vendor``), or a hierarchy with NCCL inside each node (``hier:<schedule>``), never a flat
# MPI collective or an MPI intra-node level. The CPU rules above were measured on the CPU testbed and say nothing
# about GPUs; this one is MODEL-DERIVED, not measured: pccl-sim's cost model (``pccl_torch.sim.costs``) on
# CUDA_MACHINE (configs/machines/perlmutter.yaml: 4 A100 on NVLink3 and 4 Slingshot-11 NICs a node; NCCL priced as
# the faster of its ring and its tree for all-reduce, as NCCL's own tuning model does). The hierarchy is chosen only
# where the model predicts it CUDA_HIER_MARGIN times as fast as NCCL's own, so that the model's errors leave NCCL's
# time as the bound. What the model predicts (``pccl-sim cuda-choice --machine perlmutter``, 4 and 8 GPUs a node):
# hierarchical all-gather and reduce-scatter while a rank's block is up to ~0.5-1 MiB (1.6x on 2 nodes to 300x on
# 512 at 1 KiB: NCCL's ring takes P-1 steps), pipelined from 256 MiB on 2 nodes (1.2-1.5x: (N-1)/N of the buffer
# crosses a node's NICs, not (P-1)/P); all-reduce up to 256 KiB-4 MiB from 4-8 nodes (1.2-2.1x), pipelined from
# 256 MiB on 2 nodes, NCCL's own on 3 nodes (its tree takes lg N steps between nodes); all-to-all while a block is up
# to ~64-256 KiB (1.3-16x). Unmodelled, all against the hierarchy: MPI's host staging between nodes (mpiexec without
# CUDA-aware MPI) and the launch of each step of pccl's own schedules. Predictions until a GPU measures them
# (docs/selection.md, "CUDA tensors across a network").
CUDA_MACHINE = "perlmutter"
CUDA_HIER_MARGIN = 1.2


@functools.cache
def cuda_machine() -> MachineProfile | None:
    """The GPU machine profile of the CUDA rule, :data:`CUDA_MACHINE` (None where it cannot be read: the rule then
    keeps NCCL's own); a pipelined CUDA call's chunk count comes from it too."""
    from pccl_torch.sim import machine

    try:
        profile = machine.load(CUDA_MACHINE)
    except (OSError, ValueError, TypeError) as exc:
        log.warning("pccl: no GPU machine profile %r (%s); CUDA collectives across nodes run NCCL's own",
                    CUDA_MACHINE, exc)
        return None
    return profile if profile.device == "cuda" else None


def cuda_candidates(collective: Collective, pipelined: bool = True) -> list[str]:
    """The hierarchical names the CUDA rule weighs: ``hier:`` (NCCL inside the node on CUDA tensors) and every
    schedule between nodes, ``hier:pipelined`` only where its NCCL intra-node phase can run (``pipelined``: the
    inter-node level takes device memory; the pipelined schedule stages a call once for both levels)."""
    return [HIER_PREFIX + inner for inner in hierarchical_inner(collective) if pipelined or inner != PIPELINED]


def cuda_networked_choice(collective: Collective, nbytes: int, nodes: int, local_size: int,
                          pipelined: bool = True) -> str:
    """The choice for CUDA tensors on ``nodes`` hosts of ``local_size`` GPUs joined by a network: the model's
    fastest of :func:`cuda_candidates` where it predicts it :data:`CUDA_HIER_MARGIN` times as fast as NCCL's own
    collective over all ranks, else ``vendor`` (NCCL's own): never slower than NCCL, by the model. Deterministic,
    so every rank makes the same choice; cached per call shape."""
    return _cuda_networked_choice(collective, max(int(nbytes), 1), nodes, local_size, pipelined)


@functools.lru_cache(maxsize=4096)
def _cuda_networked_choice(collective: Collective, nbytes: int, nodes: int, local_size: int, pipelined: bool) -> str:
    profile = cuda_machine()
    return "vendor" if profile is None else cuda_rule(profile, collective, nbytes, nodes, local_size, pipelined)[0]


def cuda_rule(profile: MachineProfile, collective: Collective, nbytes: int, nodes: int, local_size: int,
              pipelined: bool = True) -> tuple[str, str, float]:
    """The CUDA rule on a GPU machine ``profile``: (the choice, the fastest
    hierarchical candidate, its predicted speed-up over NCCL's own). What :func:`cuda_networked_choice` decides on
    :data:`CUDA_MACHINE`, and what ``pccl-sim cuda-choice`` prints for any profile."""
    from pccl_torch.sim import costs

    name, seconds = costs.best(collective, nbytes, nodes, local_size, profile, cuda_candidates(collective, pipelined))
    speedup = costs.predict(collective, "vendor", nbytes, nodes, local_size, profile) / seconds
    return (name if speedup >= CUDA_HIER_MARGIN else "vendor"), name, speedup


def cuda_keeps_intra_on_device(name: str, local_size: int, pipelined: bool = True) -> bool:
    """Whether ``name`` keeps CUDA tensors' intra-node bytes on the device (NCCL) on nodes of ``local_size``
    ranks: ``vendor``, and hierarchical names with NCCL inside (``hier:``, ``hier-nccl:``; ``hier:pipelined``
    only where ``pipelined``); not the flat MPI-family names (every rank staged through host memory, its
    node's traffic too) unless one rank a node, nor ``hier-mpi:``. The filter on a learned choice for CUDA."""
    _, sep, inner = name.partition(":")
    if not sep:
        return name == "vendor" or local_size == 1
    if intra_library(name) not in (None, "nccl"):
        return False
    return pipelined or inner != PIPELINED
