"""The parts of NCCL's contract a CPU run can decide, through the ``pccl`` backend under torchrun or mpiexec.

- ``--fifo``: one FIFO per group. ``all_reduce(t, async_op=True)`` then ``broadcast(t, 0)`` (a call pccl hands to
  the vendor library) repeated with new values each time, with no wait between them: the broadcast must see the
  all-reduce's result, as on one NCCL group. Then the same across a second pccl group, and a bypassed all-reduce
  (uint8, which pccl does not serve) behind a queued one. Counts every wrong result.
- ``--device-levels``: pccl's torch-group levels are replaced by *emulated device levels* (real gloo groups behind
  a wrapper that refuses the integer and float64 tensors every pccl control exchange uses, as NCCL refuses host
  tensors; the data here is float32 only). ``init_process_group("pccl")``, then the collectives with signature
  checks on: every set-up and control exchange must go over the host-capable control level, never a device level.
  Also counts the host-synchronising calls (``.item()``, ``.tolist()``, ``.cpu()``, synchronize) pccl makes on the
  data path of bound, even-sized exact collectives: a CUDA run would block the host at each.

Rank results go through ``rank_result`` (``PCCL_TEST_RESULT_DIR``).
"""

from __future__ import annotations

import argparse
import os
import traceback

import torch
import torch.distributed as dist

import pccl_torch as pc
import rank_result  # this folder is on sys.path when the driver runs as a script
from pccl_torch import launcher
from pccl_torch.integrations.torch_backend import communicator_of

REPEATS = 40
CONTROL_DTYPES = (torch.int64, torch.uint8, torch.float64)
"""What pccl's control exchanges are made of (JSON bytes, lengths, signatures, counts, tuning medians)."""


class HostTensorRefused(RuntimeError):
    """A control tensor reached an emulated device level."""


class EmulatedDeviceGroup:
    """A real gloo group that behaves, for pccl, as a device library's (NCCL's) does: its name says nccl (so pccl
    treats it as a level that takes device tensors only), and it refuses the tensors of control exchanges."""

    def __init__(self, inner: dist.ProcessGroup, level: str) -> None:
        self._inner, self._level = inner, level
        self.refused: list[str] = []

    def rank(self) -> int:
        return self._inner.rank()

    def size(self) -> int:
        return self._inner.size()

    def name(self) -> str:
        return "emulated-nccl"

    def shutdown(self) -> None:
        self._inner.shutdown()

    def _checked(self, method: str):
        def call(*args, **kwargs):
            for tensor in _tensors(args):
                if tensor.dtype in CONTROL_DTYPES:
                    what = f"{method} of a {tensor.dtype} tensor over the {self._level} level"
                    self.refused.append(what)
                    raise HostTensorRefused(f"a device level refuses host control tensors: {what}")
            return getattr(self._inner, method)(*args, **kwargs)
        return call

    def __getattr__(self, method: str):
        return self._checked(method)


def _tensors(args):
    for arg in args:
        if isinstance(arg, torch.Tensor):
            yield arg
        elif isinstance(arg, (list, tuple)):
            yield from _tensors(arg)


EMULATED: list[EmulatedDeviceGroup] = []


def install_device_levels() -> None:
    """Make every torch-group level pccl builds an emulated device level (world, intra, inter)."""
    original = launcher.torch_levels

    def levels(*args, **kwargs):
        groups = original(*args, **kwargs)
        wrapped = [EmulatedDeviceGroup(g, level) for g, level in zip(groups, ("world", "intra", "inter"))]
        EMULATED.extend(wrapped)
        return tuple(wrapped)

    launcher.torch_levels = levels


def check_fifo(rank: int, size: int) -> tuple[int, int, list[str]]:
    """(checks, wrong, notes): the all-reduce/broadcast pair repeated on the default group and a second group."""
    second = dist.new_group(list(range(size)), backend="pccl")
    wrong, checks, notes = 0, 0, []
    total = sum(range(1, size + 1))
    for i in range(REPEATS):
        for group in (None, second):
            t = torch.full((4096,), float(rank + 1 + i), dtype=torch.float32)
            dist.all_reduce(t, async_op=True, group=group)
            dist.broadcast(t, 0, group=group)  # delegated: must run after the queued all-reduce
            expected = float(total + size * i)
            checks += 1
            if not bool((t == expected).all()):
                wrong += 1
                if len(notes) < 4:
                    notes.append(f"repeat {i} group {'default' if group is None else 'second'}: "
                                 f"{t[0].item()} != {expected}")
        # a bypassed call (uint8 is the vendor library's) behind a queued pccl one, on the same tensor's values
        t = torch.full((1024,), float(rank + 1), dtype=torch.float32)
        work = dist.all_reduce(t, async_op=True)
        u = torch.ones(16, dtype=torch.uint8)
        dist.all_reduce(u)
        dist.broadcast(t, 0)
        work.wait()
        checks += 1
        if not bool((t == float(total)).all()) or not bool((u == size).all()):
            wrong += 1
            if len(notes) < 8:
                notes.append(f"bypassed repeat {i}: {t[0].item()} {u[0].item()}")
    dist.destroy_process_group(second)
    return checks, wrong, notes


def check_collectives(rank: int, size: int) -> tuple[int, list[str]]:
    """The three collectives on float32 (odd sizes) with signature checks on, against their references."""
    failures, passed = [], 0
    comm = communicator_of(None)
    comm.check = True
    for n in (0, 1, 7, 1000):
        t = torch.full((n,), float(rank + 1))
        dist.all_reduce(t)
        out = torch.empty(size * n)
        dist.all_gather_into_tensor(out, torch.full((n,), float(rank)))
        rs_out = torch.empty(n)
        dist.reduce_scatter_tensor(rs_out, torch.ones(size * n))
        ok = (bool((t == sum(range(1, size + 1))).all())
              and torch.equal(out, torch.arange(size).repeat_interleave(n).float())
              and bool((rs_out == size).all()))
        passed += ok
        if not ok:
            failures.append(f"n={n}")
    comm.check = False
    return passed, failures


SYNCHRONISING = ((torch.Tensor, "item"), (torch.Tensor, "tolist"), (torch.Tensor, "cpu"),
                 (torch.cuda, "synchronize"), (torch.cuda.Stream, "synchronize"), (torch.cuda.Event, "synchronize"))
"""What makes the host wait for a GPU (``torch.cuda.set_sync_debug_mode`` names these on a GPU)."""


def count_host_syncs(rank: int, size: int) -> dict[str, int]:
    """Calls of :data:`SYNCHRONISING` made by pccl while it runs even-sized exact collectives of shapes already
    bound (the data path of a training step), through the backend, sync and async."""
    def step() -> None:
        t = torch.full((1024,), float(rank))
        out = torch.empty(size * 256)
        rs = torch.empty(256)
        dist.all_reduce(t)
        dist.all_gather_into_tensor(out, t[:256])
        dist.reduce_scatter_tensor(rs, t[:size * 256])
        works = [dist.all_reduce(t, async_op=True), dist.all_gather_into_tensor(out, t[:256], async_op=True)]
        for work in works:
            work.wait()

    step()  # binds the shapes
    counts: dict[str, int] = {}
    saved = [(owner, name, getattr(owner, name)) for owner, name in SYNCHRONISING]

    def counting(label, original):
        def call(*args, **kwargs):
            counts[label] = counts.get(label, 0) + 1
            return original(*args, **kwargs)
        return call

    for owner, name, original in saved:
        setattr(owner, name, counting(f"{getattr(owner, '__name__', owner)}.{name}", original))
    try:
        step()
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fifo", action="store_true")
    parser.add_argument("--device-levels", action="store_true")
    args = parser.parse_args()
    result: dict = {"failures": []}
    if args.device_levels:
        install_device_levels()
    try:
        dist.init_process_group("pccl")
        rank, size = dist.get_rank(), dist.get_world_size()
        result["async"] = "thread" if communicator_of(None).threaded_async else "inline"
        if args.fifo:
            result["checks"], result["wrong"], notes = check_fifo(rank, size)
            result["failures"] += notes
        if args.device_levels:
            result["emulated_levels"] = len(EMULATED)
            result["host_syncs"] = count_host_syncs(rank, size)
            result["passed"], failures = check_collectives(rank, size)
            result["failures"] += failures
            result["refused"] = [what for group in EMULATED for what in group.refused]
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the rank's result says what failed
        result["failures"].append(traceback.format_exc(limit=6))
        result["refused"] = [what for group in EMULATED for what in group.refused]
        rank_result.write(result)
        raise
    rank_result.write(result)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    main()
