"""What the training scripts share: arguments, the model and data, the timed training loop,
communication meters, per-step logging, the summary, and the JSON and plot outputs.

Every script runs under ``mpiexec``, where MPI (not the training backend) carries the small reductions of
the logging (mean loss, slowest rank's step time), so they never show in the counters. A script that
initialises torch.distributed itself (``train_moe.py``) also runs under ``torchrun``, whose processes are
MPI singletons: there the logging reduces over a gloo group of its own, called directly (not through
``torch.distributed``'s functions, which the gloo meter wraps), so it never shows either.

Communication time per collective:

- pccl runs read pccl's own counters (``pccl_torch.stats``, summed over every pccl communicator in use):
  the time each all-gather, reduce-scatter, all-reduce and all-to-all spent executing inside pccl.
- gloo runs wrap torch.distributed's ``all_gather_single``, ``reduce_scatter_single``, ``all_reduce`` and
  ``all_to_all_single`` (which the frameworks call, directly or through their older names) and time each call
  from issue to completion, not counting time spent queued behind the previous collective.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from mpi4py import MPI

import pccl_torch as pc
from data import VOCAB_SIZE, get_batch, load_splits
from model import GPT, GPTConfig
from report import plot_runs

log = logging.getLogger("gpt")

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
SHORT = {"all_gather": "AG", "reduce_scatter": "RS", "all_reduce": "AR", "all_to_all": "A2A"}
TAIL_STEPS = 10
"""The final train loss is the mean of the last this many steps."""

StepFn = Callable[[torch.Tensor, torch.Tensor], float]
"""One optimizer step on a batch ``(x, y)``; returns this rank's loss."""
EvalFn = Callable[[torch.Tensor, torch.Tensor], float]
"""This rank's loss on a batch, without training."""


# -- arguments and setup -------------------------------------------------------------------------------
def build_parser(description: str | None) -> argparse.ArgumentParser:
    """The arguments every script takes (model size, optimisation, outputs)."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    model = parser.add_argument_group("model")
    model.add_argument("--n-layer", type=int, default=2)
    model.add_argument("--n-head", type=int, default=4)
    model.add_argument("--n-embd", type=int, default=64)
    model.add_argument("--block-size", type=int, default=64, help="context length in tokens")
    train = parser.add_argument_group("training")
    train.add_argument("--steps", type=int, default=150)
    train.add_argument("--batch-size", type=int, default=8, help="sequences per rank and step")
    train.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (constant)")
    train.add_argument("--seed", type=int, default=0, help="model init and data order (same for every backend)")
    train.add_argument("--eval-batches", type=int, default=8, help="validation batches per rank at the end")
    train.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    train.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="where the model trains: cuda puts each rank on its node's GPU number local rank modulo "
                            "the GPUs there (several ranks share one GPU where there are fewer)")
    train.add_argument("--compression", default="",
                       help="pccl wire formats between nodes, as PCCL_COMPRESSION: 'bf16', or "
                            "'all_gather:int8,reduce_scatter:bf16' (default: exact)")
    out = parser.add_argument_group("output")
    out.add_argument("--log-every", type=int, default=10, help="log one step in this many (0: none)")
    out.add_argument("--json", type=Path, help="write steps and summary here (rank 0)")
    out.add_argument("--plot", type=Path, help="write a loss and step-time plot here (rank 0)")
    return parser


def setup(args: argparse.Namespace) -> None:
    """Threads, logging (rank 0 logs steps, other ranks only warnings) and pccl's wire formats."""
    torch.set_num_threads(args.threads)
    if args.compression:
        from pccl_torch.compression.config import COMPRESSION_ENV, env_formats

        os.environ[COMPRESSION_ENV] = args.compression
        env_formats()  # a malformed value fails here, before any process group exists
    rank = launch_rank()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(name)s: %(message)s",
                        force=True)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)


def select_device(name: str) -> torch.device:
    """``cpu``, or the CUDA device of this rank on its node (local rank modulo the devices there), made current."""
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    local_rank = int(os.environ.get("LOCAL_RANK", launch_rank()))
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def process_group_backend(comm: str, device: torch.device) -> str:
    """The torch.distributed backend string of ``--comm`` (``pccl``, ``gloo``, ``nccl``) for a model on ``device``:
    on CUDA, pccl and NCCL take the CUDA tensors and gloo the host ones."""
    if device.type == "cuda":
        return {"pccl": "cpu:gloo,cuda:pccl", "gloo": "gloo", "nccl": "cpu:gloo,cuda:nccl"}[comm]
    if comm == "nccl":
        raise SystemExit("--comm nccl needs --device cuda")
    return comm


def build_model(args: argparse.Namespace, device: torch.device | None = None) -> GPT:
    """The GPT of ``args`` on ``device`` (default: the host), initialised identically on every rank and for every
    backend."""
    torch.manual_seed(args.seed)
    model = GPT(GPTConfig(vocab_size=VOCAB_SIZE, block_size=args.block_size, n_layer=args.n_layer,
                          n_head=args.n_head, n_embd=args.n_embd))
    return model.to(device) if device is not None else model


def make_optimizer(params: Iterable[torch.nn.Parameter], args: argparse.Namespace) -> torch.optim.Optimizer:
    """AdamW at the constant ``args.lr`` (the same for every framework)."""
    return torch.optim.AdamW(params, lr=args.lr)


# -- communication meters ------------------------------------------------------------------------------
Snapshot = dict[str, tuple[int, float]]
"""Cumulative (calls, seconds) per collective."""


class CommMeter(Protocol):
    method: str
    """How the time is measured, for the summary."""

    def snapshot(self) -> Snapshot: ...

    def algorithms(self) -> dict[str, int]:
        """Calls per ``collective:algorithm`` on this rank so far (empty where the backend does not say)."""
        ...

    def sizes(self) -> Counter[tuple[str, int]]:
        """Calls per (collective, bytes of the full buffer) on this rank so far (empty where not recorded)."""
        ...


class PcclCounters:
    """pccl's own counters (the time each collective spent executing in pccl), summed over every pccl
    communicator in use: the one of ``pccl_torch.init()`` (FSDP2, the DDP comm hook) and those of all pccl
    process groups (DeepSpeed's ZeRO-1/2 reduce on a data-parallel group of their own)."""

    method = "pccl counters (time inside pccl)"

    def snapshot(self) -> Snapshot:
        stats = pc.stats("all")
        return {c: (stats["calls"].get(c, 0), stats["seconds"].get(c, 0.0)) for c in COLLECTIVES}

    def algorithms(self) -> dict[str, int]:
        return pc.stats("all")["algorithms"]

    def sizes(self) -> Counter[tuple[str, int]]:
        return Counter()


class DistTimer:
    """Times torch.distributed's all-gathers, reduce-scatters and all-reduces, for backends that keep
    no counters: from issue to completion (async calls through their future), less the time spent
    queued behind the previous collective. Use as a context manager: it wraps the functions on enter."""

    method = "torch.distributed calls, issue to completion"
    # what to wrap: torch's older names (all_gather_into_tensor, reduce_scatter_tensor) call these
    FUNCTIONS = {"all_gather": "all_gather_single", "reduce_scatter": "reduce_scatter_single",
                 "all_reduce": "all_reduce", "all_to_all": "all_to_all_single"}
    # which argument is the full buffer, by position and name (pccl's size convention; all-to-all: one rank's
    # send buffer)
    FULL_BUFFER = {"all_gather": (0, "output_tensor"), "reduce_scatter": (1, "input"), "all_reduce": (0, "tensor"),
                   "all_to_all": (1, "input")}

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()
        self.call_sizes: Counter[tuple[str, int]] = Counter()
        self._lock = threading.Lock()
        self._busy_until = 0.0
        self._saved: list[tuple[Any, str, Callable]] = []

    def snapshot(self) -> Snapshot:
        with self._lock:
            return {c: (self.calls[c], self.seconds[c]) for c in COLLECTIVES}

    def algorithms(self) -> dict[str, int]:
        return {}

    def sizes(self) -> Counter[tuple[str, int]]:
        with self._lock:
            return Counter(self.call_sizes)

    def _record(self, collective: str, issued: float, done: float) -> None:
        with self._lock:
            start = max(issued, self._busy_until)
            self._busy_until = max(self._busy_until, done)
            self.calls[collective] += 1
            self.seconds[collective] += max(0.0, done - start)

    def _timed(self, collective: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            position, name = self.FULL_BUFFER[collective]
            full = args[position] if len(args) > position else kwargs.get(name)
            if isinstance(full, torch.Tensor):
                with self._lock:
                    self.call_sizes[(collective, full.numel() * full.element_size())] += 1
            issued = time.perf_counter()
            work = fn(*args, **kwargs)
            if work is None:
                self._record(collective, issued, time.perf_counter())
            else:
                work.get_future().then(lambda _: self._record(collective, issued, time.perf_counter()))
            return work

        return timed

    def __enter__(self) -> DistTimer:
        for collective, name in self.FUNCTIONS.items():
            original = getattr(c10d, name)
            wrapper = self._timed(collective, original)
            for module in (c10d, dist):
                self._saved.append((module, name, getattr(module, name)))
                setattr(module, name, wrapper)
        return self

    def __exit__(self, *exc: object) -> None:
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved.clear()


def sgd_step(module: torch.nn.Module, optimizer: torch.optim.Optimizer,
             device: torch.device | None = None) -> Callable[[torch.Tensor, torch.Tensor], float]:
    """One training step of a torch-wrapped model (DDP, FSDP2) on batches moved to ``device``: forward, backward,
    update; the loss."""

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        if device is not None:
            x, y = x.to(device), y.to(device)
        _, loss = module(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def close() -> None:
    """Shut pccl and torch.distributed down, whichever the run initialised."""
    global _LOG_WORLD
    _LOG_WORLD = None  # its gloo group (torchrun) goes with the process groups
    if pc.is_initialized():
        pc.shutdown()
    if dist.is_initialized():
        dist.destroy_process_group()


# -- the launch's ranks, for the logging ---------------------------------------------------------------
def launch_rank() -> int:
    """This process's rank, before torch.distributed exists: MPI's under mpiexec, ``RANK`` under torchrun."""
    if MPI.COMM_WORLD.Get_size() == 1 and os.environ.get("RANK", "").isdigit():
        return int(os.environ["RANK"])
    return MPI.COMM_WORLD.Get_rank()


#: A rank waiting in the logging's own reduction polls, yielding the core, for this long (the usual case: every
#: rank arrives within it) ...
LOG_SPIN_S = 0.002
#: ... then sleeps this long between polls (a rank arriving late gets the cores).
LOG_POLL_S = 0.0005


def _wait_sharing_cores(request: MPI.Request) -> None:
    """Wait for ``request`` without holding a core: poll and yield for :data:`LOG_SPIN_S`, then poll and sleep
    :data:`LOG_POLL_S` in between.

    MPICH's blocking ``Allreduce`` keeps its rank on the core while it waits. After each step the ranks that
    finished first waited there for the slowest one, and with 4 ranks on 2 cores that rank got the cores back so
    rarely that its step grew from ~65 ms into steps of 0.3-10.5 s (ZeRO-3 over pccl, one machine, 150 steps:
    the slowest step 7-157x the median in every run), and gloo's DDP steps were 4-5x the median at worst
    (benchmarks/results/testbed/gpt-training/zero3-stalls-2026-12-05/notes.txt)."""
    give_up_spinning = time.monotonic() + LOG_SPIN_S
    while not request.Test():
        if time.monotonic() < give_up_spinning:
            os.sched_yield()
        else:
            time.sleep(LOG_POLL_S)


class LogWorld:
    """The ranks of the launch, for the logging's own reductions (never a training collective): MPI's
    ``COMM_WORLD`` under mpiexec, non-blocking and polled without holding a core (:func:`_wait_sharing_cores`);
    under torchrun (every process an MPI singleton) a gloo group of torch.distributed's world, whose methods are
    called directly so no meter counts them."""

    def __init__(self) -> None:
        self._group = None
        if MPI.COMM_WORLD.Get_size() == 1 and dist.is_initialized() and dist.get_world_size() > 1:
            self._group = dist.new_group(backend="gloo")  # collective: every rank builds it at the same point
            self.rank, self.size = dist.get_rank(), dist.get_world_size()
        else:
            self.rank, self.size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()

    def sum(self, values: np.ndarray) -> np.ndarray:
        """``values`` (float64) summed over ranks."""
        if self._group is None:
            out = values.copy()
            _wait_sharing_cores(MPI.COMM_WORLD.Iallreduce(MPI.IN_PLACE, out, op=MPI.SUM))
            return out
        tensor = torch.from_numpy(values.copy())
        self._group.allreduce([tensor]).wait()
        return tensor.numpy()

    def max(self, value: float) -> float:
        if self._group is None:
            buf = np.array([value], dtype=np.float64)
            _wait_sharing_cores(MPI.COMM_WORLD.Iallreduce(MPI.IN_PLACE, buf, op=MPI.MAX))
            return float(buf[0])
        tensor = torch.tensor([value], dtype=torch.float64)
        self._group.allreduce([tensor], dist.ReduceOp.MAX).wait()
        return float(tensor.item())


_LOG_WORLD: LogWorld | None = None


def log_world() -> LogWorld:
    """The :class:`LogWorld` of this run, built at the first call (collective under torchrun)."""
    global _LOG_WORLD
    if _LOG_WORLD is None:
        _LOG_WORLD = LogWorld()
    return _LOG_WORLD


@contextmanager
def comm_meter(uses_pccl: bool) -> Iterator[CommMeter]:
    """pccl's counters for a pccl run, a :class:`DistTimer` (installed for the block) otherwise."""
    if uses_pccl:
        yield PcclCounters()
    else:
        with DistTimer() as timer:
            yield timer


# -- the training loop ---------------------------------------------------------------------------------
@dataclass(slots=True)
class StepRecord:
    step: int
    loss: float
    """Mean over ranks."""
    seconds: float
    """Slowest rank."""
    comm: dict[str, dict[str, float]]
    """Per collective: ``calls`` and ``seconds`` in this step, mean over ranks."""
    cpu_seconds: float = 0.0
    """CPU time of every rank's process (all its threads) in this step, summed over ranks: on a machine
    whose ranks share cores, the step cannot be shorter than this over the cores."""

    @property
    def comm_seconds(self) -> float:
        return sum(c["seconds"] for c in self.comm.values())


@dataclass(slots=True)
class RunResult:
    framework: str
    comm: str
    world_size: int
    local_size: int
    params: int
    tokens_per_step: int
    comm_method: str
    config: dict[str, Any]
    steps: list[StepRecord] = field(default_factory=list)
    algorithms: dict[str, int] = field(default_factory=dict)
    """Rank 0's calls per ``collective:algorithm`` in set-up and training (pccl runs)."""
    call_sizes: dict[str, dict[str, float]] = field(default_factory=dict)
    """Rank 0's calls a step per collective and full-buffer bytes (``{"all_gather": {"1048576": 4.0}}``), over the
    timed steps (from step 3), where the meter records sizes (torch.distributed runs: gloo, NCCL)."""
    val_loss: float = float("nan")
    summary: dict[str, Any] = field(default_factory=dict)


def _reduce_step(loss: float, seconds: float, delta: Snapshot,
                 cpu_seconds: float) -> tuple[float, float, dict[str, dict[str, float]], float]:
    """Mean loss and comm over ranks, slowest rank's step time, CPU time summed over ranks (over
    :class:`LogWorld`, outside the timed step)."""
    world = log_world()
    values = np.array([loss, cpu_seconds] + [v for c in COLLECTIVES for v in delta[c]], dtype=np.float64)
    values = world.sum(values)
    cpu_total = float(values[1])
    values /= world.size
    slowest = world.max(seconds)
    comm = {c: {"calls": values[2 + 2 * i], "seconds": values[3 + 2 * i]} for i, c in enumerate(COLLECTIVES)}
    return float(values[0]), slowest, comm, cpu_total


def _per_step(sizes: Counter[tuple[str, int]], steps: int) -> dict[str, dict[str, float]]:
    """Calls per (collective, bytes) as calls a step, keyed for JSON."""
    out: dict[str, dict[str, float]] = {}
    for (collective, nbytes), calls in sorted(sizes.items()):
        out.setdefault(collective, {})[str(nbytes)] = calls / steps
    return out


def format_comm(comm: dict[str, dict[str, float]]) -> str:
    parts = [f"{SHORT[c]} {v['calls']:.0f}x {1e3 * v['seconds']:.1f} ms" for c, v in comm.items() if v["calls"]]
    return ", ".join(parts) or "none"


def timed_step(step_fn: StepFn, meter: CommMeter, x: torch.Tensor,
               y: torch.Tensor) -> tuple[float, float, Snapshot, float]:
    """Run one step; returns this rank's loss, seconds, (calls, seconds) per collective during it, and the
    CPU seconds its process used."""
    before = meter.snapshot()
    cpu_start = time.process_time()
    start = time.perf_counter()
    loss = step_fn(x, y)
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    after = meter.snapshot()
    delta = {c: (after[c][0] - before[c][0], after[c][1] - before[c][1]) for c in COLLECTIVES}
    return loss, seconds, delta, cpu_seconds


def train(args: argparse.Namespace, step_fn: StepFn, eval_fn: EvalFn, meter: CommMeter, *,
          framework: str, comm: str, params: int) -> RunResult:
    """``args.steps`` steps of ``step_fn`` on seeded batches (the same for every backend), then the
    validation loss with ``eval_fn``; logs every ``args.log_every`` steps and returns the record."""
    world = log_world()
    rank, size = world.rank, world.size
    splits = load_splits()
    result = RunResult(framework=framework, comm=comm, world_size=size, local_size=_local_size(),
                       params=params, tokens_per_step=args.batch_size * args.block_size * size,
                       comm_method=meter.method, config=_jsonable(vars(args)))
    log.info("%s, %s: %d ranks (%d a node), %s parameters, %s tokens a step, comm timed by %s",
             framework, comm, size, result.local_size, f"{params:,}", f"{result.tokens_per_step:,}", meter.method)
    batches = torch.Generator().manual_seed(1000 * args.seed + rank)
    sizes_from = meter.sizes()
    for step in range(1, args.steps + 1):
        if step == 3:
            sizes_from = meter.sizes()  # the timed steps (summarize's) start here
        x, y = get_batch(splits.train, args.batch_size, args.block_size, batches)
        record = StepRecord(step, *_reduce_step(*timed_step(step_fn, meter, x, y)))
        result.steps.append(record)
        if args.log_every and (step % args.log_every == 0 or step in (1, args.steps)):
            log.info("step %4d/%d | loss %.4f | %7s tok/s | %6.1f ms | comm %s", step, args.steps, record.loss,
                     f"{result.tokens_per_step / record.seconds:,.0f}", 1e3 * record.seconds,
                     format_comm(record.comm))
    result.algorithms = meter.algorithms()
    result.call_sizes = _per_step(meter.sizes() - sizes_from, args.steps - 2 if args.steps > 2 else args.steps)
    result.val_loss = evaluate(args, eval_fn, splits.val, rank)
    result.summary = summarize(result)
    log_summary(result)
    return result


@torch.no_grad()
def evaluate(args: argparse.Namespace, eval_fn: EvalFn, data: torch.Tensor, rank: int) -> float:
    """Mean loss over ``args.eval_batches`` seeded validation batches per rank, averaged over ranks."""
    g = torch.Generator().manual_seed(10_000 + 1000 * args.seed + rank)
    losses = [eval_fn(*get_batch(data, args.batch_size, args.block_size, g)) for _ in range(args.eval_batches)]
    world = log_world()
    return float(world.sum(np.array([statistics.fmean(losses)]))[0]) / world.size


def summarize(result: RunResult) -> dict[str, Any]:
    """Loss at start and end; timings as medians over the steps after the first two (warm-up), which
    keeps a step slowed by another process on a shared machine from moving them."""
    steps = result.steps
    timed = steps[2:] if len(steps) > 2 else steps
    step_s = statistics.median(s.seconds for s in timed)
    comm_s = statistics.median(s.comm_seconds for s in timed)
    cpu_s = statistics.median(s.cpu_seconds for s in timed)
    per_collective = {}
    for c in COLLECTIVES:
        calls = statistics.median(s.comm[c]["calls"] for s in timed)
        seconds = statistics.median(s.comm[c]["seconds"] for s in timed)
        per_collective[c] = {"calls_per_step": calls, "ms_per_step": 1e3 * seconds,
                             "ms_per_call": 1e3 * seconds / calls if calls else None}
    return {
        "first_loss": steps[0].loss,
        "final_train_loss": statistics.fmean(s.loss for s in steps[-TAIL_STEPS:]),
        "val_loss": result.val_loss,
        "step_ms": 1e3 * step_s,
        "tokens_per_s": result.tokens_per_step / step_s,
        "comm_ms_per_step": 1e3 * comm_s,
        "comm_share": comm_s / step_s,
        "cpu_ms_per_step": 1e3 * cpu_s,
        "worst_step_ratio": max(s.seconds for s in timed) / step_s,
        "collectives": per_collective,
        "timed_steps": len(timed),
    }


def log_summary(result: RunResult) -> None:
    s = result.summary
    log.info("summary %s, %s: loss %.3f -> %.3f (mean of the last %d steps), val %.3f", result.framework,
             result.comm, s["first_loss"], s["final_train_loss"], min(TAIL_STEPS, len(result.steps)), s["val_loss"])
    log.info("  step %.1f ms, %s tok/s, comm %.1f ms a step (%.0f%% of the step): medians from step 3",
             s["step_ms"], f"{s['tokens_per_s']:,.0f}", s["comm_ms_per_step"], 100 * s["comm_share"])
    log.info("  CPU %.1f ms a step over all ranks; slowest step %.1fx the median", s["cpu_ms_per_step"],
             s["worst_step_ratio"])
    for c, v in s["collectives"].items():
        if v["calls_per_step"]:
            log.info("  %-15s %5.1f calls a step, %7.2f ms a step, %7.3f ms a call", c, v["calls_per_step"],
                     v["ms_per_step"], v["ms_per_call"])
    if result.algorithms:
        log.info("  algorithms: %s", ", ".join(f"{name} x{n}" for name, n in sorted(result.algorithms.items())))


# -- outputs -------------------------------------------------------------------------------------------
def write_outputs(args: argparse.Namespace, result: RunResult) -> None:
    """``--json`` and ``--plot``, on rank 0."""
    if log_world().rank != 0:
        return
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(asdict(result), indent=1))
    if args.plot:
        plot_runs([asdict(result)], args.plot)


def _local_size() -> int:
    """Ranks per node: PCCL_LOCAL_SIZE's emulated nodes, else torchrun's ``LOCAL_WORLD_SIZE``, else MPI's
    shared-memory domains (the testbed's namespaces, or real hosts). Collective over COMM_WORLD."""
    if "PCCL_LOCAL_SIZE" in os.environ:
        return int(os.environ["PCCL_LOCAL_SIZE"])
    if MPI.COMM_WORLD.Get_size() == 1 and os.environ.get("LOCAL_WORLD_SIZE", "").isdigit():
        return int(os.environ["LOCAL_WORLD_SIZE"])
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size()
    finally:
        node.Free()


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}
