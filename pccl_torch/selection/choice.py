"""Choosing the algorithm of each call: the one place it happens (the API layer, above the communicator).

For every communicator the API keeps a :class:`Choice`: ``PCCL_ALGO`` (read once when it is attached, as
NCCL reads ``NCCL_ALGO``), the selector (rank 0's profile, broadcast, so every rank holds the same one), and
the plans already resolved per call shape, and the links measured when it is attached (``pccl_torch.selection.links``).
Order: explicit ``algorithm=``, then ``PCCL_ALGO``, then the selector, then the heuristic; across a network
(several hosts) the selector decides only when its profile was trained on links like the measured ones (the
link-ratio feature in range), and the measured rule of ``heuristic.networked_choice`` otherwise. A plan whose
intra-node library does not serve the communicator's device
fails here, before any communication; a pipelined plan gets its chunk count here (``sim.pipeline``). With
online tuning (``PCCL_TUNE=online``, ``pccl_torch.selection.tuning``) the calls that leave the choice to pccl (no
``algorithm=``, no ``PCCL_ALGO``, exact) try that choice and the model's next best in turn, then keep the fastest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from pccl_torch.selection import cuda_rule, heuristic, links, tuning
from pccl_torch.algorithms import Collective
from pccl_torch.communicator import Communicator
from pccl_torch.compression import config as compression_config
from pccl_torch.compression import schedules as compressed_schedules
from pccl_torch.plan import HIER_PREFIX, Plan, env_overrides, names_for, resolve
from pccl_torch.selection.learned.profile import Profile, ProfileError
from pccl_torch.selection.learned.runtime import Selector, profile_path
from pccl_torch.sim.pipeline import COMPRESSED_MIN_CHUNKS, pipeline_chunks
from pccl_torch.transport.base import Transport
from pccl_torch.selection.tuning import Tuner

_PLANS_MAX = 4096


@dataclass(eq=False)
class Choice:
    """The algorithm-choice state of one communicator; identical on every rank of it."""

    selector: Selector | None = None
    """The learned choice (None: the heuristic)."""
    overrides: dict[str, str] = field(default_factory=env_overrides)
    """``PCCL_ALGO`` per collective (read when the communicator is created; a malformed value fails ``init()``)."""
    compression: dict[str, str] = field(default_factory=compression_config.env_formats)
    """``PCCL_COMPRESSION`` per collective (read once, like ``PCCL_ALGO``)."""
    plans: dict[tuple, Plan] = field(default_factory=dict, repr=False)
    """Resolved plans per (collective, algorithm or None, bytes, dtype, compression argument)."""
    tuner: Tuner | None = None
    """Online tuning (``PCCL_TUNE=online``): the calls that leave the choice to pccl time its candidates."""
    tuned: dict[tuple, Plan] = field(default_factory=dict, repr=False)
    """The plans online tuning settled on, per call shape as :attr:`plans`: once a shape is decided, its calls
    skip the tuner (~1 us a call less)."""
    links: links.Links = links.NONE
    """The links between and inside nodes, rank 0's measurement; counted only across a network (several hosts):
    emulated nodes sharing memory are one machine however their exchanges happen to time."""

    def plan(self, comm: Communicator, collective: Collective, algorithm: str | None, nbytes: int,
             dtype: torch.dtype, compression: str | None = None, *, issued: bool = True) -> Plan:
        """The plan of one call; a repeated call shape pays one dict lookup. An explicit ``compression``
        that does not apply to ``dtype`` raises (before any communication). ``issued=False``: a question
        (``choose_algorithm``), not a call: online tuning answers with its current choice and counts nothing."""
        key = (collective, algorithm, nbytes, dtype, compression)
        settled = self.tuned.get(key)
        if settled is not None:
            return settled
        plan = self.plans.get(key)
        if plan is None:
            plan = self._decide(comm, collective, algorithm, nbytes, dtype)
            wire = compression_config.for_call(collective, compression, self.compression, dtype)
            if wire is not None and comm.topology.num_nodes > 1:  # on one node nothing crosses a network
                named = bool(algorithm) or collective in self.overrides
                if not named and comm.topology.networked and comm.topology.is_hierarchical:
                    name = heuristic.compressed_networked_choice(collective, plan.name)
                    plan = plan if name == plan.name else resolve(collective, name)
                if not named and collective == "all_to_all" and plan.name == heuristic.LATENCY_ALL_TO_ALL:
                    plan = resolve(collective, heuristic.NETWORK_ALL_TO_ALL)  # compressed: MPI's, as measured
                # pccl's own choice pipelines from enough chunks
                plan = plan.compressed(wire, pipeline=named or plan.chunks >= COMPRESSED_MIN_CHUNKS)
                if collective == "all_to_all" and not plan.hierarchical:  # in pieces where the link is slow
                    link = self.links.inter.bytes_per_s if self.links.inter else None
                    plan = dataclasses.replace(plan, chunks=compressed_schedules.chunk_count(nbytes, link))
            if len(self.plans) >= _PLANS_MAX:  # bounded: programs with ever-new sizes start over
                self.plans.clear()
                self.tuned.clear()
            self.plans[key] = plan
        if self.tuner is not None and algorithm is None and plan.compression is None and \
                collective not in self.overrides:
            shape = tuning.shape_key(collective, nbytes, dtype)
            model = plan
            chosen = self.tuner.plan(comm, shape, nbytes, model,
                                     lambda: self._alternatives(comm, collective, model.name, nbytes),
                                     lambda name: self.plan(comm, collective, name, nbytes, dtype), issued=issued)
            if shape in self.tuner.locked:  # decided: the tuner returns plans without a probe from here on
                self.tuned[key] = chosen
            return chosen
        return plan

    def bind_plan(self, comm: Communicator, collective: Collective, algorithm: str | None, nbytes: int,
                  dtype: torch.dtype, compression: str | None = None) -> tuple[Plan, bool]:
        """The plan of an issued call and whether it is final for its shape (the call-shape cache keeps it):
        everything but a shape online tuning is still trying candidates for."""
        plan = self.plan(comm, collective, algorithm, nbytes, dtype, compression)
        tuning_it = (self.tuner is not None and algorithm is None and plan.compression is None
                     and collective not in self.overrides)
        return plan, not tuning_it or (collective, algorithm, nbytes, dtype, compression) in self.tuned

    def _alternatives(self, comm: Communicator, collective: Collective, chosen: str, nbytes: int) -> list[str]:
        """What online tuning may try beside ``chosen``: the pool's names that run here, best predicted first by
        the selector's cost model where the profile has one, none predicted ``SLOWER_BOUND`` times its best."""
        topo = comm.topology
        valid = names_for(collective, comm.device.type, hierarchical=topo.is_hierarchical)
        pool = [n for n in tuning.POOL if n in valid and n != chosen]
        if comm.device.type == "cuda" and topo.is_hierarchical:  # never a candidate that stages a node's bytes
            pool = [n for n in pool if cuda_rule.cuda_keeps_intra_on_device(n, topo.local_size,
                                                                           not comm.inter.host_memory_only)]
        machine = self.selector.machine_profile(self.links) if self.selector is not None else None
        if machine is None or not pool:
            return pool
        from pccl_torch.sim import costs

        predicted = {n: costs.predict(collective, n, max(nbytes, 1), topo.num_nodes, topo.local_size, machine)
                     for n in [chosen, *pool]}
        best = min(predicted.values())
        return sorted((n for n in pool if predicted[n] <= tuning.SLOWER_BOUND * best), key=predicted.__getitem__)

    def _inter_link(self) -> tuple[float, float | None]:
        """The measured inter-node link as the rules take it: (one-way latency, 0 unmeasured; bandwidth or None)."""
        inter = self.links.inter
        return (inter.latency_s, inter.bytes_per_s) if inter is not None else (0.0, None)

    def _decide(self, comm: Communicator, collective: Collective, algorithm: str | None, nbytes: int,
                dtype: torch.dtype) -> Plan:
        """The plan of a call shape not yet decided: the name given (``algorithm=``, ``PCCL_ALGO``), else pccl's
        choice for the layout and device (CUDA tensors across a network: ``cuda_rule.cuda_networked_choice``, and a
        learned choice only where it keeps NCCL inside the node); a hierarchical plan's intra-node library is
        checked against the device here, before any communication."""
        topo = comm.topology
        name = algorithm or self.overrides.get(collective)
        named = bool(name)
        if not name and not topo.networked:
            # One machine: the ranks share memory, and the library's own flat collective is the fastest path
            # there (a hierarchy only adds copies; NOTES: 2-level on one host was 0.4-0.8x of flat MPI).
            name = heuristic.one_machine_choice(comm.device.type)
        if not name and topo.networked and topo.is_hierarchical and comm.device.type == "cuda":
            # CUDA across a network: NCCL inside every node, never host staging there. The learned choice stands
            # where it keeps that (else the cost model's rule decides); pipelines only where the inter-node level
            # takes device memory (the pipelined schedule stages a call once for both levels).
            pipelines = not comm.inter.host_memory_only
            if self.selector is not None and self.selector.covers(collective, nbytes, topo, dtype.itemsize, self.links):
                name = self.selector.choose(collective, nbytes, topo, dtype.itemsize, "cuda", self.links)
                if not cuda_rule.cuda_keeps_intra_on_device(name, topo.local_size, pipelines):
                    name = None
            name = name or cuda_rule.cuda_networked_choice(collective, nbytes, topo.num_nodes, topo.local_size,
                                                            pipelines)
        # CPU calls on flat layouts too (a rank a node): all-to-alls across any network (across a link in the latency
        # regime, large blocks go to the library that posts every message at once: heuristic.LATENCY_ALL_TO_ALL; no
        # profile covers all-to-all), the other collectives across a link in the latency regime
        # (heuristic.flat_latency_choice).
        latency_s, bytes_per_s = self._inter_link()
        flat_far = comm.device.type == "cpu" and (
            collective == "all_to_all" or heuristic.in_latency_regime(bytes_per_s, latency_s))
        if not name and topo.networked and (topo.is_hierarchical or flat_far) and not (
                self.selector is not None and self.selector.covers(collective, nbytes, topo, dtype.itemsize, self.links)):
            # A profile trained without such a network cannot tell it from a memory bus: the measured rule decides.
            name = heuristic.networked_choice(collective, nbytes, topo.num_nodes, bytes_per_s,
                                              inter_latency_s=latency_s, local_size=topo.local_size)
        if not name and self.selector is not None:
            name = self.selector.choose(collective, nbytes, topo, dtype.itemsize, comm.device.type, self.links)
        plan = resolve(collective, name or heuristic.choose(collective, nbytes, topo))
        if plan.hierarchical:
            comm.intra_level(plan.intra)  # a library this device lacks: ValueError
        if plan.pipelined:
            # The selector's machine parameters were fitted without the network (no link-aware features
            # yet): the chunk count comes from the fixed chunk size, not from them. CUDA tensors across a network
            # are cut as the GPU model of their choice predicts best (the fixed size was measured on CPUs: 32 chunks
            # of a 256 MiB call, where the model's best is 4, take it to 0.5-0.7x of NCCL's time, by the model).
            gpu = cuda_rule.cuda_machine() if comm.device.type == "cuda" and topo.networked else None
            if not topo.networked:  # the link measured between emulated nodes sharing memory is no network's
                latency_s, bytes_per_s = 0.0, None
            chunks = pipeline_chunks(collective, nbytes, topo.num_nodes, topo.local_size, gpu, plan.name,
                                     inter_latency_s=latency_s, inter_bytes_per_s=bytes_per_s)
            # One chunk has nothing to overlap: its unpipelined form (the same levels, unchunked) runs it.
            plan = dataclasses.replace(resolve(collective, HIER_PREFIX + "mpi") if chunks == 1 and not named
                                       else plan, chunks=chunks)
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


def attach(comm: Communicator, tune: str | None = None) -> Choice:
    """Give ``comm`` its choice state. Collective over the communicator (the profile is broadcast, and with
    online tuning (``tune``, else ``PCCL_TUNE``) rank 0's cached choices for this layout)."""
    choice = Choice(selector=_agreed_selector(comm.control))
    if comm.topology.networked:  # emulated nodes sharing memory are one machine: nothing to measure
        choice.links = links.measure(comm, links.default_cache())
    if tuning.mode_from_env(tune) == "online":
        layout, path = tuning.layout_of(comm), tuning.default_cache()
        cached = tuning.cached_choices(path, layout) if comm.topology.rank == 0 else None
        choice.tuner = tuning.Tuner(layout, path if comm.topology.rank == 0 else None)
        choice.tuner.adopt(comm.control.broadcast_json(cached) or {}, str(path), tuning.valid_names(comm.device.type))
    comm.choice = choice
    return choice


def choice_of(comm: Communicator) -> Choice:
    """``comm``'s choice state; one without a selector (the heuristic, the same on every rank) for a
    communicator nobody attached one to."""
    choice = comm.choice
    if choice is None:
        choice = comm.choice = Choice()
    return choice  # type: ignore[return-value]
