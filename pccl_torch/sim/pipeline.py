"""How many chunks a pipelined hierarchical call is cut into (``hier:pipelined``).

More chunks overlap more of the intra-node phases with the inter-node one, but every chunk pays each
phase's latency again. With the machine's parameters the cost model picks the count of least predicted
time (``costs.best_chunks``) among powers of two, no chunk smaller than ``costs.MIN_CHUNK_BYTES`` of the
full buffer. Without machine parameters, chunks of :data:`DEFAULT_CHUNK_BYTES` (on the 1 Gbit/s testbed,
1 MiB chunks of the full buffer were as fast as any count tried, 1 to 64, at 4-64 MiB). ``PCCL_PIPELINE_CHUNKS=k``
fixes the count (read once per process; for measurements such as pipelined vs unpipelined). Over a link with
latency no chunk is cut shorter than a few of its latencies, nor under 2 MiB (:func:`latency_chunk_cap`).
"""

from __future__ import annotations

import functools
import os

from pccl_torch.plan import HIER_PREFIX, PIPELINED
from pccl_torch.selection.heuristic import has_latency
from pccl_torch.sim.costs import best_chunks, max_chunks, pipelined_time, predict
from pccl_torch.sim.machine import MachineProfile

CHUNKS_ENV = "PCCL_PIPELINE_CHUNKS"
DEFAULT_CHUNK_BYTES = 1 << 20
#: A chosen (not named) pipelined plan stays pipelined under a fixed-size wire format from this many chunks;
#: below, it runs the unpipelined compressed schedule. On the 1 Gbit/s testbed (2 x 2, bf16) the pipelined
#: compressed forms were 1.2-1.7x faster than the unpipelined ones at 16-64 MiB but 0.9-0.95x at 4 MiB, with
#: 2, 4 or 8 chunks alike: every chunk adds its encode, decode and four exchanges' latency.
COMPRESSED_MIN_CHUNKS = 8


@functools.cache
def _fixed_chunks() -> int | None:
    raw = os.environ.get(CHUNKS_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= 1024:
        raise ValueError(f"{CHUNKS_ENV}={raw!r} must be an integer from 1 to 1024")
    return value


#: Over a link with latency, each chunk's inter-node bytes take at least this many one-way latencies: every chunk
#: pays its inter-node steps' latency. On the testbed (4 x 2, 1 Gbit/s, RTT 20 ms, 2026-12-07) the 1 MiB chunks of
#: a 16 MiB all-gather / all-reduce (16 chunks) took 555 / 849 ms, against 194-225 / 290-442 ms in 1 or 2 chunks;
#: at RTT 1 ms the span alone would leave the default chunks as they are (but see :data:`LATENCY_MIN_CHUNK_BYTES`).
LATENCY_CHUNK_SPAN = 3.0
#: Across a link with latency (``heuristic.HAS_LATENCY_FROM_S`` or more one way) no chunk is smaller than this much of
#: the full buffer. On the testbed (4 x 2, 1 Gbit/s, 2026-12-07, ``PCCL_PIPELINE_CHUNKS`` 2 / 4 / 8 / 16 beside
#: ``hier:mpi``, ``benchmarks/results/latency-regime/chunks/``) at RTT 1 ms the 4 MiB all-reduce took 63 / 70 / 84 /
#: 111 ms against 65-69 unpipelined, the all-gather 42 / 40 / 55 / 64 against 35-41; chunks of 2 MiB were within 5%
#: of the unpipelined plan at 4 and 16 MiB, where 512 KiB and 256 KiB ones lost 20-70%. Without added delay
#: 512 KiB chunks still kept up and 8 chunks of 16 MiB won 3-12%.
LATENCY_MIN_CHUNK_BYTES = 2 << 20


def latency_chunk_cap(nbytes: int, local_size: int, inter_latency_s: float, inter_bytes_per_s: float | None) -> int:
    """The most chunks a call of ``nbytes`` (full buffer) may be cut into over an inter-node link of one-way latency
    ``inter_latency_s`` and bandwidth ``inter_bytes_per_s``: each chunk's share of the inter-node bytes
    (``nbytes / local_size``) lasts :data:`LATENCY_CHUNK_SPAN` latencies, and across a link with latency
    (``heuristic.has_latency``) each chunk is :data:`LATENCY_MIN_CHUNK_BYTES` of the buffer or more. Unbounded
    (a large number) unmeasured."""
    if not inter_bytes_per_s or inter_latency_s <= 0:
        return 1 << 30
    least = LATENCY_CHUNK_SPAN * inter_latency_s * inter_bytes_per_s
    cap = int(nbytes / max(local_size, 1) // least)
    if has_latency(inter_bytes_per_s, inter_latency_s):
        cap = min(cap, nbytes // LATENCY_MIN_CHUNK_BYTES)
    return max(1, cap)


def pipeline_chunks(collective: str, nbytes: int, nodes: int, local_size: int,
                    machine: MachineProfile | None, algorithm: str = HIER_PREFIX + PIPELINED, *,
                    inter_latency_s: float = 0.0, inter_bytes_per_s: float | None = None) -> int:
    """The chunk count of a pipelined call (``algorithm``) of ``collective`` on a full buffer of ``nbytes`` bytes;
    with the inter-node link measured, no more than :func:`latency_chunk_cap` allows."""
    fixed = _fixed_chunks()
    if fixed is not None:
        return fixed
    if machine is None:
        chunks = max(1, min(max_chunks(nbytes), -(-nbytes // DEFAULT_CHUNK_BYTES)))
    else:
        chunks = best_chunks(collective, nbytes, nodes, local_size, machine, algorithm)
    return min(chunks, latency_chunk_cap(nbytes, local_size, inter_latency_s, inter_bytes_per_s))


def predict_as_run(collective: str, algorithm: str, nbytes: int, nodes: int, local_size: int,
                   profile: MachineProfile, chunks: int | None = None) -> float:
    """Predicted seconds of a call as pccl ran it: ``hier:pipelined`` in the chunks pccl cut it into (``chunks``,
    which pccl-bench records in a pipelined row; else :func:`pipeline_chunks` without machine parameters, as the
    API's choice does), not the model's best count (``costs.predict``); anything else as ``costs.predict`` prices
    it. What ``pccl-sim validate`` and the fit of ``chunk_overhead`` compare with measured rows."""
    if algorithm.endswith(":" + PIPELINED):
        if chunks is None:
            chunks = pipeline_chunks(collective, nbytes, nodes, local_size, None)
        return pipelined_time(collective, nbytes, nodes, local_size, profile, chunks, algorithm)
    return predict(collective, algorithm, nbytes, nodes, local_size, profile)
