"""Host staging of CUDA tensors for an MPI that is not CUDA-aware: pinned buffers, chunks, a pipeline.

Without CUDA-aware MPI every byte a CUDA tensor sends or receives goes through host memory. Done plainly
(``tensor.to("cpu")`` a message) that copy is pageable (about half of PCIe's speed), synchronous, and nothing
overlaps it. Here instead:

- the host buffers are pinned, kept by the transport and reused across calls (grown to the largest call seen);
- a message is cut into chunks (:data:`CHUNK_BYTES`, at most :data:`MAX_CHUNKS`); every chunk's device-to-host
  copy is queued at once on a side stream, each followed by an event; the host waits for chunk ``c``'s event
  only, runs MPI on it, and queues its host-to-device copy on a second side stream, so the copy engines move
  chunks ``c + 1`` and ``c - 1`` while MPI moves chunk ``c``;
- the side streams wait on the caller's stream, and the caller's stream waits on both (stream waits, never a
  device-wide synchronize), as torch.distributed's NCCL work does. The call returns once MPI is done; the results
  land in the caller's tensors in the caller's stream order.

Reductions of 16-bit floats, which MPI cannot reduce, are staged as float32 (converted on the device, by the
copies), and a chunk of strided rows is gathered on the device: both through the call's workspace lanes, piece by
piece (:func:`transfer`), never a device allocation on a worker (``pccl_torch.workspace``). On host tensors the
same schedule runs with plain copies: that is how every chunking is tested here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from pccl_torch import workspace
from pccl_torch.cuda_streams import new_stream

CHUNK_BYTES = 4 << 20
"""Bytes of one chunk of a staged message: large enough that MPI runs near link speed on it (a chunk is one MPI
call), small enough that a 16 MiB message already overlaps four ways."""
MAX_CHUNKS = 16
"""At most this many chunks a message (larger messages get larger chunks)."""


def chunk_bounds(total: int, chunks: int, multiple: int = 1) -> list[tuple[int, int]]:
    """``[start, stop)`` of up to ``chunks`` consecutive chunks covering ``total`` elements, each a multiple
    of ``multiple`` long (the last may be shorter); no empty chunks (one empty chunk for ``total == 0``)."""
    width = -(-total // max(chunks, 1))
    width = max(-(-width // multiple) * multiple, multiple)
    return [(s, min(s + width, total)) for s in range(0, total, width)] or [(0, 0)]


def chunk_count(nbytes: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """How many chunks a staged message of ``nbytes`` is cut into."""
    return max(1, min(MAX_CHUNKS, -(-nbytes // max(chunk_bytes, 1))))


Copy = tuple[torch.Tensor, torch.Tensor]
"""``(source, destination)`` views of one copy."""


@dataclass
class Chunk:
    """One chunk of a staged message: copies to the host, MPI's work on the host views, copies back."""

    down: Sequence[Copy]
    work: Callable[[], None]
    up: Sequence[Copy] = ()


@dataclass
class _Buffers:
    """One slot of host memory (pinned where CUDA is), grown to the largest request."""

    pinned: bool
    memory: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.uint8))

    def view(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        nbytes = numel * dtype.itemsize
        if self.memory.numel() < nbytes:
            size = 1 << max(nbytes - 1, 0).bit_length()
            self.memory = torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)
        return self.memory[:nbytes].view(dtype)


class HostStaging:
    """A transport's staging memory and side streams, and the pipeline that moves chunks through them.

    Not thread-safe by itself: a communicator runs one collective at a time (its ordered executor)."""

    def __init__(self) -> None:
        self._slots: dict[str, _Buffers] = {}
        self._streams: dict[int, tuple[torch.cuda.Stream, torch.cuda.Stream]] = {}
        self._released: torch.cuda.Event | None = None  # the last call's copies back out of host memory
        self.chunk_bytes = CHUNK_BYTES

    def host(self, slot: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Host memory for ``numel`` elements of ``dtype`` in ``slot`` (``"send"``, ``"recv"``): valid until the
        next call of this staging; pinned when CUDA is available."""
        if self._released is not None:  # the last call's copies back may still read this memory
            self._released.synchronize()
            self._released = None
        buffers = self._slots.get(slot)
        if buffers is None:
            buffers = self._slots[slot] = _Buffers(torch.cuda.is_available())
        return buffers.view(numel, dtype)

    def run(self, chunks: Sequence[Chunk], device: torch.device) -> None:
        """Move ``chunks`` through host memory (views of :meth:`host`, asked for before): see the module
        docstring for the order."""
        if device.type != "cuda":
            for chunk in chunks:
                _copy(chunk.down, non_blocking=False)
                chunk.work()
                _copy(chunk.up, non_blocking=False)
            return
        caller = torch.cuda.current_stream(device)
        down, up = self._side_streams(device)
        down.wait_stream(caller)
        up.wait_stream(caller)
        copied: list[torch.cuda.Event] = []
        with torch.cuda.stream(down):
            for chunk in chunks:
                _copy(chunk.down, non_blocking=True)
                copied.append(torch.cuda.Event())
                copied[-1].record(down)
        try:
            for chunk, event in zip(chunks, copied):
                event.synchronize()  # the host's one wait here: MPI reads these host bytes (docs/gpus.md)
                chunk.work()
                with torch.cuda.stream(up):
                    _copy(chunk.up, non_blocking=True)
        finally:
            self._released = torch.cuda.Event()
            self._released.record(up)
            caller.wait_stream(up)
            caller.wait_stream(down)  # what the side streams used (the workspace's lanes) is the caller's again

    def _side_streams(self, device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
        index = device.index if device.index is not None else torch.cuda.current_device()
        streams = self._streams.get(index)
        if streams is None:
            streams = self._streams[index] = (new_stream(index), new_stream(index))  # pccl's own: see cuda_streams
        return streams


def _copy(copies: Sequence[Copy], *, non_blocking: bool) -> None:
    for source, destination in copies:
        transfer(source, destination, non_blocking=non_blocking)


def transfer(source: torch.Tensor, destination: torch.Tensor, *, non_blocking: bool) -> None:
    """``destination.copy_(source)``. Between a CUDA device and (pinned, contiguous) host memory with
    ``non_blocking``, a change of dtype and the gathering of strided rows are made on the device, through a
    workspace lane (lane 0 down, lane 1 up; piece by piece where the lane is smaller), so the host side is one
    transfer with page-locked memory and the device memory is the call's own (torch's cross-device ``copy_``
    allocates its temporaries on the device, or converts through pageable host memory)."""
    if not non_blocking or source.device == destination.device or \
            (source.dtype == destination.dtype and source.is_contiguous() and destination.is_contiguous()):
        destination.copy_(source, non_blocking=non_blocking)
        return
    down = source.device.type == "cuda"
    device, dtype = (source.device, destination.dtype) if down else (destination.device, source.dtype)
    room = workspace.lane(0 if down else 1, source.numel(), dtype, device)
    for src, dst in _pieces(_rows(source), _rows(destination), max(room.numel(), 1)):
        piece = room[:src.numel()].view(src.shape)
        if down:
            piece.copy_(src)  # on the device: converted, gathered
            dst.copy_(piece, non_blocking=True)
        else:
            piece.copy_(src, non_blocking=True)
            dst.copy_(piece)  # on the device: converted, scattered


def _rows(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as 2-D rows: a strided chunk view as it is, anything contiguous as one row."""
    return tensor if tensor.dim() == 2 else tensor.view(1, -1)


def _pieces(source: torch.Tensor, destination: torch.Tensor, room: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Matching pieces of two ``[rows, width]`` views of at most ``room`` elements each: whole rows where a row
    fits, else pieces of one row (each contiguous wherever its view's rows are)."""
    rows, width = source.shape
    if width <= room:
        step = max(room // max(width, 1), 1)
        for r in range(0, rows, step):
            yield source[r:r + step], destination[r:r + step]
        return
    for r in range(rows):
        for c in range(0, width, room):
            yield source[r:r + 1, c:c + room], destination[r:r + 1, c:c + room]


def blocks(tensor: torch.Tensor, parts: int) -> torch.Tensor:
    """A contiguous tensor as ``parts`` rows (one a rank), for chunking every rank's block alike."""
    return tensor.reshape(parts, tensor.numel() // parts)
