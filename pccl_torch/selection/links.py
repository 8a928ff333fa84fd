"""The links a communicator's collectives cross, measured when its choice state is attached.

What tells emulated nodes sharing memory from the same layout behind a network is the link between the nodes:
its latency and bandwidth against those inside a node. Rank 0's measurement is broadcast, so every rank
decides with the same numbers. Measured with the levels pccl runs on: local ranks 0 and 1 of node 0 exchange
over the intra-node level, then local rank 0 of nodes 0 and 1 over the inter-node level (``sendrecv``: both
directions at once, as the collectives use a link); everyone else waits. A few milliseconds at 1 Gbit/s.

Results are kept per host set and layout in ``~/.cache/pccl-torch/links.json`` (``XDG_CACHE_HOME``). A cached
entry is re-checked with one exchange between nodes and measured again when that exchange is more than
``CHECK_TOLERANCE`` times off, or when a small exchange answers that far from the cached latency: a testbed re-shaped
to another rate or delay keeps its host names. The bandwidth check lasts several of the cached latencies
(:func:`bandwidth_bytes`): at RTT 20 ms a 64 KiB exchange took one round trip at 200 Mbit/s and at 1 Gbit/s alike,
and a 1 Gbit/s testbed kept the 200 Mbit/s entry (2026-12-07).
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import socket
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pccl_torch import cache_file
from pccl_torch.cuda_streams import host_wait

if TYPE_CHECKING:
    from pccl_torch.communicator import Communicator
    from pccl_torch.transport.base import Transport

log = logging.getLogger(__name__)

LATENCY_BYTES = 8
LATENCY_ROUNDS = 10
BANDWIDTH_BYTES = {"intra": 1 << 20, "inter": 256 * 1024}
"""Bytes of the bandwidth exchanges: shared memory needs a larger message than a network to time above the noise
of ranks sharing cores (1 MiB: ~0.3 ms here; 256 KiB: ~2 ms at 1 Gbit/s, ~10 ms at 200 Mbit/s)."""
BANDWIDTH_ROUNDS = 4
LATENCY_SPAN = 4
"""The bandwidth exchange lasts at least this many one-way latencies at :data:`NOMINAL_BYTES_PER_S`: on a link
with latency (20 ms round trip) a 256 KiB exchange is mostly latency and TCP's first window, and its bandwidth
came out ~5x low (182 Mbit/s on a 1 Gbit/s testbed link)."""
NOMINAL_BYTES_PER_S = 125e6
"""1 Gbit/s: the rate the exchange's size is chosen for (a faster link only makes the exchange shorter)."""
MAX_BANDWIDTH_BYTES = 16 << 20
CHECK_BYTES = 64 * 1024
CHECK_TOLERANCE = 2.0
CHECK_LATENCY_FLOOR_S = 0.5e-3
"""Added to both latencies the check compares: below a millisecond, ranks sharing cores move a small exchange's time
by more than ``CHECK_TOLERANCE`` from run to run, and nothing the choice does changes there."""
CACHE_FORMAT = "pccl-links-1"


@dataclass(frozen=True)
class Link:
    """One link's one-way latency and bandwidth (each direction, both in use at once)."""

    latency_s: float
    bytes_per_s: float

    def time(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bytes_per_s


@dataclass(frozen=True)
class Links:
    """Inside a node and between nodes (None where the layout has no such link: one rank a node, one node)."""

    intra: Link | None
    inter: Link | None
    source: str
    """``measured`` (this run), ``cache`` (an earlier run's, re-checked) or ``none`` (nothing to measure)."""

    def ratio(self) -> float:
        """How many times the intra-node link's bandwidth the inter-node one's is short of (1: no difference
        known, as on emulated nodes sharing memory)."""
        if self.intra is None or self.inter is None:
            return 1.0
        return max(self.intra.bytes_per_s / self.inter.bytes_per_s, 1.0)

    def as_dict(self) -> dict:
        return {"intra": asdict(self.intra) if self.intra else None, "inter": asdict(self.inter) if self.inter else None,
                "source": self.source, "ratio": round(self.ratio(), 3)}

    @classmethod
    def from_dict(cls, data: dict, source: str) -> Links:
        def link(entry: dict | None) -> Link | None:
            return None if entry is None else Link(float(entry["latency_s"]), float(entry["bytes_per_s"]))
        return cls(link(data.get("intra")), link(data.get("inter")), source)


NONE = Links(None, None, "none")


def _exchange(transport: Transport, peer: int, nbytes: int, rounds: int,
              device: torch.device = torch.device("cpu")) -> list[float]:
    """Seconds of each of ``rounds`` exchanges of ``nbytes`` with ``peer`` (which runs the same loop), with the
    bytes where the level takes a collective's data on ``device`` (a CUDA level's exchanges timed to the GPU's end)."""
    where = transport.control_device(device)
    send = torch.zeros(max(nbytes, 1), dtype=torch.uint8, device=where)
    recv = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=where)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        transport.sendrecv(send, peer, recv, peer)
        if where.type == "cuda":
            host_wait(torch.cuda.current_stream(where))  # set-up only; an event, as sync-debug mode allows
        times.append(time.perf_counter() - start)
    return times


def _measure_pair(transport: Transport, peer: int, nbytes: int, device: torch.device) -> Link:
    """Latency: the median small exchange; bandwidth: the fastest large one, less that latency. The large one is
    at least ``nbytes`` and long enough to outlast the latency (:func:`bandwidth_bytes`, the pair's larger
    latency, so both sides exchange the same size)."""
    _exchange(transport, peer, LATENCY_BYTES, 2, device)  # connect
    latency = statistics.median(_exchange(transport, peer, LATENCY_BYTES, LATENCY_ROUNDS, device))
    nbytes = bandwidth_bytes(nbytes, max(latency, _peer_value(transport, peer, latency, device)))
    large = min(_exchange(transport, peer, nbytes, BANDWIDTH_ROUNDS, device))
    return Link(latency, nbytes / max(large - latency, 1e-9))


def bandwidth_bytes(least: int, latency_s: float) -> int:
    """Bytes of a bandwidth exchange over a link of one-way ``latency_s``: ``least``, or the power of two that lasts
    :data:`LATENCY_SPAN` latencies at :data:`NOMINAL_BYTES_PER_S` (at most :data:`MAX_BANDWIDTH_BYTES`)."""
    wanted = LATENCY_SPAN * latency_s * NOMINAL_BYTES_PER_S
    if wanted <= least:
        return least
    return min(1 << math.ceil(math.log2(wanted)), MAX_BANDWIDTH_BYTES)


def _peer_value(transport: Transport, peer: int, value: float, device: torch.device) -> float:
    """``peer``'s ``value`` for this rank's: one float64 each way on the level's control device for ``device``'s
    data (a CUDA tensor over NCCL, read back through pinned memory and an event, as sync-debug mode allows)."""
    where = transport.control_device(device)
    mine = torch.tensor([value], dtype=torch.float64, device=where)
    theirs = torch.empty(1, dtype=torch.float64, device=where)
    transport.sendrecv(mine, peer, theirs, peer)
    if where.type == "cuda":
        host = torch.empty(1, dtype=torch.float64, pin_memory=True)
        host.copy_(theirs, non_blocking=True)
        host_wait(torch.cuda.current_stream(where))
        theirs = host
    return float(theirs[0])


def _pairs(comm: Communicator) -> tuple[tuple[Transport, int] | None, tuple[Transport, int] | None]:
    """This rank's part in the two exchanges: (intra-node level, peer) and (inter-node level, peer), or None."""
    t = comm.topology
    intra = inter = None
    if t.node == 0 and t.local_size > 1 and t.local_rank < 2:
        intra = (comm.intra, 1 - t.local_rank)
    if t.num_nodes > 1 and t.local_rank == 0 and t.node < 2:
        inter = (comm.inter, 1 - t.node)
    return intra, inter


def _host_key(comm: Communicator) -> str:
    """The same string on every rank: the hosts and network namespaces of every node, and the layout."""
    here = f"{socket.gethostname()}/{_netns()}/{comm.transport}"
    mine = torch.frombuffer(bytearray(hashlib.blake2b(here.encode(), digest_size=16).digest()), dtype=torch.uint8)
    every = torch.empty(16 * comm.topology.world_size, dtype=torch.uint8)
    comm.control.native_all_gather(every, mine)
    t = comm.topology
    return hashlib.blake2b(bytes(every.tolist()) + f"{t.world_size}x{t.local_size}".encode(),
                           digest_size=16).hexdigest()


def _netns() -> str:
    try:
        return str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        return "-"


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pccl-torch" / "links.json"


def _read_cache(path: Path) -> dict:
    return cache_file.read(path, CACHE_FORMAT, "links")


def _write_cache(path: Path, key: str, links: Links) -> None:
    entries = dict(_read_cache(path).get("entries", {}))
    entries[key] = links.as_dict()
    cache_file.write(path, CACHE_FORMAT, "links", entries)


def _cached(comm: Communicator, path: Path | None, key: str) -> Links | None:
    """Rank 0's cached entry for ``key``, re-checked by one inter-node exchange; None when absent or off."""
    entry = None
    if comm.topology.rank == 0 and path is not None:
        entry = _read_cache(path).get("entries", {}).get(key)
    entry = comm.control.broadcast_json(entry)
    if not isinstance(entry, dict):
        return None
    try:
        links = Links.from_dict(entry, "cache")
    except (KeyError, TypeError, ValueError):
        return None
    _, inter = _pairs(comm)
    ok = True
    if inter is not None and links.inter is not None:
        _exchange(*inter, LATENCY_BYTES, 2, comm.device)  # connect
        latency = statistics.median(_exchange(*inter, LATENCY_BYTES, 3, comm.device))
        nbytes = bandwidth_bytes(CHECK_BYTES, links.inter.latency_s)  # long enough for the bandwidth to show
        seconds = min(_exchange(*inter, nbytes, 3, comm.device))
        expected = links.inter.time(nbytes)
        # The latency on its own too: at 10 ms one way the bandwidth check lasts 8 MiB, and a testbed re-shaped to
        # RTT 1 ms (the same rate) took 0.8 of the time expected: the 20 ms entry stood (2026-12-07).
        answered = (latency + CHECK_LATENCY_FLOOR_S) / (links.inter.latency_s + CHECK_LATENCY_FLOOR_S)
        ok = all(1 / CHECK_TOLERANCE <= ratio <= CHECK_TOLERANCE for ratio in (seconds / expected, answered))
    return links if comm.control.broadcast_json(ok) else None


def measure(comm: Communicator, cache: Path | None = None) -> Links:
    """The communicator's links (collective over it): from the cache when it still holds, else measured."""
    t = comm.topology
    if t.world_size == 1 or (t.local_size == 1 and t.num_nodes == 1):
        return NONE
    key = _host_key(comm)
    links = _cached(comm, cache, key)
    if links is not None:
        return links
    intra_pair, inter_pair = _pairs(comm)
    comm.control.barrier()
    intra = _measure_pair(*intra_pair, BANDWIDTH_BYTES["intra"], comm.device) if intra_pair else None
    comm.control.barrier()
    inter = _measure_pair(*inter_pair, BANDWIDTH_BYTES["inter"], comm.device) if inter_pair else None
    measured = {"intra": asdict(intra) if intra else None, "inter": asdict(inter) if inter else None}
    links = Links.from_dict(comm.control.broadcast_json(measured), "measured")
    if t.rank == 0 and cache is not None:
        _write_cache(cache, key, links)
    return links
