"""CUDA streams that belong to pccl alone, and the host's one way of waiting for a stream.

Why not ``torch.cuda.Stream()``: it creates nothing. It hands out the next of a pool of 32 streams per device and
priority, round-robin, the pool ProcessGroupNCCL, FSDP2 and user code draw from too; the 33rd request returns the
first stream again. pccl queues *waits* on its streams (a gate's ``cuStreamWaitValue32``, event waits) whose
releasing write another thread queues later. Were such a stream shared, anyone's work queued on it after the wait
would sit behind it, and if that work is what the write needs (the worker's copies, an event the write follows),
the device's queue holds a cycle: a hang, within ~32 calls where a stream was taken per call.

So every stream pccl waits on or writes a gate on comes from :func:`new_stream`: created through the CUDA driver
(``cuStreamCreateWithPriority``, non-blocking: no implicit order with the legacy default stream), wrapped in
``torch.cuda.ExternalStream``, owned by one pccl object (a group's queue, a transport's staging) for the life of the
process, never one per call.

The host waits for a stream only through :func:`host_wait`: an event recorded on it, then ``Event.synchronize``
(allowed under ``torch.cuda.set_sync_debug_mode("error")``, where ``Stream.synchronize`` raises).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

NON_BLOCKING = 0x1
"""``CU_STREAM_NON_BLOCKING``: the stream does not synchronise with the legacy default stream (as torch's own)."""

_OWNED: set[int] = set()
"""Handles of the streams :func:`new_stream` created (what the GPU check compares torch's pool against)."""


def new_stream(device: torch.device | int, priority: int = 0) -> torch.cuda.ExternalStream:
    """A stream of pccl's own on ``device``: created now through the driver, never drawn from torch's pool. The
    caller keeps it (one per role and owner, never one per call); it lives as long as the process."""
    index = device if isinstance(device, int) else (device.index if device.index is not None
                                                     else torch.cuda.current_device())
    driver = _driver()
    if driver is None:
        raise RuntimeError("pccl needs the CUDA driver (libcuda.so.1) to create its streams; none was found")
    get_device, retain, push, pop, create = driver
    torch.cuda.current_stream(index)  # torch's lazy initialisation of the device (the primary context exists)
    handle, context, popped = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    stream = ctypes.c_void_p()
    _check(get_device(ctypes.byref(handle), index), "cuDeviceGet")
    _check(retain(ctypes.byref(context), handle), "cuDevicePrimaryCtxRetain")  # kept: the stream lives on
    _check(push(context), "cuCtxPushCurrent")  # any thread: the driver needs the device's context current
    try:
        _check(create(ctypes.byref(stream), NON_BLOCKING, priority), "cuStreamCreateWithPriority")
    finally:
        _check(pop(ctypes.byref(popped)), "cuCtxPopCurrent")
    _OWNED.add(stream.value)
    return torch.cuda.ExternalStream(stream.value, device=torch.device("cuda", index))


def owned(stream: torch.cuda.Stream) -> bool:
    """Whether ``stream`` is one :func:`new_stream` created (not one of torch's pool)."""
    return stream.cuda_stream in _OWNED


def host_wait(stream: torch.cuda.Stream) -> None:
    """Block this thread until what ``stream`` holds so far is done: an event, not ``Stream.synchronize`` (which
    ``set_sync_debug_mode("error")`` refuses). Only where the host itself needs the bytes (MPI reads host memory)."""
    done = torch.cuda.Event()
    done.record(stream)
    done.synchronize()


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with CUDA driver error {status}")


@functools.cache
def _driver() -> tuple[Callable, ...] | None:
    """The driver's ``cuDeviceGet``, ``cuDevicePrimaryCtxRetain``, ``cuCtxPushCurrent``, ``cuCtxPopCurrent`` and
    ``cuStreamCreateWithPriority`` (``_v2`` forms where exported), or None without a CUDA driver."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    signatures = {
        "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
        "cuDevicePrimaryCtxRetain": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int],
        "cuCtxPushCurrent": [ctypes.c_void_p],
        "cuCtxPopCurrent": [ctypes.POINTER(ctypes.c_void_p)],
        "cuStreamCreateWithPriority": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int],
    }
    found = []
    for name, argtypes in signatures.items():
        function = getattr(lib, f"{name}_v2", None) or getattr(lib, name, None)
        if function is None:
            return None
        function.restype = ctypes.c_int
        function.argtypes = argtypes
        found.append(function)
    return tuple(found)
