"""pccl's choice for CUDA tensors across a network (several hosts of several GPUs): NCCL inside every node, and a
hierarchy only where the cost model predicts it clearly faster than NCCL's own collective.

Its own module because it asks the cost model (``pccl_torch.sim.costs``), which itself prices MPI's collectives with
the heuristic's rules (``heuristic.flat_choice``): beside the heuristic it would make the two import each other.
"""

from __future__ import annotations

import functools
import logging

from pccl_torch.algorithms import Collective
from pccl_torch.plan import HIER_PREFIX, PIPELINED, hierarchical_inner, intra_library
from pccl_torch.sim import costs, machine
from pccl_torch.sim.machine import MachineProfile

log = logging.getLogger(__name__)

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
