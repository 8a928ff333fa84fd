"""The device memory of a host-driven call, reserved by the issuing thread: the worker never allocates, nor frees,
device memory behind a closed gate.

Why (issue 56, item 5). A host-driven CUDA call closes its group's gate on the order stream at issue, and the
worker opens it once its copies back are queued (``pccl_torch.work``). The caller's buffers are
``record_stream``-ed on the order stream, so when the caller frees one, the caching allocator records its free
event there, *behind* the closed gate. An allocation that misses the allocator's cache and cannot get fresh memory
retries: it synchronises every outstanding free event and ``cudaFree``-s the cached blocks (a device-wide
synchronisation), holding the allocator's lock all along. Were that allocation the worker's, it would wait for the
gate it must open itself; were it another thread's, the worker would wait for the lock at its next allocation or
free. Either way: a device deadlock, under memory pressure only (the hardest kind to find).

So a call's worker part takes every device temporary from its :class:`Workspace`, one block allocated by the
issuing thread before the gate closes (``Queue.issue``), sized by the plan (``Plan.workspace``: the one place that
decides it), ``record_stream``-ed on the worker's stream, and released by an issuing thread once the worker is
done with it (the worker drops no device tensor either: ``Queue`` keeps the call's references until then). Two
calls in flight never share a workspace: each call gets its own block.

A workspace has two parts:

- *takes*: the call-long temporaries of the schedules (``scratch.empty`` on the workspace's device comes here:
  the hierarchical phases' buffers, the inter-node schedules' receive buffers, the reduce-scatter's aliasing and
  pre-scaling copies), bump-allocated in the order asked, never reused within the call;
- two *lanes*: short-lived room for the conversions and gathers of a copy between the device and pinned host memory
  (16-bit floats staged as float32, a chunk of strided rows) and for the float32 accumulator of a 16-bit reduction
  (``triton_kernels.reduce_reference``). A lane is reused piece by piece in one stream's order; every other stream
  that uses one (the staging streams) waits for the worker's stream before and is joined back into it after, so
  uses never overlap and the worker stream's free event covers them all. :data:`LANE_BYTES` bounds a lane: larger
  copies go through it in pieces.

Where no workspace is served (the calling thread of a device-only plan, CPU tensors) :func:`empty` and :func:`lane`
are ``torch.empty``, as before. Not moved (each named in ``docs/gpus.md``): the buffers a two-level all-to-all with
uneven splits regroups (their sizes are the node's send counts, exchanged on the worker: :func:`unreserved`), the
temporaries of compressed plans that are not pipelined (their schedules' and codecs', one per block and format,
sized by the data for ``lossless``: ``Need.complete`` is False for them), and what libraries do inside their own
calls (ProcessGroupNCCL's ``recordStream`` and barrier tensor, NCCL's communicator set-up).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from pccl_torch.errors import PcclError

ALIGN = 256
"""Every take and lane starts at a multiple of this many bytes (what vectorised kernels and typed views need)."""
LANE_BYTES = 8 << 20
"""The most bytes of one lane: copies and reductions larger than that go through it in pieces."""
LANES = 2
"""Lane 0: what goes to the host (and a reduction's accumulator); lane 1: what comes back (and its other input)."""
_WIDE = {torch.float16: 4, torch.bfloat16: 4}
"""Bytes an element takes in a lane: 16-bit floats are staged and reduced as float32."""

_local = threading.local()


class WorkspaceExhausted(PcclError):
    """A worker asked for more device memory than its call reserved at issue: ``Plan.workspace`` misses a
    temporary. Raised rather than allocating behind a closed gate (a possible device deadlock)."""


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGN`."""
    return -(-nbytes // ALIGN) * ALIGN


def lane_bytes(numel: int, dtype: torch.dtype) -> int:
    """Bytes of each lane of a call whose largest buffer holds ``numel`` elements of ``dtype``."""
    return min(LANE_BYTES, aligned(numel * _WIDE.get(dtype, dtype.itemsize)))


@dataclass(frozen=True, slots=True)
class Need:
    """What a call's worker part takes from its workspace: each call-long temporary's bytes, in the order taken,
    and the bytes of each lane."""

    takes: tuple[int, ...] = ()
    lane: int = 0
    complete: bool = True
    """False where the plan's temporaries are not all counted (compressed plans that are not pipelined): what does
    not fit is allocated where the worker runs (the named exception) instead of raising."""

    @property
    def nbytes(self) -> int:
        """Bytes of the whole workspace."""
        return sum(aligned(t) for t in self.takes) + LANES * aligned(self.lane)

    def plus(self, *takes: int) -> Need:
        """This need and ``takes`` more (a call's own temporaries around its plan's)."""
        return Need(self.takes + takes, self.lane, self.complete)


class Workspace:
    """One call's device memory: :class:`Need`'s takes (bump-allocated) and lanes, in one block."""

    def __init__(self, need: Need, device: torch.device) -> None:
        self.need = need
        self.memory = torch.empty(need.nbytes, dtype=torch.uint8, device=device)
        self.device = self.memory.device
        lane = aligned(need.lane)
        self._lanes = tuple(self.memory[i * lane:(i + 1) * lane] for i in range(LANES))
        self._takes = self.memory[LANES * lane:]
        self.used = 0
        """Bytes of takes handed out so far (tests compare it with the plan's reservation)."""

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """``numel`` uninitialised elements of ``dtype``, valid for the rest of the call."""
        nbytes = numel * dtype.itemsize
        start, stop = self.used, self.used + aligned(nbytes)
        if stop > self._takes.numel():
            if not self.need.complete:
                return unreserved(numel, dtype, self.device)
            raise WorkspaceExhausted(
                f"pccl's worker asked for {nbytes} bytes of device memory but its call reserved "
                f"{self._takes.numel()} bytes of temporaries at issue and {start} are taken: the plan's workspace "
                "(Plan.workspace) misses a temporary. The worker may not allocate behind a closed gate "
                "(pccl_torch.workspace); please report this with the call's plan and sizes")
        self.used = stop
        return self._takes[start:start + nbytes].view(dtype)

    def lane(self, index: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Lane ``index`` as up to ``numel`` elements of ``dtype`` (fewer where it is smaller: go piece by piece)."""
        room = self._lanes[index]
        count = min(numel, room.numel() // dtype.itemsize)
        if count < min(numel, 1):
            raise WorkspaceExhausted(f"pccl's worker needs a lane for {dtype} but its call reserved none at issue "
                                     "(Plan.workspace)")
        return room[:count * dtype.itemsize].view(dtype)


def current() -> Workspace | None:
    """The workspace this thread is serving (a worker running a gated call), else None."""
    return getattr(_local, "workspace", None)


@contextlib.contextmanager
def serving(workspace: Workspace | None) -> Iterator[None]:
    """Within: this thread's device temporaries come from ``workspace`` (None: from torch's allocator)."""
    before = current()
    _local.workspace = workspace
    try:
        yield
    finally:
        _local.workspace = before


def _served(device: torch.device) -> Workspace | None:
    workspace = current()
    if workspace is None or device.type != workspace.device.type:
        return None
    index = device.index if device.index is not None else workspace.device.index
    return workspace if index == workspace.device.index else None


def serves(device: torch.device) -> bool:
    """Whether this thread serves a workspace on ``device`` (its temporaries there come from it)."""
    return _served(device) is not None


def empty(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A temporary of ``numel`` elements for the rest of the call: from the served workspace on its device, else
    ``torch.empty``."""
    workspace = _served(device)
    if workspace is None:
        return torch.empty(numel, dtype=dtype, device=device)
    return workspace.take(numel, dtype)


def lane(index: int, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Room for up to ``numel`` elements in lane ``index``: the served workspace's lane on its device (maybe fewer
    elements: callers go piece by piece), else a fresh tensor of all ``numel``."""
    workspace = _served(device)
    if workspace is None:
        return torch.empty(numel, dtype=dtype, device=device)
    return workspace.lane(index, numel, dtype)


def unreserved(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A temporary no workspace counts (an uneven all-to-all's regrouped blocks, whose size only the worker learns;
    what a compressed plan's schedules take): allocated where it runs, the device allocations left on a worker
    (module docstring; ``docs/gpus.md``)."""
    return torch.empty(numel, dtype=dtype, device=device)
