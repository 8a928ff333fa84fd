"""Online tuning (``PCCL_TUNE=online``): a training job repeats the same few call shapes thousands of times, so it
can time its own choices instead of trusting a model trained elsewhere.

For a new call shape (collective, bytes, dtype) the first ``len(candidates) * (warmup + trials)`` calls run the
candidates in turn (one untimed round, :data:`WARMUP`, then :data:`TRIALS` timed calls each, :data:`SMALL_TRIALS`
for small calls): the choice the model would make first (so a shape called once costs nothing), then the model's next
best, never one it predicts :data:`SLOWER_BOUND` times slower than its best. Every rank times its own calls; at
the next call of the shape the ranks agree on each candidate's time as the slowest rank's median (one
all-reduce over ``comm.control``, after the queued calls have finished), so every rank locks in the same one
whatever its clock or load: the fastest, when it beats the model's choice by more than :data:`SWITCH_MARGIN`. Decisions go to a cache file (rank 0 writes it; every rank reads rank 0's copy
at the next run), keyed by the layout, the transport and the device, so a rerun explores nothing; an entry that
does not belong there (another layout, an unknown algorithm, a corrupt file) is rejected with a warning and
never run. ``pccl_torch.stats()["tuning"]`` shows what was tried and chosen.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pccl_torch import cache_file
from pccl_torch.errors import PcclTimeoutError, Stalled
from pccl_torch.ops import ReduceOp
from pccl_torch.plan import Plan, names_for

log = logging.getLogger(__name__)

TUNE_ENV = "PCCL_TUNE"
TUNE_MODES = ("off", "online")
CACHE_ENV = "PCCL_TUNE_CACHE"
CACHE_FORMAT = "pccl-tuned-choices"
TRIALS = 3
"""Timed calls of each candidate from :data:`SMALL_BYTES` on (the median is kept: one slow call does not decide)."""
SMALL_TRIALS = 7
"""Timed calls of each candidate below :data:`SMALL_BYTES`: cheap calls whose times jitter by milliseconds where
ranks share cores (3 calls each chose worse than the model at 7 of 15 testbed points, 1 Gbit/s)."""
SMALL_BYTES = 1 << 20
WARMUP = 1
"""Untimed calls of each candidate before its trials: a candidate's first calls of a new size are slower while its
waits learn their spin (``transport.mpi``) and its buffers warm up; on one machine, timed from the first call,
MPICH's all-reduce measured 5.3 ms at 4 MiB in exploration against 2.7 ms afterwards, and the flat ring won
the shape at 1.5x its time."""
SWITCH_MARGIN = 0.9
"""An alternative replaces the model's choice only when its agreed time is below this fraction of the choice's:
the model's choice is the prior, and a difference inside the noise keeps it."""
CANDIDATES = 4
"""Candidates per shape: the model's choice and its next best."""
SLOWER_BOUND = 4.0
"""Never explore a candidate the model predicts this many times slower than its best."""
MAX_SHAPES = 256
"""Shapes explored per communicator; beyond it (programs with ever-new sizes) the model decides alone."""
POOL = ("mpi", "hier:mpi", "hier:ring", "hier:pipelined", "hier:recursive_doubling", "hier:bruck",
        "hier:recursive_halving", "ring", "rabenseifner", "recursive_doubling", "bruck", "recursive_halving",
        "pairwise", "vendor")
"""Where alternatives come from: the flat library call, the hierarchical compositions (with the lg N schedules
between nodes that win across links with latency: ``heuristic.LATENCY_OPTIMAL``), the flat schedules (under
torchrun the flat ring and pairwise reduce-scatters over gloo beat every hierarchical one, 1.3-1.7x)."""


def mode_from_env(explicit: str | None = None) -> str:
    """``explicit`` (``init(tune=...)``), else ``PCCL_TUNE`` (unset: ``off``); anything else raises."""
    source = "init(tune=...)" if explicit is not None else TUNE_ENV
    mode = (explicit if explicit is not None else os.environ.get(TUNE_ENV, "")).strip().lower() or TUNE_MODES[0]
    if mode not in TUNE_MODES:
        raise ValueError(f"{source}: {mode!r} is not a valid tuning mode; expected one of {', '.join(TUNE_MODES)}")
    return mode


def default_cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pccl-torch"
    return Path(os.environ[CACHE_ENV]) if os.environ.get(CACHE_ENV, "").strip() else base / "tuned.json"


def shape_key(collective: str, nbytes: int, dtype: torch.dtype) -> str:
    return f"{collective}:{nbytes}:{str(dtype).removeprefix('torch.')}"


@dataclass
class Exploration:
    """One shape being tuned: the candidates, the times this rank measured, the calls issued so far."""

    candidates: list[Plan]
    trials: int = TRIALS
    samples: list[list[float]] = field(default_factory=list)
    issued: int = 0
    warmup: int = WARMUP

    def __post_init__(self) -> None:
        self.samples = [[] for _ in self.candidates]

    @property
    def exploring(self) -> bool:
        return self.issued < len(self.candidates) * (self.warmup + self.trials)

    def next_plan(self) -> Plan:
        """The candidate of the next call: in turn, first untimed (:data:`WARMUP` rounds), then with a probe
        recording its time."""
        index = self.issued % len(self.candidates)
        warming = self.issued < len(self.candidates) * self.warmup
        self.issued += 1
        return self.candidates[index] if warming else dataclasses.replace(self.candidates[index],
                                                                          probe=self.samples[index].append)


@dataclass
class Tuner:
    """The online-tuning state of one communicator (identical decisions on every rank)."""

    layout: dict
    """What a cache entry must match: ranks, nodes, ranks per node, hosts, transport, device."""
    cache_path: Path | None = None
    locked: dict[str, str] = field(default_factory=dict)
    """Shape -> the algorithm chosen (online or from the cache)."""
    report: dict[str, dict] = field(default_factory=dict)
    """Shape -> {"tried": {algorithm: slowest rank's median us}, "chosen": ..., "source": online|cache}."""
    exploring: dict[str, Exploration] = field(default_factory=dict)

    def plan(self, comm, key: str, nbytes: int, default: Plan, alternatives: Callable[[], list[str]],
             make: Callable[[str], Plan], *, issued: bool = True) -> Plan:
        """The plan of the next call of shape ``key`` (called in issue order, the same on every rank):
        ``default`` is the model's choice, ``alternatives`` the model's next best names, ``make`` a name's plan.
        ``issued=False``: a question, not a call: the choice so far (locked, else the model's), nothing counted."""
        chosen = self.locked.get(key)
        if chosen is not None or not issued:
            return default if chosen in (None, default.name) else make(chosen)
        trial = self.exploring.get(key)
        if trial is None:
            if len(self.exploring) + len(self.report) >= MAX_SHAPES:
                return default
            names = [n for n in alternatives() if n != default.name][:CANDIDATES - 1]
            if not names:
                self.locked[key] = default.name
                return default
            trial = self.exploring[key] = Exploration([default, *map(make, names)],
                                                      SMALL_TRIALS if nbytes < SMALL_BYTES else TRIALS)
        if trial.exploring:
            return trial.next_plan()
        return self._lock(comm, key, trial)

    def _lock(self, comm, key: str, trial: Exploration) -> Plan:
        """Agree on the fastest candidate: every queued call done, then the slowest rank's median of each."""
        comm.executor.drain()
        medians = torch.tensor([statistics.median(s) if s else float("inf") for s in trial.samples],
                               dtype=torch.float64)
        try:
            comm.control.native_all_reduce(medians, ReduceOp.MAX)
        except Stalled as exc:  # a peer died or never reached this call: as any collective's timeout
            error = PcclTimeoutError(key.split(":", 1)[0], comm.sequence, "tuning agreement", comm.topology.rank, exc)
            comm.mark_broken(error)
            raise error from exc
        best = int(torch.argmin(medians))
        winner = trial.candidates[best if medians[best] < SWITCH_MARGIN * medians[0] else 0]
        del self.exploring[key]
        self.locked[key] = winner.name
        self.report[key] = {"tried": {p.name: round(float(t) * 1e6, 1) for p, t in zip(trial.candidates, medians)},
                            "chosen": winner.name, "source": "online"}
        if comm.topology.rank == 0:
            log.info("pccl tuning: %s -> %s (%s)", key, winner.name, self.report[key]["tried"])
            self._save()
        return winner

    # -- the cache --------------------------------------------------------------------------------------
    def adopt(self, entries: dict[str, str], origin: str, valid: Callable[[str], list[str]]) -> None:
        """Take the cache's choices (``shape -> algorithm``), rejecting any that could not run here."""
        for key, name in entries.items():
            collective = key.split(":", 1)[0]
            if not isinstance(name, str) or name not in valid(collective):
                log.warning("pccl tuning: ignoring cache entry %s -> %r from %s: not an algorithm of %s here",
                            key, name, origin, collective)
                continue
            self.locked[key] = name
            self.report[key] = {"tried": {}, "chosen": name, "source": "cache"}

    def _save(self) -> None:
        if self.cache_path is None:
            return
        entries = [e for e in cache_file.read(self.cache_path, CACHE_FORMAT, "tuning").get("entries", [])
                   if isinstance(e, dict) and e.get("layout") != self.layout]
        entries.append({"layout": self.layout, "choices": dict(self.locked)})
        if not cache_file.write(self.cache_path, CACHE_FORMAT, "tuning", entries) and self.cache_path.exists():
            self.cache_path = None  # another kind of file there: warned once, never overwritten


def cache_entries(path: Path) -> list[dict]:
    """The well-formed entries of the cache at ``path`` (``{"layout": {...}, "choices": {shape: algorithm}}``)."""
    return [e for e in cache_file.read(path, CACHE_FORMAT, "tuning").get("entries", [])
            if isinstance(e, dict) and isinstance(e.get("layout"), dict) and isinstance(e.get("choices"), dict)]


def cached_choices(path: Path, layout: dict) -> dict[str, str]:
    """The choices ``path`` holds for ``layout`` (rank 0 reads it; the others get them broadcast)."""
    for entry in cache_entries(path):
        if entry["layout"] == layout:
            return dict(entry["choices"])
    return {}


def layout_of(comm) -> dict:
    t = comm.topology
    return {"ranks": t.world_size, "nodes": t.num_nodes, "local_size": t.local_size, "hosts": t.hosts,
            "transport": comm.transport, "device": comm.device.type}


def valid_names(device: str) -> Callable[[str], list[str]]:
    def names(collective: str) -> list[str]:
        try:
            return names_for(collective, device)  # type: ignore[arg-type]
        except (ValueError, KeyError):
            return []
    return names
