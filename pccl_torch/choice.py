"""Choosing the algorithm of each call: the one place it happens (the API layer, above the communicator).

For every communicator the API keeps a :class:`Choice`: ``PCCL_ALGO`` (read once when it is attached, as
NCCL reads ``NCCL_ALGO``), the selector (rank 0's profile, broadcast, so every rank holds the same one), and
the plans already resolved per call shape. Order: explicit ``algorithm=``, then ``PCCL_ALGO``, then the
selector, then the heuristic; across a network (several hosts) the measured rule of
``heuristic.networked_choice`` comes before the selector, whose profile cannot tell a network from memory. A plan whose intra-node library does not serve the communicator's device
fails here, before any communication; a pipelined plan gets its chunk count here (``sim.pipeline``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from pccl_torch import heuristic
from pccl_torch.algorithms import Collective
from pccl_torch.communicator import Communicator
from pccl_torch.compression import config as compression_config
from pccl_torch.plan import Plan, env_overrides, resolve
from pccl_torch.selector.profile import Profile, ProfileError
from pccl_torch.selector.runtime import Selector, profile_path
from pccl_torch.sim.pipeline import pipeline_chunks
from pccl_torch.transport.base import Transport

_PLANS_MAX = 4096


@dataclass(eq=False)
class Choice:
    """The algorithm-choice state of one communicator; identical on every rank of it."""

    selector: Selector | None = None
    """The learned choice (None: the heuristic)."""
    overrides: dict[str, str] = field(default_factory=env_overrides)
    """``PCCL_ALGO`` per collective (a malformed value fails when the choice is made)."""
    compression: dict[str, str] = field(default_factory=compression_config.env_formats)
    """``PCCL_COMPRESSION`` per collective (read once, like ``PCCL_ALGO``)."""
    plans: dict[tuple, Plan] = field(default_factory=dict, repr=False)
    """Resolved plans per (collective, algorithm or None, bytes, dtype, compression argument)."""

    def plan(self, comm: Communicator, collective: Collective, algorithm: str | None, nbytes: int,
             dtype: torch.dtype, compression: str | None = None) -> Plan:
        """The plan of one call; a repeated call shape pays one dict lookup. An explicit ``compression``
        that does not apply to ``dtype`` raises (before any communication)."""
        key = (collective, algorithm, nbytes, dtype, compression)
        plan = self.plans.get(key)
        if plan is None:
            plan = self._decide(comm, collective, algorithm, nbytes, dtype)
            wire = compression_config.for_call(collective, compression, self.compression, dtype)
            if wire is not None:
                plan = plan.compressed(wire)
            if len(self.plans) >= _PLANS_MAX:  # bounded: programs with ever-new sizes start over
                self.plans.clear()
            self.plans[key] = plan
        return plan

    def _decide(self, comm: Communicator, collective: Collective, algorithm: str | None, nbytes: int,
                dtype: torch.dtype) -> Plan:
        topo = comm.topology
        name = algorithm or self.overrides.get(collective)
        if not name and topo.networked and topo.is_hierarchical:
            # Nothing the selector was trained on tells a network from a memory bus: across one, the
            # measured rule (heuristic.networked_choice) decides until link-aware features exist.
            name = heuristic.networked_choice(collective, nbytes, topo.num_nodes)
        if not name and self.selector is not None:
            name = self.selector.choose(collective, nbytes, topo, dtype.itemsize, comm.device.type)
        plan = resolve(collective, name or heuristic.choose(collective, nbytes, topo))
        if plan.hierarchical:
            comm.intra_level("mpi" if plan.pipelined else plan.intra)  # a library this device lacks: ValueError
        if plan.pipelined:
            # The selector's machine parameters were fitted without the network (no link-aware features
            # yet): the chunk count comes from the fixed chunk size, not from them.
            plan = dataclasses.replace(plan, chunks=pipeline_chunks(collective, nbytes, topo.num_nodes, topo.local_size,
                                                                    None))
        return plan


def _agreed_selector(world: Transport) -> Selector | None:
    """Rank 0 reads the selector profile and broadcasts its text, so every rank holds the same one and
    makes the same choice for the same call; a bad profile fails on every rank with the same error."""
    text = origin = error = None
    if world.rank == 0:
        try:
            path = profile_path()
            if path is not None:
                origin, text = str(path), path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            error = f"cannot read selector profile {origin or path}: {exc.strerror}"
    text, origin, error = world.broadcast_json((text, origin, error))
    if error:
        raise ProfileError(error)
    return None if text is None else Selector(Profile.from_json(text, origin), origin)


def attach(comm: Communicator) -> Choice:
    """Give ``comm`` its choice state. Collective over the communicator (the profile is broadcast)."""
    comm.choice = Choice(selector=_agreed_selector(comm.world))
    return comm.choice


def choice_of(comm: Communicator) -> Choice:
    """``comm``'s choice state; one without a selector (the heuristic, the same on every rank) for a
    communicator nobody attached one to."""
    choice = comm.choice
    if choice is None:
        choice = comm.choice = Choice()
    return choice  # type: ignore[return-value]
