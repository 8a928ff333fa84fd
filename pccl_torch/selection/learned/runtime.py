"""The selector at run time: one lookup per (collective, dtype size, size bucket, layout), then cached.

Messages smaller than any trained one are decided as the smallest trained size (all latency-bound), larger
than any as the largest (all bandwidth-bound);
other calls outside the trained feature ranges fall back to the cost model with the machine parameters stored
in the profile (a warning, once), or to the heuristic when the profile has none. The choice is always a
name valid for the collective, and every rank holds the same profile (rank 0's, broadcast at init), so
every rank makes the same choice for the same call.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pccl_torch.selection import heuristic
from pccl_torch.selection.links import NONE as NO_LINKS
from pccl_torch.selection.links import Links
from pccl_torch.plan import names_for
from pccl_torch.selection.learned.features import LEARNED_COLLECTIVES, feature_vector, link_feature
from pccl_torch.selection.learned.profile import PROFILE_ENV, Profile
from pccl_torch.topology import Topology

log = logging.getLogger(__name__)

USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pccl-torch" / "profile.json"
LATENCY_MARGIN = 2.0
"""How much slower to answer than any trained link a measured one may be and still be covered."""
SHIPPED = Path(__file__).resolve().parents[3] / "configs" / "selector" / "default.json"


def profile_path() -> Path | None:
    """Where the profile comes from: ``PCCL_PROFILE``, then the per-user cache, then the shipped default.

    ``PCCL_PROFILE=none`` disables the selector (the heuristic decides); a ``PCCL_PROFILE`` that does not
    exist is an error rather than a silent fallback.
    """
    explicit = os.environ.get(PROFILE_ENV, "").strip()
    if explicit.lower() == "none":
        return None
    if explicit:
        return Path(explicit)
    for candidate in (USER_CACHE, SHIPPED):
        if candidate.is_file():
            return candidate
    return None


class Selector:
    """Chooses an algorithm per call from a :class:`Profile`; choices are cached."""

    def __init__(self, profile: Profile, origin: str = "profile") -> None:
        self.profile = profile
        self.origin = origin
        self._cache: dict[tuple, tuple[str, str]] = {}
        self._machine = None
        self._warned = False

    def choose(self, collective: str, nbytes: int, topology: Topology, dtype_size: int, device: str = "cpu",
               links: Links = NO_LINKS) -> str:
        return self.explain(collective, nbytes, topology, dtype_size, device, links)[0]

    def explain(self, collective: str, nbytes: int, topology: Topology, dtype_size: int,
                device: str = "cpu", links: Links = NO_LINKS) -> tuple[str, str]:
        """(algorithm, why): ``why`` is "profile", "cost model" or "heuristic". Only names that run on
        ``device`` tensors are chosen (never ``hier-gloo:`` for CUDA tensors). ``links``: what ``init()``
        measured (the link-ratio feature, and the inter-node parameters of the cost model)."""
        key = (collective, dtype_size, nbytes.bit_length(), topology.world_size, topology.local_size, device,
               link_feature(links.ratio()), self.latency_covered(links))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._decide(collective, nbytes, topology, dtype_size, device, links)
        return hit

    def covers(self, collective: str, nbytes: int, topology: Topology, dtype_size: int, links: Links) -> bool:
        """Whether the profile was trained on this call's collective, layout and links (sizes aside: those are
        clamped)."""
        if collective not in LEARNED_COLLECTIVES or not self.latency_covered(links):
            return False
        return self.profile.in_range(self._features(collective, nbytes, topology, dtype_size, links))

    def latency_covered(self, links: Links) -> bool:
        """Whether the profile was trained on links that answer about as slowly as the measured inter-node one: a
        link in the latency regime (``heuristic.LATENCY_REGIME_S``) more than twice as slow as any trained on (none,
        for profiles written before the range was recorded) is not covered, whatever its bandwidth ratio."""
        latency = links.inter.latency_s if links.inter is not None else 0.0
        trained = self.profile.metadata.get("link_latency_s", [0.0, 0.0])[1]
        return latency < heuristic.LATENCY_REGIME_S or latency <= LATENCY_MARGIN * trained

    def _features(self, collective: str, nbytes: int, topology: Topology, dtype_size: int, links: Links) -> list[float]:
        # Below the smallest trained size every schedule is latency-bound, above the largest bandwidth-bound:
        # decide as for that size.
        smallest, largest = self.profile.metadata.get("feature_ranges", {}).get("log2_bytes", [0.0, 64.0])[:2]
        sized = min(max(nbytes, int(2 ** smallest), 1), int(2 ** largest))
        return feature_vector(collective, sized, topology.world_size, topology.local_size, dtype_size, links.ratio())

    def _decide(self, collective: str, nbytes: int, topology: Topology, dtype_size: int,
                device: str, links: Links) -> tuple[str, str]:
        if topology.world_size == 1 or collective not in LEARNED_COLLECTIVES:
            return heuristic.choose(collective, nbytes, topology), "heuristic"
        valid = names_for(collective, device, hierarchical=topology.is_hierarchical)
        features = self._features(collective, nbytes, topology, dtype_size, links)
        if self.profile.in_range(features) and self.latency_covered(links):
            for name in self.profile.rank(features):
                if name in valid:
                    return name, "profile"
        if not self._warned and topology.rank == 0:  # every rank decides the same: say it once
            log.debug("pccl: %s (%d bytes, %d nodes x %d ranks) is outside what %s was trained on; using the %s",
                        collective, nbytes, topology.num_nodes, topology.local_size, self.origin,
                        "cost model" if self.profile.machine_profile else "heuristic")
            self._warned = True
        machine = self.machine_profile(links)
        if machine is None:
            return heuristic.choose(collective, nbytes, topology), "heuristic"
        from pccl_torch.sim import costs

        times = {a: costs.predict(collective, a, max(nbytes, 1), topology.num_nodes, topology.local_size, machine)
                 for a in valid}
        return min(times, key=times.__getitem__), "cost model"

    def machine_profile(self, links: Links = NO_LINKS):
        """The machine parameters stored in the profile (None without them), with the inter-node link's
        latency and bandwidth replaced by the measured ones when ``links`` has them."""
        if self._machine is None and self.profile.machine_profile:
            from pccl_torch.sim.machine import MachineProfile

            self._machine = MachineProfile.from_dict(self.profile.machine_profile)
        if self._machine is None or links.inter is None or links.ratio() <= 1.0:
            return self._machine
        return self._machine.with_inter_link(links.inter.latency_s, 1.0 / links.inter.bytes_per_s)
