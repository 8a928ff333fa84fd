"""The default algorithm choice until a trained selector exists (``algorithm=None``).

Rules after Thakur, Rabenseifner and Gropp (2005), MPICH's defaults: latency-optimal schedules for
small messages, bandwidth-optimal ones for large messages; hierarchical whenever there are several
nodes of several ranks, with the inter-node algorithm chosen on the inter-node message size.
``nbytes`` is the size of the full buffer (all-gather output, reduce-scatter input, all-reduce buffer).
"""

from __future__ import annotations

from pccl_torch.algorithms import Collective
from pccl_torch.plan import HIER_PREFIX
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
    if nbytes < SMALL_ALL_REDUCE:
        return "recursive_doubling"
    return "rabenseifner" if power_of_two or nbytes < MEDIUM else "ring"


def choose(collective: Collective, nbytes: int, topology: Topology) -> str:
    """Algorithm name for a call of ``collective`` on a full buffer of ``nbytes`` bytes."""
    if topology.world_size == 1:
        return "mpi"  # one rank: every schedule is a copy, and MPI's own has the least Python around it
    if not topology.is_hierarchical:
        return flat_choice(collective, nbytes, topology.world_size)
    # The inter-node phase moves N/P of the buffer (AG, RS), or its 1/L shard (AR).
    inter_bytes = nbytes // topology.local_size
    return HIER_PREFIX + flat_choice(collective, inter_bytes, topology.num_nodes)
