"""mpi4py transport: zero-copy point-to-point and native collectives on torch tensors.

CPU tensors go to MPI through the buffer protocol of a byte view (``tensor.view(torch.uint8).numpy()``:
no copy, and it works for bfloat16, which has no NumPy or MPI type). CUDA tensors go through
``__cuda_array_interface__`` after the producing stream is synchronised, when the MPI library is
CUDA-aware (``PCCL_CUDA_AWARE_MPI=1``); otherwise they are staged through host memory.
Never pickled objects, never ``.tolist()``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from mpi4py import MPI

from pccl_torch.ops import ReduceOp
from pccl_torch.transport.base import Transport

_MPI_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD, ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX}
# MPI has no 16-bit float types: native reductions on them run on a float32 copy.
_UPCAST = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def cuda_aware() -> bool:
    """Whether CUDA buffers may be handed to MPI directly (opt-in: the PyPI MPI builds are not)."""
    return os.environ.get("PCCL_CUDA_AWARE_MPI", "0") == "1"


def _byte_buffer(tensor: torch.Tensor) -> Any:
    raw = tensor.reshape(-1).view(torch.uint8)
    if raw.is_cuda:
        torch.cuda.current_stream(raw.device).synchronize()
        return [raw, MPI.BYTE]
    return [raw.numpy(), MPI.BYTE]


@contextmanager
def _host_staged(tensor: torch.Tensor, *, copy_back: bool) -> Iterator[torch.Tensor]:
    """Yield ``tensor`` itself, or a host copy of a CUDA tensor when MPI is not CUDA-aware."""
    if not tensor.is_cuda or cuda_aware():
        yield tensor
        return
    host = tensor.to("cpu")
    yield host
    if copy_back:
        tensor.copy_(host)


class MPITransport(Transport):
    """Point-to-point messages and native collectives over an mpi4py communicator."""

    name = "mpi"

    def __init__(self, comm: "MPI.Comm", *, owned: bool = False) -> None:
        self.comm = comm
        self._owned = owned
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()

    def send(self, tensor: torch.Tensor, dest: int) -> None:
        with _host_staged(tensor, copy_back=False) as buf:
            self.comm.Send(_byte_buffer(buf), dest)

    def recv(self, tensor: torch.Tensor, source: int) -> None:
        with _host_staged(tensor, copy_back=True) as buf:
            self.comm.Recv(_byte_buffer(buf), source)

    def sendrecv(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int) -> None:
        with _host_staged(send, copy_back=False) as sbuf, _host_staged(recv, copy_back=True) as rbuf:
            self.comm.Sendrecv(_byte_buffer(sbuf), dest, 0, _byte_buffer(rbuf), source, 0)

    def native_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        with _host_staged(inp, copy_back=False) as sbuf, _host_staged(out, copy_back=True) as rbuf:
            self.comm.Allgather(_byte_buffer(sbuf), _byte_buffer(rbuf))

    def native_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp) -> None:
        with self._typed(inp, copy_back=False) as src, self._typed(out, copy_back=True) as dst:
            self.comm.Reduce_scatter_block(src.numpy(), dst.numpy(), _MPI_OPS[op])

    def native_all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        with self._typed(tensor, copy_back=True) as buf:
            self.comm.Allreduce(MPI.IN_PLACE, buf.numpy(), _MPI_OPS[op])

    @staticmethod
    @contextmanager
    def _typed(tensor: torch.Tensor, *, copy_back: bool) -> Iterator[torch.Tensor]:
        """A host tensor of an MPI-reducible dtype holding ``tensor`` (itself when possible)."""
        wanted = _UPCAST.get(tensor.dtype, tensor.dtype)
        if wanted == tensor.dtype and not tensor.is_cuda:
            yield tensor
            return
        staged = tensor.to(device="cpu", dtype=wanted)
        yield staged
        if copy_back:
            tensor.copy_(staged)

    def close(self) -> None:
        if self._owned and self.comm != MPI.COMM_NULL:
            self.comm.Free()
            self.comm = MPI.COMM_NULL
