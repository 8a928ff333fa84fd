"""Host scratch buffers that the schedules reuse from call to call instead of allocating their temporaries anew.

Why: torch's CPU allocator hands every large tensor to ``malloc``, and glibc serves requests above its mmap
threshold (at most 32 MiB) with a fresh ``mmap`` and returns them with ``munmap``. A schedule that allocates its
temporaries per call then page-faults every page of them on every call: on this project's 2-core machine,
writing 128 MiB into fresh memory took 60 ms, into memory written before 8.5 ms. A 16 MiB all-gather over 4 nodes
x 2 ranks touches 192 MiB of temporaries a rank, so the faults alone cost more CPU than the copies (NCCL, too,
keeps its buffers for the communicator's life).

Rules for a caller:
- ``role`` names one allocation site (``"pipelined.all_gather.from_nodes"``): two tensors taken under the same
  role share memory, so a site takes its role once per call and every role belongs to one site.
- The tensor must not outlive the call that took it (it is the next call's scratch): every request that reads
  or writes it is waited for before the call returns.
- Its contents are whatever the last call left: a site that needs zeros writes them.

Buffers are per thread (a communicator runs its calls one at a time, on its worker thread or in the caller's),
host memory only, and bounded. A device request is the call's: from the workspace its issuing thread reserved, when
a worker runs the call behind a closed gate (``pccl_torch.workspace``: the worker never allocates device memory),
else from torch's caching allocator, which already reuses it; pinned staging comes from torch's caching host
allocator. The bound: ``PCCL_SCRATCH_BYTES`` (default 1 GiB) caps what one thread keeps, and a request that
would pass the cap gets a fresh tensor, as before. ``PCCL_SCRATCH_BYTES=0`` keeps
nothing (every call allocates, the behaviour before this module).
"""

from __future__ import annotations

import threading

import torch

from pccl_torch import environment, workspace

SCRATCH_ENV = "PCCL_SCRATCH_BYTES"
DEFAULT_LIMIT = 1 << 30

_local = threading.local()


def limit() -> int:
    """The most bytes of scratch one thread keeps (``PCCL_SCRATCH_BYTES``; read whenever a buffer would be made or
    grown, so tests and benchmarks can change it)."""
    return environment.count(SCRATCH_ENV, DEFAULT_LIMIT, "bytes >= 0 (0 keeps no scratch)")


def empty(role: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 1-D tensor of ``numel`` elements for ``role`` (uninitialised, see the module's rules): on a device, or
    wherever this thread serves a workspace, the call's (``workspace.empty``); on the host, the thread's kept
    buffer for ``role`` while the thread's buffers stay within the limit, else a fresh ``torch.empty``."""
    if device.type != "cpu" or workspace.serves(device):
        return workspace.empty(numel, dtype, device)
    nbytes = numel * dtype.itemsize
    kept: dict[str, torch.Tensor] = _local.__dict__.setdefault("buffers", {})
    buffer = kept.get(role)
    if buffer is None or buffer.numel() < nbytes:
        others = sum(b.numel() for r, b in kept.items() if r != role)
        if others + nbytes > limit():
            return torch.empty(numel, dtype=dtype)
        kept.pop(role, None)  # the smaller buffer goes before the larger one is made
        buffer = kept[role] = torch.empty(nbytes, dtype=torch.uint8)
    return buffer[:nbytes].view(dtype)


def empty_like(role: str, tensor: torch.Tensor) -> torch.Tensor:
    """:func:`empty` with ``tensor``'s shape, dtype and device (``torch.empty_like`` for a contiguous tensor)."""
    return empty(role, tensor.numel(), tensor.dtype, tensor.device).view(tensor.shape)


def kept_bytes() -> int:
    """Bytes of scratch this thread keeps now."""
    return sum(b.numel() for b in _local.__dict__.get("buffers", {}).values())


def release() -> None:
    """Free this thread's scratch (the next call allocates it again)."""
    _local.__dict__.pop("buffers", None)
