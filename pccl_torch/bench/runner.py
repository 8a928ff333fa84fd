"""The measurement loop of pccl-bench: for each collective and size, every backend in turn, in a fresh
shuffled order each iteration (C A B, B C A, ...), so that the ratios between them hold on a noisy
machine."""

from __future__ import annotations

import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from mpi4py import MPI

import pccl_torch as pc
from pccl_torch import compression
from pccl_torch.selection import tuning
from pccl_torch.api import _plan
from pccl_torch.bench.backends import Backend, make_call, parse_backends
from pccl_torch.transport.base import Transport


@dataclass(frozen=True, slots=True)
class Settings:
    """What to measure (the command-line flags)."""

    collectives: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: torch.dtype
    warmup: int
    iters: int
    backends: str
    check: bool
    iter_budget: int | None = None
    """Bytes per size and backend: above ``iter_budget / iters`` bytes, fewer iterations (see ``counts``)."""
    confirm: int = 0
    """Iterations of the head-to-head re-timing of auto against the fastest fixed algorithms (0: none)."""

    def counts(self, nbytes: int) -> tuple[int, int]:
        """(warm-up, timed) iterations at ``nbytes``: ``warmup`` and ``iters``; with ``iter_budget``, at most
        ``iter_budget // nbytes`` timed (but at least 3) and a third as many warm-up (at least 1)."""
        if self.iter_budget is None:
            return self.warmup, self.iters
        iters = min(self.iters, max(3, self.iter_budget // max(nbytes, 1)))
        return min(self.warmup, max(1, iters // 3)), iters


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests: busbw = algbw x 2(p-1)/p for all-reduce, x (p-1)/p for all-gather, reduce-scatter and
    all-to-all (alltoall_perf: of each rank's buffer, (p-1)/p leaves it)."""
    return (2 if collective == "all_reduce" else 1) * (ranks - 1) / ranks


def versions() -> dict[str, str]:
    return {
        "pccl_torch": pc.__version__,
        "torch": torch.__version__,
        "mpi4py": __import__("mpi4py").__version__,
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
        "python": sys.version.split()[0],
    }


class _Buffers:
    """Input and output of one (collective, size), reused by every backend. ``total`` elements: the full
    buffer; for all-to-all one rank's send buffer (= its receive buffer), ``ranks`` blocks."""

    def __init__(self, collective: str, total: int, ranks: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        self.collective = collective
        block = total // ranks
        on = {"dtype": dtype, "device": device}
        if collective == "all_gather":
            self.inp, self.out = torch.ones(block, **on), torch.empty(total, **on)
        elif collective == "reduce_scatter":
            self.inp, self.out = torch.ones(total, **on), torch.empty(block, **on)
        elif collective == "all_to_all":
            self.inp, self.out = torch.ones(total, **on), torch.empty(total, **on)
        else:
            self.inp, self.out = torch.empty(0, **on), torch.ones(total, **on)

    def reset(self) -> None:
        """All-reduce works in place: restart from ones so values stay finite."""
        if self.collective == "all_reduce":
            self.out.fill_(1)


A2A_MODULUS = 251
"""All-to-all check values are ``((1 + source) index + destination) mod 251``: integers below 256, exact in
every dtype (bfloat16 included); 251 being prime, the blocks of two different (source, destination) pairs agree
on at most one element in 251, and a block shifted by fewer than 251 elements differs everywhere (up to 250
ranks)."""


def a2a_block(numel: int, source: int, dest: int, dtype: torch.dtype) -> torch.Tensor:
    """The check block ``source`` sends ``dest`` in an all-to-all of ``numel``-element blocks."""
    return ((torch.arange(numel) * (1 + source) + dest) % A2A_MODULUS).to(dtype)


def _count_wrong(collective: str, call: Callable[[], None], bufs: _Buffers, rank: int, ranks: int,
                 wire: str | None = None, local_size: int = 1) -> int:
    """Run once on known inputs (small integers: exact in every dtype) and count wrong elements. With a
    wire format: all-gathers must deliver its round trip exactly, reductions stay within its error bound, and
    an all-to-all delivers the round trip of each block that crossed nodes (``local_size`` ranks a node), each
    encoded on its own, and the other blocks exactly."""
    modulus = max(2, 128 // ranks)
    dtype = bufs.out.dtype
    fmt = compression.get(wire) if wire else None

    def pattern(numel: int, who: int) -> torch.Tensor:
        return ((torch.arange(numel) + 3 * who) % modulus).to(dtype)

    if collective == "all_to_all":
        block = bufs.inp.numel() // ranks
        bufs.inp.copy_(torch.cat([a2a_block(block, rank, dest, dtype) for dest in range(ranks)]))
        received = [a2a_block(block, source, rank, dtype) for source in range(ranks)]
        expected = torch.cat([fmt.round_trip(b) if fmt and source // local_size != rank // local_size else b
                              for source, b in enumerate(received)])
    elif collective == "all_gather":
        bufs.inp.copy_(pattern(bufs.inp.numel(), rank))
        blocks = [pattern(bufs.inp.numel(), r) for r in range(ranks)]
        expected = torch.cat([fmt.round_trip(b) for b in blocks] if fmt else blocks)
    elif collective == "reduce_scatter":
        bufs.inp.copy_(pattern(bufs.inp.numel(), rank))
        block = bufs.out.numel()
        full = sum(pattern(bufs.inp.numel(), r).double() for r in range(ranks))
        expected = full[rank * block:(rank + 1) * block].to(dtype)
    else:
        bufs.out.copy_(pattern(bufs.out.numel(), rank))
        expected = sum(pattern(bufs.out.numel(), r).double() for r in range(ranks)).to(dtype)
    call()
    got = bufs.out.cpu()  # the expected values are built on the host
    if fmt is None or collective in ("all_gather", "all_to_all"):
        wrong = int((got != expected).sum())
    else:  # each contribution (< modulus) and an all-reduce's re-encoded sum (< modulus * ranks) within the bound
        bound = 2 * fmt.max_error * modulus * ranks
        wrong = int(((got.double() - expected.double()).abs() > bound).sum())
    bufs.inp.fill_(1)
    bufs.out.fill_(1)
    return wrong


def measure(comm: pc.Communicator, settings: Settings, progress: bool = True) -> list[dict]:
    """Measure every (collective, size, backend); returns the rows (identical on every rank). The ranks
    synchronise and agree over ``comm.control`` (host tensors: MPI, or gloo where pccl's levels are NCCL), so the same
    loop runs under mpiexec and under torchrun, on CPU and CUDA tensors."""
    topo = comm.topology
    world = comm.control
    if comm.transport != "mpi" and any(b.strip() == "mpi" for b in settings.backends.split(",")):
        raise ValueError(f"the mpi baseline calls the MPI library directly and needs an MPI launch; pccl runs over "
                         f"{comm.transport} here (drop mpi from --backends)")
    ranks = topo.world_size
    element = torch.tensor([], dtype=settings.dtype).element_size()
    plan = [(c, s) for c in settings.collectives for s in settings.sizes]
    bar = None
    if progress and topo.rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=len(plan), desc="pccl-bench", unit="size", file=sys.stderr, leave=False)
    rows: list[dict] = []
    host, info = socket.gethostname(), versions()
    links = comm.choice.links.as_dict() if comm.choice is not None and comm.choice.links.source != "none" else None
    for collective, size in plan:
        total = size // element // ranks * ranks if collective != "all_reduce" else size // element
        if total == 0:
            if bar:
                bar.update()
            continue
        nbytes = total * element
        bufs = _Buffers(collective, total, ranks, settings.dtype, comm.device)
        backends: list[Backend] = parse_backends(settings.backends, collective, skip_foreign=True,
                                                 device=comm.device.type, dtype=settings.dtype)
        calls = [_completed(make_call(b, collective, comm, bufs.out, bufs.inp), comm.device)
                 for b in backends]
        warmup, iters = settings.counts(nbytes)
        # A new order every iteration (the same on every rank: collectives must be issued in the same
        # order everywhere), so that no backend always follows the same one: on an oversubscribed machine
        # a call right after a gloo collective runs measurably slower.
        order = np.random.default_rng(len(plan) * 7919 + size)
        tuned = _tune_auto(comm, backends, calls, bufs, tuning.shape_key(collective, nbytes, settings.dtype))
        slowest = _time_interleaved(calls, warmup, iters, bufs, order, world)
        medians = [statistics.median(times) for times in slowest]
        confirmed = _confirm_auto(backends, calls, medians, settings.confirm, bufs, order, world)
        for i, (backend, call) in enumerate(zip(backends, calls)):
            wrong = -1
            if settings.check:
                count = torch.tensor([_count_wrong(collective, call, bufs, topo.rank, ranks, backend.compression,
                                                   topo.local_size)])
                world.native_all_reduce(count, pc.ReduceOp.SUM)
                wrong = int(count)
            seconds = medians[i]
            # The plan the API ran this backend's calls with (the same question choose_algorithm asks): its name
            # for the auto row, and a pipelined plan's chunk count.
            chosen = (_plan(comm, collective, backend.algorithm, nbytes, settings.dtype, backend.compression,
                            issued=False) if backend.name == "pccl" else None)
            algorithm = backend.algorithm or (chosen.name.partition("+")[0] if chosen is not None else "native")
            algbw = nbytes / seconds / 1e9
            rows.append({
                "collective": collective, "backend": backend.name, "label": backend.label, "algorithm": algorithm,
                "auto": backend.auto, "compression": backend.compression,
                "size_bytes": nbytes, "count": total, "dtype": str(settings.dtype).removeprefix("torch."),
                "time_us": seconds * 1e6, "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(collective, ranks),
                "wrong": wrong, "ranks": ranks, "local_size": topo.local_size, "nodes": topo.num_nodes,
                "iters": iters, "warmup": warmup, "hostname": host, "versions": info, "transport": comm.transport,
                "links": links,
                **({"chunks": chosen.chunks} if chosen is not None and chosen.pipelined else {}),
                **(confirmed if backend.auto else {}),
                **(tuned if backend.auto and backend.compression is None else {}),
            })
        if bar:
            bar.update()
    if bar:
        bar.close()
    add_ratios(rows)
    return rows


def _completed(call: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """``call`` that returns once its work is done on ``device``: NCCL's calls (and pccl's on CUDA streams) return
    when queued, so a CUDA call is followed by a device synchronise; a host call is itself."""
    if device.type != "cuda":
        return call
    synchronize = torch.cuda.synchronize

    def completed() -> None:
        call()
        synchronize(device)

    return completed


def _time_interleaved(calls: list[Callable[[], None]], warmup: int, iters: int, bufs: _Buffers,
                      order: np.random.Generator, world: Transport) -> np.ndarray:
    """Seconds per (call, timed iteration), of the slowest rank: every call once per iteration, in a
    fresh shuffled order each time, each started from a barrier."""
    samples = np.zeros((len(calls), iters))
    for it in range(warmup + iters):
        for i in order.permutation(len(calls)):
            bufs.reset()
            world.barrier()
            start = time.perf_counter()
            calls[i]()
            if it >= warmup:
                samples[i, it - warmup] = time.perf_counter() - start
    slowest = torch.from_numpy(samples)
    world.native_all_reduce(slowest, pc.ReduceOp.MAX)  # a collective ends when its last rank does
    return slowest.numpy()


def _tune_auto(comm: pc.Communicator, backends: list[Backend], calls: list[Callable[[], None]], bufs: _Buffers,
               key: str) -> dict:
    """With online tuning (``PCCL_TUNE=online``): run pccl's exact automatic call until its shape is tuned, before
    anything is timed, so the auto row times the choice rather than the exploration. Returns the auto row's
    ``tuning`` field (what was tried and chosen); empty without tuning."""
    tuner = comm.choice.tuner if comm.choice is not None else None
    auto = [i for i, b in enumerate(backends) if b.auto and b.compression is None]
    if tuner is None or not auto:
        return {}
    for _ in range(tuning.CANDIDATES * (tuning.WARMUP + max(tuning.TRIALS, tuning.SMALL_TRIALS)) + 1):  # the same calls on every rank: the tuner decides alike
        if key in tuner.locked:
            break
        bufs.reset()
        calls[auto[0]]()
    return {"tuning": tuner.report.get(key, {"chosen": tuner.locked.get(key), "source": "model"})}


def _confirm_auto(backends: list[Backend], calls: list[Callable[[], None]], medians: list[float], iters: int,
                  bufs: _Buffers, order: np.random.Generator, world) -> dict:
    """Re-time pccl's own choice head to head against the two fastest fixed algorithms of the first pass,
    ``iters`` interleaved iterations each. The first pass picks the candidates, this one times them: taking
    the fastest of many noisy columns as "best fixed" would otherwise favour the fixed side by the noise
    alone. The fastest fixed algorithm of the first pass also runs as a second, identical column: how far
    apart the two land (``confirm_repeat_ratio``, >= 1) is the noise floor of this point, the smallest
    difference the comparison can resolve. Returns the auto row's ``confirm_*`` fields (empty without
    ``iters`` or fixed algorithms)."""
    auto = [i for i, b in enumerate(backends) if b.auto]
    fixed = sorted((i for i, b in enumerate(backends) if b.name == "pccl" and b.algorithm is not None
                    and b.compression is None),
                   key=lambda i: medians[i])[:2]
    if not iters or not auto or not fixed:
        return {}
    picked = [auto[0], *fixed]
    slowest = _time_interleaved([calls[i] for i in picked] + [calls[fixed[0]]], 1, iters, bufs, order, world)
    times = [statistics.median(t) for t in slowest]
    best = min(range(1, len(picked)), key=lambda k: times[k])
    first, again = times[1], times[-1]
    return {"confirm_iters": iters, "confirm_auto_us": times[0] * 1e6,
            "confirm_fixed": backends[picked[best]].algorithm, "confirm_fixed_us": times[best] * 1e6,
            "auto_vs_best_fixed": times[0] / times[best],
            "confirm_repeat_ratio": max(first, again) / min(first, again)}


def add_ratios(rows: list[dict]) -> None:
    """``vs_best_baseline`` on pccl rows: best baseline time / pccl time at that size (> 1: pccl faster);
    ``vs_exact`` on compressed rows: pccl's exact auto time / this row's time."""
    best: dict[tuple[str, int], float] = {}
    exact: dict[tuple[str, int], float] = {}
    for row in rows:
        key = (row["collective"], row["size_bytes"])
        if row["backend"] != "pccl":
            best[key] = min(best.get(key, float("inf")), row["time_us"])
        elif row["auto"]:
            exact[key] = row["time_us"]
    for row in rows:
        key = (row["collective"], row["size_bytes"])
        baseline = best.get(key)
        row["vs_best_baseline"] = (baseline / row["time_us"]) if row["backend"] == "pccl" and baseline else None
        row["vs_exact"] = exact[key] / row["time_us"] if row.get("compression") and key in exact else None
