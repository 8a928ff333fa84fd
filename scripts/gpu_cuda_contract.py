"""The CUDA contract of issue 52, checked on a ``pccl`` process group (or on NCCL's, the reference run), for
``scripts/gpu_check.sh``. It runs under torchrun (``dist.init_process_group``, env://) and under mpiexec (rank
and address from MPI). Every rank appends one JSON row per result to ``--rows DIR/rank<r>.jsonl`` as it goes
(a crash or a hang keeps what came before, and a ``begin`` row names what was running); ``gpu_check_lib.py``
judges the rows. The script exits 0 unless it crashed: wrong results are rows, not exit codes.

    torchrun --standalone --nproc-per-node 2 scripts/gpu_cuda_contract.py --backend pccl --label torchrun-pccl \\
        --rows DIR --hostid-per-rank
    torchrun ... -m pccl_torch.run scripts/gpu_cuda_contract.py --backend nccl ...    (forced to pccl by the wrapper)
    mpiexec -n 4 env PCCL_LOCAL_SIZE=2 python scripts/gpu_cuda_contract.py --backend pccl \\
        --plans hier:pipelined,hier:ring --phases timing,streams,fifo ...          (one pccl group per forced plan)
    torchrun --standalone --nproc-per-node 2 scripts/gpu_cuda_contract.py --device cpu --backend gloo \\
        --phases fifo,timing --rows DIR                                            (the CPU smoke run)

Phases (``--phases``; they run in this order, whatever order is given):

- ``train``: DDP, then FSDP2 (``fully_shard`` per block and at the root, on a mesh of the default group), on the
  example GPT (``examples/gpt/model.py``), seeded: every step's loss and time (the step ends at a device
  synchronisation). Rows: ``{"phase": "train", "model": "ddp"|"fsdp2", "losses": [...], "step_s": [...]}``.
- ``sync-warn``: ``torch.cuda.set_sync_debug_mode("warn")`` over DDP and FSDP2 steps of a small MLP (AdamW,
  data already on the device, after two warm-up steps): every synchronising call, with the Python stack that
  made it. Rows: ``{"phase": "sync", "mode": "warn", "model": ..., "calls": [...]}``.
- ``timing``: the host's time to return from a 16 MiB all-gather (full buffer), reduce-scatter (input) and
  all-reduce, ``async_op=False`` and ``async_op=True`` (issue plus ``wait()``), against the time to the GPU's
  completion (the issue to the return of ``torch.cuda.synchronize()``), ranks aligned by a barrier of a gloo group
  before each call; and the same calls issued behind a slow kernel (``torch.cuda._sleep``) on the current stream,
  whose host time must stay far below the kernel's. Rows: ``{"phase": "timing", "kind": "16MiB"|"behind_sleep",
  "collective": ..., "mode": "sync"|"async", "host_s": [...], "total_s": [...]}``.
- ``streams`` (CUDA): (a) ``wait_other_stream``: issue async on stream s1 behind a slow kernel, ``work.wait()``
  with s2 current (the host time of the wait is recorded), then read the output on s2 behind a short kernel;
  (b) ``snapshot_at_issue``: write the input, issue an async all-gather, then a slow kernel and an overwrite of the
  input on the same stream: the result must hold what was written before the issue; (c) ``list_all_gather_side``:
  list-form ``dist.all_gather(list, t)``, sync and async, with a side stream current (a slow kernel on the default
  stream, the outputs filled with a sentinel first). Bitwise against the reference. Rows: ``{"phase": "streams",
  "case": ..., "trials": n, "wrong": k}``.
- ``fifo``: ``dist.all_reduce(t_i, async_op=True); dist.broadcast(t_i, 0)`` for 50 tensors with distinct values,
  issued back to back, then every work waited and every tensor checked (bitwise); and the same on two groups
  interleaved. Rows: ``{"phase": "fifo", "case": "one_group"|"two_groups", "trials": 50, "wrong": k}``.
- ``sync-error``: as ``sync-warn`` with ``set_sync_debug_mode("error")``: the first synchronising call raises; the
  row names it (``error``, ``error_stack``). Last, since an error inside pccl may leave its communicator broken.

``--plans P1,P2``: instead of the default group, each phase (but ``train`` and ``sync-*``) runs on a new pccl group
per plan, created with ``PCCL_ALGO`` forcing that plan for all-gather, reduce-scatter and all-reduce (read when
the group's CUDA communicator is built, at its first CUDA collective); every row carries ``"plan"``, and an
``algorithms`` row says what the group's communicators ran.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("train", "sync-warn", "timing", "streams", "fifo", "sync-error")
PLAN_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
TIMING_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
MIB = 1 << 20
PCCL_FRAMES = ("pccl_torch", "integrations/", "triton_kernels")
"""A stack frame whose file path holds one of these is pccl's (the installed package or this tree)."""


# -- rows -----------------------------------------------------------------------------------------------
class Rows:
    """This rank's JSON lines, appended and flushed one by one; each carries the run's identity."""

    def __init__(self, directory: Path | None, rank: int, base: dict) -> None:
        self.base = dict(base, rank=rank)
        self.path = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self.path = directory / f"rank{rank}.jsonl"
            self.path.write_text("")

    def add(self, row: dict) -> None:
        row = {**self.base, **row}
        line = json.dumps(row, default=str)
        if self.path is not None:
            with self.path.open("a") as fh:
                fh.write(line + "\n")
        if self.base["rank"] == 0:
            summary = {k: v for k, v in row.items() if k not in self.base and k not in ("losses", "step_s", "host_s",
                                                                                       "total_s", "calls", "stack")}
            print("row", json.dumps(summary, default=str)[:400], flush=True)

    def begin(self, what: str) -> None:
        """A marker: the judge names the last one a rank wrote when its run hung or crashed after it."""
        self.add({"phase": "begin", "what": what, "t": time.time()})


def _error_row(exc: BaseException) -> dict:
    return {"error": f"{type(exc).__name__}: {str(exc)[:1500]}", "traceback": traceback.format_exc(limit=12)[-4000:]}


# -- launch -----------------------------------------------------------------------------------------------
def launched_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the launcher's variables (torchrun, Open MPI, MPICH), before any init."""
    env = os.environ
    for rank, size, local in (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                              ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")):
        if env.get(rank, "").isdigit() and env.get(size, "").isdigit():
            return int(env[rank]), int(env[size]), int(env.get(local, "0") or 0)
    return 0, 1, 0


def backend_string(backend: str, device: torch.device) -> str:
    """What ``--backend`` asks torch.distributed for: ``pccl`` as a user types it, NCCL beside gloo for host
    tensors, or the string itself."""
    if backend == "nccl":
        return "cpu:gloo,cuda:nccl"
    return backend


def init(args: argparse.Namespace) -> tuple[str, torch.device]:
    """torch.distributed's default group for ``args.backend``; returns the launcher's name and the device."""
    rank, _, local_rank = launched_rank()
    if args.hostid_per_rank:  # two ranks on one GPU: NCCL must see two hosts (read at NCCL's first init)
        os.environ["NCCL_HOSTID"] = f"pccl-gpu-check-{rank}"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_IB_DISABLE", "1")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA device")
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        # Attention by the math kernels: the fused ones' backward accumulates with atomics (run-to-run noise
        # between the NCCL and the pccl run that has nothing to do with communication).
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
            torch.backends.cuda.enable_cudnn_sdp(False)
    else:
        device = torch.device("cpu")
    import pccl_torch as pc  # registers the backend

    timeout = datetime.timedelta(seconds=args.timeout_s)
    spec = backend_string(args.backend, device)
    if os.environ.get("RANK", "").isdigit() and os.environ.get("WORLD_SIZE", "").isdigit():
        dist.init_process_group(spec, timeout=timeout)  # env://, as a torchrun script does
        return "torchrun", device
    pc.init_process_group(spec, timeout=timeout)  # rank, size and address from MPI
    return "mpiexec", device


def device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Sleeper:
    """``torch.cuda._sleep`` calibrated to milliseconds on this GPU (a slow kernel on the current stream)."""

    def __init__(self, device: torch.device) -> None:
        self.cycles_per_ms = 1.0e6
        if device.type != "cuda":
            return
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        self.cycles_per_ms = cycles / max(start.elapsed_time(end), 1e-3)

    def __call__(self, ms: float) -> None:
        torch.cuda._sleep(int(ms * self.cycles_per_ms))


# -- the models -------------------------------------------------------------------------------------------
def gpt(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    sys.path.insert(0, str(ROOT / "examples" / "gpt"))
    from model import GPT, GPTConfig  # the example's model (its folder is not a package)

    torch.manual_seed(args.seed)
    config = GPTConfig(vocab_size=256, block_size=args.block, n_layer=args.layers, n_head=4, n_embd=args.embd)
    return GPT(config).to(device)


def mlp(device: torch.device, width: int = 512) -> torch.nn.Module:
    torch.manual_seed(1)
    layers = [torch.nn.Linear(width, 2 * width), torch.nn.GELU(), torch.nn.Linear(2 * width, 2 * width),
              torch.nn.GELU(), torch.nn.Linear(2 * width, width)]
    return torch.nn.Sequential(*layers).to(device)


def wrap(kind: str, model: torch.nn.Module, device: torch.device,
         blocks: Callable[[torch.nn.Module], list[torch.nn.Module]]) -> torch.nn.Module:
    """``ddp``: DistributedDataParallel on the default group; ``fsdp2``: ``fully_shard`` on each of ``blocks`` and
    the root, on a 1-D mesh of the default group."""
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def phase_train(args, rows: Rows, device: torch.device, ctrl) -> None:
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(1000 + rank)
    tokens = torch.randint(0, 256, (args.steps, args.batch, args.block + 1), generator=g).to(device)
    for kind in ("ddp", "fsdp2"):
        rows.begin(f"train {kind}")
        losses: list[float] = []
        step_s: list[float] = []
        try:
            model = wrap(kind, gpt(args, device), device, lambda m: list(m.blocks))
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
            dist.barrier(group=ctrl)
            for step in range(args.steps):
                x, y = tokens[step, :, :-1], tokens[step, :, 1:]
                device_sync(device)
                start = time.perf_counter()
                _, loss = model(x, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                device_sync(device)
                step_s.append(time.perf_counter() - start)
                losses.append(float(loss.item()))
            rows.add({"phase": "train", "model": kind, "losses": losses, "step_s": step_s})
        except Exception as exc:  # noqa: BLE001 - a row says what failed, the next phase runs
            rows.add({"phase": "train", "model": kind, "losses": losses, "step_s": step_s, **_error_row(exc)})
        dist.barrier(group=ctrl)


# -- sync debug mode --------------------------------------------------------------------------------------
def _frames(stack: list[traceback.FrameSummary]) -> list[str]:
    return [f"{f.filename}:{f.lineno} {f.name}" for f in stack]


def _chain_frames(exc: BaseException) -> list[str]:
    """The frames of ``exc`` and of the errors it was raised from (a worker's error re-raised by ``wait()``)."""
    frames: list[str] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        frames = _frames(traceback.extract_tb(exc.__traceback__)) + frames
        exc = exc.__cause__ or exc.__context__
    return frames


def in_pccl(frames: list[str]) -> bool:
    return any(any(mark in frame for mark in PCCL_FRAMES) for frame in frames)


@contextmanager
def recorded_sync_calls(calls: list[dict]) -> Iterator[None]:
    """Within: ``set_sync_debug_mode("warn")``, every synchronising-call warning recorded with its thread and
    the Python stack that raised it."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001 - warnings' API
        if "synchroniz" not in str(message):
            return
        frames = _frames(traceback.extract_stack()[:-1])[-14:]
        calls.append({"message": str(message)[:300], "thread": threading.current_thread().name,
                      "in_pccl": in_pccl(frames), "stack": frames})

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(0)


def phase_sync(args, rows: Rows, device: torch.device, ctrl, mode: str) -> bool:
    """Both models' steps under the sync debug ``mode``; whether a step raised (its collectives may be left
    half-issued: the caller then skips the teardown)."""
    if device.type != "cuda":
        rows.add({"phase": "sync", "mode": mode, "skipped": "not CUDA"})
        return False
    raised = False
    width = 512
    for kind in ("ddp", "fsdp2"):
        rows.begin(f"sync-{mode} {kind}")
        calls: list[dict] = []
        row: dict = {"phase": "sync", "mode": mode, "model": kind}
        try:
            model = wrap(kind, mlp(device, width), device, lambda m: [m[0], m[2], m[4]])
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            gen = torch.Generator(device=device).manual_seed(5 + dist.get_rank())
            x = torch.randn(64, width, device=device, generator=gen)
            y = torch.randn(64, width, device=device, generator=gen)

            def step() -> None:
                out = model(x)
                loss = torch.nn.functional.mse_loss(out, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()

            for _ in range(2):  # warm-up: lazy init, DDP's bucket rebuild, pccl's first choice of each shape
                step()
            device_sync(device)
            dist.barrier(group=ctrl)
            if mode == "warn":
                with recorded_sync_calls(calls):
                    for _ in range(args.sync_steps):
                        step()
            else:
                torch.cuda.set_sync_debug_mode("error")
                try:
                    for _ in range(args.sync_steps):
                        step()
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            device_sync(device)
        except Exception as exc:  # noqa: BLE001 - "error" mode: the synchronising call's exception, named
            torch.cuda.set_sync_debug_mode(0)
            frames = _chain_frames(exc)
            row.update(_error_row(exc), error_stack=frames[-14:], error_in_pccl=in_pccl(frames))
            raised = True
        row["calls"] = calls
        rows.add(row)
        if raised:
            break  # the next model's collectives would meet this one's, half-issued, on the other rank
        dist.barrier(group=ctrl)
    return raised


# -- host return ----------------------------------------------------------------------------------------
def _collective(name: str, device: torch.device, world: int, group, nbytes: int) -> Callable[[bool], object]:
    """A call of ``name`` on buffers of ``nbytes`` (the full buffer), made once: ``call(async_op)`` -> work."""
    numel = nbytes // 4
    if name == "all_gather":
        out, inp = torch.empty(numel, device=device), torch.ones(numel // world, device=device)
        return lambda async_op: dist.all_gather_into_tensor(out, inp, group=group, async_op=async_op)
    if name == "reduce_scatter":
        out, inp = torch.empty(numel // world, device=device), torch.ones(numel, device=device)
        return lambda async_op: dist.reduce_scatter_tensor(out, inp, group=group, async_op=async_op)
    buf = torch.ones(numel, device=device)
    return lambda async_op: dist.all_reduce(buf, group=group, async_op=async_op)


def phase_timing(args, rows: Rows, device: torch.device, ctrl, group, world: int, sleeper: Sleeper,
                 extra: dict) -> None:
    nbytes = args.timing_mib * MIB
    for name in TIMING_COLLECTIVES:
        rows.begin(f"timing {name}")
        try:
            call = _collective(name, device, world, group, nbytes)
        except Exception as exc:  # noqa: BLE001
            rows.add({"phase": "timing", "kind": "16MiB", "collective": name, **extra, **_error_row(exc)})
            continue
        for mode in ("sync", "async"):
            host, issue, wait, total = [], [], [], []
            row = {"phase": "timing", "kind": "16MiB", "collective": name, "mode": mode, "bytes": nbytes, **extra}
            try:
                for it in range(args.timing_warmup + args.timing_iters):
                    device_sync(device)
                    dist.barrier(group=ctrl)
                    t0 = time.perf_counter()
                    work = call(mode == "async")
                    t1 = time.perf_counter()
                    if mode == "async":
                        work.wait()
                    t2 = time.perf_counter()
                    device_sync(device)
                    t3 = time.perf_counter()
                    if it >= args.timing_warmup:
                        host.append(t2 - t0)
                        issue.append(t1 - t0)
                        wait.append(t2 - t1)
                        total.append(t3 - t0)
                row.update(host_s=host, issue_s=issue, wait_s=wait, total_s=total)
            except Exception as exc:  # noqa: BLE001
                row.update(host_s=host, total_s=total, **_error_row(exc))
            rows.add(row)
            if device.type != "cuda" or "error" in row:
                continue
            # The same call behind a slow kernel on the current stream: enqueue-and-return takes microseconds;
            # a host that waits for the stream, or for the collective, takes the kernel's time.
            row = {"phase": "timing", "kind": "behind_sleep", "collective": name, "mode": mode,
                   "sleep_ms": args.sleep_ms, **extra}
            try:
                host = []
                for _ in range(3):
                    device_sync(device)
                    dist.barrier(group=ctrl)
                    sleeper(args.sleep_ms)
                    t0 = time.perf_counter()
                    work = call(mode == "async")
                    if mode == "async":
                        work.wait()
                    host.append(time.perf_counter() - t0)
                    device_sync(device)
                row["host_s"] = host
            except Exception as exc:  # noqa: BLE001
                row.update(_error_row(exc))
            rows.add(row)
    dist.barrier(group=ctrl)


# -- stream semantics -----------------------------------------------------------------------------------
def _mismatch(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None if ``got`` equals ``want`` bit for bit; else where and what (both copied to the host)."""
    got, want = got.cpu(), want.cpu()
    if got.shape == want.shape and torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
        return None
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    bad = (got != want).nonzero()
    i = int(bad[0]) if len(bad) else 0
    return f"{len(bad)} of {got.numel()} elements wrong; first at {i}: {got[i].item()}, expected {want[i].item()}"


def _case(rows: Rows, case: str, extra: dict, body: Callable[[], dict]) -> None:
    rows.begin(f"streams {case}")
    row: dict = {"phase": "streams", "case": case, **extra}
    try:
        row.update(body())
    except Exception as exc:  # noqa: BLE001
        row.update(_error_row(exc))
    rows.add(row)


def phase_streams(args, rows: Rows, device: torch.device, ctrl, group, world: int, sleeper: Sleeper,
                  extra: dict) -> None:
    if device.type != "cuda":
        rows.add({"phase": "streams", "case": "all", "skipped": "not CUDA", **extra})
        return
    rank = dist.get_rank(group) if group is not None else dist.get_rank()
    n = args.stream_numel
    trials = args.stream_trials

    def aligned() -> None:
        device_sync(device)
        dist.barrier(group=ctrl)

    def wait_other_stream() -> dict:
        s1, s2 = torch.cuda.Stream(device), torch.cuda.Stream(device)
        x = torch.zeros(n, device=device)
        wrong, first, wait_host = 0, None, []
        for t in range(trials):
            aligned()
            with torch.cuda.stream(s1):
                sleeper(args.sleep_ms)
                x.fill_(float(rank + 1 + 10 * t))
                work = dist.all_reduce(x, group=group, async_op=True)
            with torch.cuda.stream(s2):
                t0 = time.perf_counter()
                work.wait()
                wait_host.append(time.perf_counter() - t0)
                sleeper(2)
                y = x.clone()
            device_sync(device)
            want = torch.full((n,), float(sum(r + 1 + 10 * t for r in range(world))))
            problem = _mismatch(y, want)
            if problem:
                wrong += 1
                first = first or f"trial {t}: {problem}"
        return {"trials": trials, "wrong": wrong, "first_wrong": first, "wait_host_s": wait_host,
                "sleep_ms": args.sleep_ms}

    def snapshot_at_issue() -> dict:
        inp, out = torch.empty(n, device=device), torch.empty(n * world, device=device)
        wrong, first = 0, None
        for t in range(trials):
            aligned()
            inp.fill_(float(rank + 1 + 10 * t))
            work = dist.all_gather_into_tensor(out, inp, group=group, async_op=True)
            sleeper(args.sleep_ms)  # queued after the issue: the collective must not wait for it ...
            inp.fill_(-1.0)  # ... nor read this
            work.wait()
            want = torch.cat([torch.full((n,), float(r + 1 + 10 * t)) for r in range(world)])
            problem = _mismatch(out, want)
            if problem:
                wrong += 1
                first = first or f"trial {t}: {problem}"
        device_sync(device)
        return {"trials": trials, "wrong": wrong, "first_wrong": first}

    def list_all_gather_side() -> dict:
        side = torch.cuda.Stream(device)
        m = max(n // world, 1)
        inp = torch.zeros(m, device=device)
        wrong, first, count = 0, None, 0
        for t in range(trials):
            for mode in ("sync", "async"):
                count += 1
                aligned()
                sleeper(args.sleep_ms)  # on the default stream: anything put there runs late
                with torch.cuda.stream(side):
                    sleeper(2)
                    inp.fill_(float(rank + 1 + 10 * t))
                    outs = [torch.full((m,), -7.0, device=device) for _ in range(world)]
                    if mode == "sync":
                        dist.all_gather(outs, inp, group=group)
                    else:
                        dist.all_gather(outs, inp, group=group, async_op=True).wait()
                    y = torch.cat(outs)
                device_sync(device)
                want = torch.cat([torch.full((m,), float(r + 1 + 10 * t)) for r in range(world)])
                problem = _mismatch(y, want)
                if problem:
                    wrong += 1
                    first = first or f"trial {t} {mode}: {problem}"
        return {"trials": count, "wrong": wrong, "first_wrong": first}

    _case(rows, "wait_other_stream", extra, wait_other_stream)
    _case(rows, "snapshot_at_issue", extra, snapshot_at_issue)
    _case(rows, "list_all_gather_side", extra, list_all_gather_side)
    dist.barrier(group=ctrl)


# -- per-group FIFO -------------------------------------------------------------------------------------
def phase_fifo(args, rows: Rows, device: torch.device, ctrl, groups: tuple, world: int, extra: dict) -> None:
    """``all_reduce(t_i, async_op=True); broadcast(t_i, 0)``, i = 0..trials-1 back to back; then every work waited
    and every tensor checked against the sum over ranks (the broadcast of rank 0's reduced tensor)."""
    rank = dist.get_rank()
    n = args.fifo_numel

    def run(case: str, use: tuple) -> None:
        rows.begin(f"fifo {case}")
        row: dict = {"phase": "fifo", "case": case, "trials": args.fifo_trials, **extra}
        try:
            device_sync(device)
            dist.barrier(group=ctrl)
            tensors: list[tuple[torch.Tensor, float]] = []
            works = []
            for i in range(args.fifo_trials):
                batch = [torch.full((n,), float(rank + 1 + 7 * i + 1000 * k), device=device) for k in range(len(use))]
                for t, group in zip(batch, use):  # two groups: AR g1, AR g2, then BC g1, BC g2
                    works.append(dist.all_reduce(t, group=group, async_op=True))
                for t, group in zip(batch, use):
                    dist.broadcast(t, dist.get_global_rank(group, 0) if group is not None else 0, group=group)
                tensors += [(t, float(sum(r + 1 + 7 * i + 1000 * k for r in range(world))))
                            for k, t in enumerate(batch)]
            for work in works:
                work.wait()
            wrong, first = 0, None
            for j, (t, want) in enumerate(tensors):
                problem = _mismatch(t, torch.full((n,), want))
                if problem:
                    wrong += 1
                    first = first or f"call {j}: {problem}"
            row.update(wrong=wrong, checked=len(tensors), first_wrong=first)
        except Exception as exc:  # noqa: BLE001
            row.update(_error_row(exc))
        rows.add(row)

    run("one_group", groups[:1])
    run("two_groups", groups[:2])
    dist.barrier(group=ctrl)


# -- plans ----------------------------------------------------------------------------------------------
def plan_env(plan: str) -> str:
    """``PCCL_ALGO`` forcing ``plan`` on all-gather, reduce-scatter and all-reduce."""
    return ",".join(f"{c}:{plan}" for c in PLAN_COLLECTIVES)


@contextmanager
def env_set(name: str, value: str | None) -> Iterator[None]:
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def plan_groups(plan: str, device: torch.device) -> tuple:
    """Two new groups of every rank with the default group's backend, their CUDA communicators built under
    ``PCCL_ALGO`` forcing ``plan`` (one all-reduce each)."""
    with env_set("PCCL_ALGO", plan_env(plan)):
        groups = (dist.new_group(), dist.new_group())  # the default group's backend
        for group in groups:
            dist.all_reduce(torch.ones(4, device=device), group=group)
        device_sync(device)
    return groups


def pccl_algorithms(group) -> dict[str, int]:
    """Calls per ``collective:algorithm`` of a pccl group's communicators (empty for another backend)."""
    try:
        import pccl_torch as pc
        from pccl_torch.integrations.torch_backend import PcclProcessGroup

        pg = group if group is not None else dist.group.WORLD
        if not isinstance(pg, PcclProcessGroup):
            return {}
        counts: dict[str, int] = {}
        for comm in pg.communicators():
            for key, value in pc.stats(comm).get("algorithms", {}).items():
                counts[key] = counts.get(key, 0) + value
        return counts
    except Exception as exc:  # noqa: BLE001 - a report, never a failure of its own
        return {"error": f"{type(exc).__name__}: {exc}"}


def plan_intra(plan: str) -> dict[str, str | None]:
    """The intra-node library each forced collective's plan names (None: the device's default)."""
    try:
        from pccl_torch.plan import resolve

        return {c: resolve(c, plan).intra for c in PLAN_COLLECTIVES}
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"}


# -- main -----------------------------------------------------------------------------------------------
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="pccl", help="pccl, nccl (cpu:gloo,cuda:nccl), gloo, or a backend string")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--label", default="contract", help="this launch's name in every row")
    parser.add_argument("--rows", type=Path, help="folder for rank<r>.jsonl")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--plans", default="", help="comma list: run the phases on a pccl group per forced plan")
    parser.add_argument("--hostid-per-rank", action="store_true", help="NCCL_HOSTID per rank (ranks sharing a GPU)")
    parser.add_argument("--timeout-s", type=int, default=90, help="process-group timeout")
    model = parser.add_argument_group("train")
    model.add_argument("--steps", type=int, default=10)
    model.add_argument("--batch", type=int, default=8)
    model.add_argument("--block", type=int, default=128)
    model.add_argument("--layers", type=int, default=4)
    model.add_argument("--embd", type=int, default=256)
    model.add_argument("--seed", type=int, default=0)
    model.add_argument("--sync-steps", type=int, default=2)
    timing = parser.add_argument_group("timing, streams, fifo")
    timing.add_argument("--timing-mib", type=int, default=16)
    timing.add_argument("--timing-warmup", type=int, default=3)
    timing.add_argument("--timing-iters", type=int, default=10)
    timing.add_argument("--sleep-ms", type=float, default=50.0)
    timing.add_argument("--stream-numel", type=int, default=1 << 16)
    timing.add_argument("--stream-trials", type=int, default=3)
    timing.add_argument("--fifo-trials", type=int, default=50)
    timing.add_argument("--fifo-numel", type=int, default=4096)
    args = parser.parse_args(argv)
    unknown = set(filter(None, args.phases.split(","))) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases {sorted(unknown)}; choose from {', '.join(PHASES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    wanted = set(filter(None, args.phases.split(",")))
    rank, world, _ = launched_rank()
    base = {"label": args.label, "requested_backend": args.backend, "device": args.device, "world": world,
            "local_size": os.environ.get("PCCL_LOCAL_SIZE"), "pccl_algo": os.environ.get("PCCL_ALGO"),
            "pccl_async": os.environ.get("PCCL_ASYNC")}
    rows = Rows(args.rows, rank, base)
    started = time.perf_counter()
    rows.begin("init")
    try:
        launcher, device = init(args)
    except Exception as exc:  # noqa: BLE001 - the row names it; nothing else can run
        rows.add({"phase": "init", **_error_row(exc)})
        return 1
    backend = dist.get_backend()
    rows.base.update(launcher=launcher, backend=str(backend), group_type=type(dist.group.WORLD).__name__,
                     torch=torch.__version__)
    rows.add({"phase": "init", "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None})
    ctrl = dist.new_group(backend="gloo")  # host-side alignment and nothing else
    sleeper = Sleeper(device)

    if "train" in wanted:
        phase_train(args, rows, device, ctrl)
    if "sync-warn" in wanted:
        phase_sync(args, rows, device, ctrl, "warn")  # a step that raised is in its row; the phases go on
    plans = [p for p in args.plans.split(",") if p] or [None]
    for plan in plans:
        extra = {"plan": plan or "auto"}
        if plan is None:
            groups: tuple = (None, dist.new_group()) if "fifo" in wanted else (None,)
        else:
            rows.begin(f"plan {plan}")
            try:
                groups = plan_groups(plan, device)
            except Exception as exc:  # noqa: BLE001
                rows.add({"phase": "plan", **extra, **_error_row(exc)})
                continue
        if "timing" in wanted:
            phase_timing(args, rows, device, ctrl, groups[0], world, sleeper, extra)
        if "streams" in wanted:
            phase_streams(args, rows, device, ctrl, groups[0], world, sleeper, extra)
        if "fifo" in wanted:
            phase_fifo(args, rows, device, ctrl, groups, world, extra)
        rows.add({"phase": "algorithms", **extra, "intra": plan_intra(plan) if plan else None,
                  "algorithms": pccl_algorithms(groups[0])})
    raised = "sync-error" in wanted and phase_sync(args, rows, device, ctrl, "error")
    rows.add({"phase": "end", "seconds": round(time.perf_counter() - started, 1),
              "algorithms_world": pccl_algorithms(None)})
    if raised:  # a step stopped inside its collectives: no teardown that could wait for them (rows are on disk)
        sys.stdout.flush()
        os._exit(0)
    try:
        dist.barrier(group=ctrl)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the rows are written
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
