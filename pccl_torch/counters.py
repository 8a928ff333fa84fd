"""``pccl_torch.stats()``: what pccl ran, as plain dicts, for one communicator, one process group or all.

A training job touches several communicators: ``init()``'s, the ``pccl`` world group's, and one per
``dist.new_group(backend="pccl")`` (DeepSpeed's data-parallel groups, FSDP's mesh groups). ``stats("all")``
sums them, so "did every all-gather of this job go through pccl" is one call.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

import torch.distributed as dist

from pccl_torch import hotpath
from pccl_torch.communicator import Communicator, default_communicator, live_communicators

Source = Communicator | dist.ProcessGroup | Literal["all"] | None


def stats(source: Source = None) -> dict[str, dict]:
    """Counters of pccl's collectives: ``calls``, ``bytes`` (the caller's buffers), ``seconds``, by collective;
    ``algorithms`` (``"collective:algorithm" -> calls``); ``bypassed``: all-gathers, reduce-scatters and
    all-reduces that pccl process groups handed to the vendor library (tensors on a device pccl was not
    given), by ProcessGroup method; ``transport``: communicators by what carries their levels (``mpi`` under an
    MPI launch, ``torch:gloo`` / ``torch:nccl`` without one: ``pccl_torch.launcher``); ``tuning``: with online tuning,
    each call shape's candidates and their agreed times in microseconds, the one chosen and whether it was tuned
    in this run or read from the cache (``pccl_torch.selection.tuning``); ``links``: the latency and bandwidth
    measured inside and between nodes across a network (``pccl_torch.selection.links``; None on one machine);
    ``hotpath``: ``calls``, how many of the calls counted ran in the compiled hot path (``pccl_torch.hotpath``),
    and ``why_not`` where it is not used.

    ``source``: None, the communicator of ``init()``; a :class:`Communicator`; a ``pccl`` process group (its
    communicators); ``"all"``, every live communicator and pccl group of this process, summed.
    """
    from pccl_torch.integrations.torch_backend import PcclProcessGroup, bypassed, pccl_groups

    groups: list[PcclProcessGroup] = []
    if source is None:
        comms = [default_communicator()]
    elif isinstance(source, Communicator):
        comms = [source]
    elif isinstance(source, PcclProcessGroup):
        comms, groups = source.communicators(), [source]
    elif source == "all":
        comms, groups = live_communicators(), pccl_groups()
    else:
        raise TypeError(f"stats() takes a Communicator, a pccl process group, 'all' or None; got {source!r}")
    totals: dict[str, Counter] = {key: Counter() for key in ("calls", "bytes", "seconds", "algorithms", "bypassed", "transport")}
    for comm in comms:
        totals["calls"].update(comm.stats.calls)
        totals["bytes"].update(comm.stats.bytes)
        totals["seconds"].update(comm.stats.seconds)
        totals["algorithms"].update({f"{c}:{a}": n for (c, a), n in comm.stats.algorithms.items()})
        totals["transport"][comm.transport] += 1
    for group in groups:
        totals["bypassed"].update(bypassed(group))
    result: dict[str, dict] = {key: dict(counter) for key, counter in totals.items()}
    result["links"] = next((comm.choice.links.as_dict() for comm in comms if comm.choice is not None
                            and comm.choice.links.source != "none"), None)
    result["hotpath"] = {"calls": sum(hotpath.hits(comm) for comm in comms)}
    if not hotpath.available:
        result["hotpath"]["why_not"] = hotpath.why_not
    result["tuning"] = {key: entry for comm in comms if comm.choice is not None and comm.choice.tuner is not None
                        for key, entry in comm.choice.tuner.report.items()}
    return result
