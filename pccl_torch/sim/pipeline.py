"""How many chunks a pipelined hierarchical call is cut into (``hier:pipelined``).

More chunks overlap more of the intra-node phases with the inter-node one, but every chunk pays each
phase's latency again. With the machine's parameters the cost model picks the count of least predicted
time (``costs.best_chunks``) among powers of two, no chunk smaller than ``costs.MIN_CHUNK_BYTES`` of the
full buffer. Without machine parameters, chunks of :data:`DEFAULT_CHUNK_BYTES` (on the 1 Gbit/s testbed,
1 MiB chunks of the full buffer were as fast as any count tried, 1 to 64, at 4-64 MiB). ``PCCL_PIPELINE_CHUNKS=k``
fixes the count (read once per process; for measurements such as pipelined vs unpipelined).
"""

from __future__ import annotations

import functools
import os

from pccl_torch.plan import HIER_PREFIX, PIPELINED
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


def pipeline_chunks(collective: str, nbytes: int, nodes: int, local_size: int,
                    machine: MachineProfile | None, algorithm: str = HIER_PREFIX + PIPELINED) -> int:
    """The chunk count of a pipelined call (``algorithm``) of ``collective`` on a full buffer of ``nbytes`` bytes."""
    fixed = _fixed_chunks()
    if fixed is not None:
        return fixed
    if machine is None:
        return max(1, min(max_chunks(nbytes), -(-nbytes // DEFAULT_CHUNK_BYTES)))
    return best_chunks(collective, nbytes, nodes, local_size, machine, algorithm)


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
