"""Training cases: per configuration, every algorithm's time, measured (pccl-bench) or modelled (pccl-sim)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from pccl_torch.plan import valid_names
from pccl_torch.selection.learned.features import feature_vector
from pccl_torch.sim import costs
from pccl_torch.sim.machine import MachineProfile

_DTYPE_SIZE = {name: torch.tensor([], dtype=getattr(torch, name)).element_size()
               for name in ("float32", "float64", "float16", "bfloat16", "int32", "int64")}


@dataclass(frozen=True, slots=True)
class Case:
    """One configuration and the time (s) of every algorithm measured or modelled on it."""

    collective: str
    nbytes: int
    ranks: int
    local_size: int
    dtype_size: int
    link_ratio: float
    """Intra- over inter-node link bandwidth of the run (the rows' ``links.ratio``; 1 for rows without it)."""
    times: dict[str, float] = field(hash=False)
    source: str = "measured"
    link_latency_s: float = 0.0
    """One-way latency between nodes that the run's ``init()`` measured (the rows' ``links.inter``; 0 without it):
    not a feature, the range the profile says it was trained on (``Selector`` leaves links slower than that to
    the rules that know latency)."""

    @property
    def best(self) -> str:
        return min(self.times, key=self.times.__getitem__)

    def features(self) -> list[float]:
        return feature_vector(self.collective, self.nbytes, self.ranks, self.local_size, self.dtype_size,
                              self.link_ratio)

    def regret(self, algorithm: str) -> float:
        """How much slower ``algorithm`` is than the best of this case (0.1 = 10% slower)."""
        return self.times[algorithm] / self.times[self.best] - 1.0


def cases_from_bench(rows: Iterable[dict]) -> list[Case]:
    """Group pccl-bench rows of explicit pccl algorithms (``--backends pccl:all``) by configuration.

    Rows with wrong results and pccl's own (auto) rows are left out; baselines are not pccl algorithms. The
    link ratio comes from the rows' ``links`` (pccl-bench records what ``init()`` measured); rows written before
    pccl measured links count as one machine without a network (ratio 1).
    """
    grouped: dict[tuple, dict[str, float]] = defaultdict(dict)
    latency: dict[tuple, float] = defaultdict(float)
    for r in rows:
        if r["backend"] != "pccl" or r.get("auto") or r.get("wrong", 0) > 0:
            continue
        key = (r["collective"], r["size_bytes"], r["ranks"], r["local_size"], _DTYPE_SIZE[r["dtype"]], _ratio(r))
        grouped[key][r["algorithm"]] = r["time_us"] * 1e-6
        latency[key] = max(latency[key], _inter_latency(r))
    return [Case(*key, times=times, link_latency_s=latency[key])
            for key, times in sorted(grouped.items()) if len(times) > 1]


def _ratio(row: dict) -> float:
    links = row.get("links")
    return float(links.get("ratio", 1.0)) if isinstance(links, dict) else 1.0


def _inter_latency(row: dict) -> float:
    links = row.get("links")
    inter = links.get("inter") if isinstance(links, dict) else None
    return float(inter.get("latency_s", 0.0)) if isinstance(inter, dict) else 0.0


def cases_from_model(profile: MachineProfile, layouts: Iterable[tuple[int, int]], sizes: Iterable[int],
                     dtype_size: int = 4) -> list[Case]:
    """Cost-model predictions for (ranks, local_size) layouts the machine cannot run."""
    cases = []
    for ranks, local in layouts:
        for collective in ("all_gather", "reduce_scatter", "all_reduce"):
            for nbytes in sizes:
                times = {a: costs.predict(collective, a, nbytes, ranks // local, local, profile)
                         for a in valid_names(collective)}
                cases.append(Case(collective, nbytes, ranks, local, dtype_size, 1.0, times, source="model"))
    return cases
