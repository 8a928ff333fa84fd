"""The default algorithm choice until a trained selector exists (``algorithm=None``).

Rules after Thakur, Rabenseifner and Gropp (2005), MPICH's defaults: latency-optimal schedules for
small messages, bandwidth-optimal ones for large messages; hierarchical whenever there are several
nodes of several ranks, with the inter-node algorithm chosen on the inter-node message size.
``nbytes`` is the size of the full buffer (all-gather output, reduce-scatter input, all-reduce buffer).
CUDA tensors across a network follow the cost model instead (``pccl_torch.selection.cuda_rule``): NCCL inside every node.
"""

from __future__ import annotations

from pccl_torch.algorithms import Collective
from pccl_torch.plan import HIER_PREFIX, PIPELINED
from pccl_torch.topology import Topology

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


MPI_A2A_SCATTERED_MAX_BLOCK = 32 * 1024
"""Largest block (bytes per destination) for which MPICH's ``MPI_Alltoall`` posts every message at once (its
scattered schedule; Bruck for the smallest on 8 ranks or more); above, pairwise: p-1 exchanges in turn."""
MPICH_A2A_BRUCK_MAX_BLOCK = 256
"""Largest block (bytes per destination) for which MPICH's ``MPI_Alltoall`` runs Bruck, on 8 ranks or more
(``MPIR_CVAR_ALLTOALL_SHORT_MSG_SIZE``; MPICH 5.0's built-in selection, not in place: ``comm_size<8``: scattered up
to 32 KiB blocks, else pairwise; otherwise Bruck up to 256 bytes, scattered up to 32 KiB, pairwise above).
``MPI_Alltoallv`` always runs scattered."""

MPI_A2A_VECTOR = False
"""pccl's ``mpi`` all-to-all calls ``MPI_Alltoall`` for equal blocks (MPICH's rule by size applies: the calls pccl-bench
times, as the cost model prices them) and ``MPI_Alltoallv`` for split sizes (always scattered)."""


def mpich_all_to_all(block_bytes: float, p: int, *, vector: bool = MPI_A2A_VECTOR) -> str:
    """The schedule MPICH runs for an all-to-all of blocks of ``block_bytes`` on ``p`` ranks: ``bruck``
    (``MPI_Alltoall`` only), ``scattered`` (every message posted at once; ``MPI_Alltoallv`` always) or
    ``pairwise`` (p-1 exchanges in turn)."""
    if vector:
        return "scattered"
    if p >= 8 and block_bytes <= MPICH_A2A_BRUCK_MAX_BLOCK:
        return "bruck"
    return "scattered" if block_bytes <= MPI_A2A_SCATTERED_MAX_BLOCK else "pairwise"


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


# Links with latency (a measured one-way latency of LATENCY_REGIME_S or more between nodes: across a region's zones or
# between data centres): where the inter-node bytes of a call take less than LATENCY_BOUND_SPAN one-way latencies on
# the link, the call is latency-bound, and the hierarchy with the fewest steps between nodes wins. On the testbed
# (4 nodes x 2 ranks, 1 Gbit/s, RTT 20 ms; pccl-bench, 2026-12-07, docs/benchmarks.md "Selection under latency"):
# hier:recursive_doubling all-reduce 49-128 ms at 64 KiB-4 MiB against 88-205 ms for MPICH's flat all-reduce and
# the pipelined plan; hier:bruck all-gather 54 ms and hier:recursive_halving reduce-scatter 58 ms at 1 MiB against
# 71-78 ms for hier:mpi; at 256 KiB, where MPICH's all-gather and reduce-scatter still run their lg p schedules,
# hier:bruck / hier:recursive_halving took 48.9 / 47.3 ms against MPICH's 45.2 / 43.9 ms, so those two stay flat
# there. At RTT 1 ms (0.7 ms measured one way) the same plans lost to flat MPI at 16-256 KiB (0.65-0.88x for the
# all-reduce), so the rule starts between the two; nothing between was measured.
LATENCY_REGIME_S = 2e-3
LATENCY_BOUND_SPAN = 2.0
LATENCY_OPTIMAL = {"all_gather": "bruck", "reduce_scatter": "recursive_halving", "all_reduce": "recursive_doubling"}
"""The inter-node schedule of a latency-bound call: ceil(lg N) steps between N nodes (folding when N is not a power
of two), against N-1 for the ring and the pipelined plan's steps in every chunk."""
LATENCY_ALL_TO_ALL = "vendor"
"""An all-to-all across a link in the latency regime whose blocks MPI would exchange in turn (up to blocks of
:data:`VENDOR_BLOCK_BYTES`): the vendor library's
(gloo on CPUs posts every message at once). 4 x 2 at RTT 20 ms: gloo 36 / 83 / 258 ms at 1 / 4 / 16 MiB against
MPICH's 130-135 / 164-216 / 394-704 ms (pairwise: a round trip a step) and pccl's two-level hier:mpi 74 / 123 /
331 ms; at 64-256 KiB (blocks of 8-32 KiB, posted at once) MPICH 22.7-24.3 ms, gloo 25.3-25.5 ms."""
VENDOR_BLOCK_BYTES = 4 << 20
"""Blocks larger than this, which each step of an all-to-all or a flat all-gather sends (a rank's share:
``nbytes / ranks``), stay on MPI's own steps across latency: the round trip of each is a small share, and MPI moved
them faster than the vendor library. At 1 Gbit/s and RTT 20 ms, 8 MiB blocks (64 MiB on 8 ranks): MPICH's
all-to-all 886 ms against gloo's 1176 on 8 x 1 and 999 against 1260 on 4 x 2, its all-gather 862 against 1180 on
8 x 1; 2 MiB blocks: gloo's 240-309 ms against MPICH's 409-462 (all-to-all), 244 against 297 (all-gather). At
200 Mbit/s, 2 MiB blocks: gloo's all-gather 619 ms against MPICH's 702 (8 x 1), but MPICH's all-to-all 1133 against
gloo's 1270 (4 x 2, relay at nice -10). Why MPI's large blocks move faster is not known: the bound was measured at
1 Gbit/s, between 2 and 8 MiB."""
LG_P_SCHEDULES = frozenset({"bruck", "recursive_doubling", "recursive_halving"})
"""MPI's flat schedules of ceil(lg p) steps (MPICH's for small all-gathers and reduce-scatters)."""
HAS_LATENCY_FROM_S = 0.4e-3
"""A measured link of this one-way latency or more has latency (:func:`has_latency`; racks apart, a region's zones;
the testbed without added delay measures 0.02-0.2 ms, at RTT 1 ms 0.6 ms): a pipelined call's chunks are no smaller
than ``sim.pipeline.LATENCY_MIN_CHUNK_BYTES``, and all-gathers and reduce-scatters stay MPI's own while MPICH runs a
lg p schedule (:func:`flat_runs_lg_p`): its ceil(lg p) steps cross nodes as few times as the hierarchy's, which only
adds its phases inside the nodes. On the testbed at RTT 1 ms (4 x 2,
1 Gbit/s, 0.58-0.63 ms measured one way; relay in the real-time class, 2026-12-07, two runs) MPICH's 256 KiB
all-gather took 5.3 / 6.2 ms against 5.9-8.2 ms for pccl's hierarchies, its reduce-scatter 6.5 / 5.5 ms against
7.9-12.5 ms; from 1 MiB (ring, pairwise) the hierarchy's reduce-scatter won (12.4-16.3 ms against 16.9-20.5). Without
added delay (0.02-0.2 ms measured) the hierarchy won at 256 KiB on 2 x 2 (:data:`NETWORK_HIER_LINK_SECONDS`)."""


def large_blocks(nbytes: int, ranks: int) -> bool:
    """Whether a rank's block of a call of ``nbytes`` over ``ranks`` ranks is over :data:`VENDOR_BLOCK_BYTES`."""
    return nbytes / max(ranks, 1) > VENDOR_BLOCK_BYTES


def has_latency(inter_bytes_per_s: float | None, inter_latency_s: float) -> bool:
    """Whether the measured inter-node link (a bandwidth, None unmeasured) is one of :data:`HAS_LATENCY_FROM_S` or
    more one way."""
    return bool(inter_bytes_per_s) and inter_latency_s >= HAS_LATENCY_FROM_S


def flat_runs_lg_p(collective: Collective, nbytes: int, ranks: int, inter_bytes_per_s: float | None,
                   inter_latency_s: float) -> bool:
    """Whether an all-gather or reduce-scatter of ``nbytes`` over ``ranks`` ranks stays MPI's own across the measured
    link: one with latency (:func:`has_latency`), where MPICH runs a lg p schedule."""
    return has_latency(inter_bytes_per_s, inter_latency_s) and collective in ("all_gather", "reduce_scatter") and \
        flat_choice(collective, nbytes, ranks) in LG_P_SCHEDULES


def in_latency_regime(inter_bytes_per_s: float | None, inter_latency_s: float) -> bool:
    """Whether the measured inter-node link (a bandwidth, None unmeasured) is one of :data:`LATENCY_REGIME_S` or more
    one way: the rules of links with latency apply."""
    return bool(inter_bytes_per_s) and inter_latency_s >= LATENCY_REGIME_S


def latency_bound(nbytes: int, local_size: int, inter_bytes_per_s: float | None, inter_latency_s: float) -> bool:
    """Whether a call of ``nbytes`` (full buffer) is latency-bound between nodes: a link in the latency regime
    (:func:`in_latency_regime`) that moves the call's inter-node bytes (``nbytes / local_size``) in less than
    :data:`LATENCY_BOUND_SPAN` one-way latencies."""
    if not in_latency_regime(inter_bytes_per_s, inter_latency_s):
        return False
    return nbytes / max(local_size, 1) / inter_bytes_per_s < LATENCY_BOUND_SPAN * inter_latency_s


# A rank a node (a flat layout) across links in the latency regime: no hierarchy to choose, but the schedule of every
# rank still crosses the link at each step. On the testbed (8 nodes x 1 rank, 1 Gbit/s, RTT 20 ms, relay in the
# real-time class; pccl-bench, 2026-12-07, docs/benchmarks.md "A rank a node across latency"), where MPICH runs its
# ring (all-gather from 512 KiB) or pairwise (reduce-scatter) schedule, pccl's lg p ones won: recursive doubling
# all-gather 85 / 105 ms at 1 / 4 MiB against 158 / 180 ms for MPI's own and 166 / 179 ms for gloo; recursive
# halving reduce-scatter 73 / 112 / 265 ms at 1 / 4 / 16 MiB against MPI's own 157 / 179 / 445 ms. The
# all-reduce's recursive doubling, which sends the whole buffer at each of its lg p steps, won while those bytes took
# under two latencies (69 / 71 ms at 64 / 256 KiB against 132 / 129 ms for MPI's Rabenseifner), by 10% beyond
# (122 against 135 ms at 1 MiB), and lost at 4 MiB (231 against 202 ms). At 16 MiB, where the call takes many latencies on
# the link, gloo's all-gather was the fastest (255 ms through pccl's `vendor` against 280-294 ms for every schedule
# over MPI); its all-reduce matched MPI's (459 against 442 ms). Reduce-scatter stays on MPI there (gloo's took 508
# ms at 16 MiB and 341 ms at 4 MiB). Since pccl's all-gathers and reduce-scatters wait for their receives only
# (``Transport.sendrecv_posted``) its lg p schedules beat MPICH's own at 4-256 KiB too, where MPICH runs lg p steps
# that each wait for the send's acknowledgement: recursive doubling all-gather 51-57 ms against 61-66, recursive
# halving reduce-scatter 50-54 against 61-67 (8 x 1, RTT 20 ms, two runs; fourth-pass/posted-sends/).
FLAT_LATENCY_OPTIMAL = {"all_gather": "recursive_doubling", "reduce_scatter": "recursive_halving",
                        "all_reduce": "recursive_doubling"}
"""pccl's flat schedule of ceil(lg p) steps for a flat layout across latency (Bruck for all-gathers on a node count that
is not a power of two: recursive doubling would fold in two more steps)."""
FLAT_VENDOR_FROM_LATENCIES = 8.0
"""A flat all-gather or all-reduce across latency whose full buffer takes at least this many one-way latencies on the
link goes to the vendor library (``vendor``: gloo for CPU tensors): 16 MiB takes ~15 at 1 Gbit/s and RTT 20 ms, where
gloo won or tied; 4 MiB ~4, where pccl's lg p schedules and MPI's own won."""


def flat_latency_choice(collective: Collective, nbytes: int, ranks: int, inter_bytes_per_s: float,
                        inter_latency_s: float) -> str:
    """The choice for ``ranks`` nodes of one rank each (a flat layout) across links in the latency regime
    (:data:`LATENCY_REGIME_S`): pccl's lg p schedule (:data:`FLAT_LATENCY_OPTIMAL`), whose steps wait for their
    receives only (MPICH's lg p schedules wait for each send too: a round trip a step), the vendor library for
    all-gathers and all-reduces of many latencies' worth of bytes (:data:`FLAT_VENDOR_FROM_LATENCIES`), but MPI's own
    for all-gathers of blocks over :data:`VENDOR_BLOCK_BYTES`."""
    link_s = nbytes / inter_bytes_per_s
    if collective != "reduce_scatter" and link_s >= FLAT_VENDOR_FROM_LATENCIES * inter_latency_s:
        return "mpi" if collective == "all_gather" and large_blocks(nbytes, ranks) else "vendor"
    if collective == "all_reduce":
        steps = max(ranks - 1, 1).bit_length()  # recursive doubling: the whole buffer crosses at each step
        return FLAT_LATENCY_OPTIMAL[collective] if latency_bound(nbytes * steps, 1, inter_bytes_per_s,
                                                                 inter_latency_s) else "mpi"
    if collective == "all_gather" and ranks & (ranks - 1):
        return "bruck"
    return FLAT_LATENCY_OPTIMAL[collective]


def networked_choice(collective: Collective, nbytes: int, nodes: int, inter_bytes_per_s: float | None = None, *,
                     inter_latency_s: float = 0.0, local_size: int = 1) -> str:
    """The choice for ``nodes`` nodes of ``local_size`` ranks joined by a network (``Topology.networked``); with a
    node count that is not a power of two, all-reduce and reduce-scatter go over the ring between nodes from
    :data:`NETWORK_RING_FROM`. ``inter_bytes_per_s``: the inter-node link's measured bandwidth, which moves the
    all-gather and reduce-scatter threshold down on slow links (:data:`NETWORK_HIER_LINK_SECONDS`);
    ``inter_latency_s``: its measured one-way latency, which keeps MPI's own lg p schedules flat
    (:func:`flat_runs_lg_p`), sends latency-bound calls (:func:`latency_bound`) to the hierarchy with the fewest steps
    between nodes (:data:`LATENCY_OPTIMAL`), and all-to-alls of large blocks to the vendor library
    (:data:`LATENCY_ALL_TO_ALL`)."""
    if collective == "all_to_all":
        far = in_latency_regime(inter_bytes_per_s, inter_latency_s)
        ranks = max(nodes * local_size, 1)
        steps_in_turn = mpich_all_to_all(nbytes / ranks, ranks) == "pairwise"
        vendor = far and steps_in_turn and not large_blocks(nbytes, ranks)
        return LATENCY_ALL_TO_ALL if vendor else NETWORK_ALL_TO_ALL
    if local_size == 1 and in_latency_regime(inter_bytes_per_s, inter_latency_s):
        return flat_latency_choice(collective, nbytes, nodes, inter_bytes_per_s, inter_latency_s)
    uneven = nodes & (nodes - 1) and collective != "all_gather"
    hier_from = NETWORK_HIER_FROM[collective]
    if inter_bytes_per_s and collective != "all_reduce":
        hier_from = min(hier_from, int(inter_bytes_per_s * NETWORK_HIER_LINK_SECONDS))
    bound = latency_bound(nbytes, local_size, inter_bytes_per_s, inter_latency_s)
    # A latency-bound reduce-scatter takes the hierarchy even where MPICH runs recursive halving: pccl's steps between
    # nodes wait for their receives only (4 x 2, RTT 20 ms: hier:recursive_halving 35.3 / 40.3 ms at 64 / 256 KiB
    # against MPICH's 41.8 / 42.8; its all-gathers tied, 41.0 / 42.3 against 41.9 / 42.6, and stay MPI's own).
    if flat_runs_lg_p(collective, nbytes, nodes * local_size, inter_bytes_per_s, inter_latency_s) and not (
            bound and collective == "reduce_scatter"):
        return "mpi"
    if bound:
        return HIER_PREFIX + LATENCY_OPTIMAL[collective]
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
