"""torch.distributed transport: a process group (NCCL on CUDA, gloo on CPU) as the "vendor library".

Used for the intra-node phase of the hierarchical collectives and for the flat ``vendor`` algorithm.
It calls the process group's own methods, so it works both with groups registered in torch.distributed
(``new_group``) and with the private gloo groups the ``pccl`` backend builds inside itself.
Peers are group ranks. Every wait is bounded by the transport's timeout; gloo's own errors (timeout, a peer's
connection closed) become ``Stalled`` like the MPI transport's.
"""

from __future__ import annotations

import datetime
import time
from typing import Any
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pccl_torch import flight_recorder
from pccl_torch.errors import Stalled
from pccl_torch.ops import ReduceOp
from pccl_torch.transport.base import Transport, check_split_counts

LIBRARY_BY_DEVICE = {"cpu": "gloo", "cuda": "nccl"}
"""The torch.distributed library pccl's groups use for each device type's tensors."""

_TORCH_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
}


class TorchGroupTransport(Transport):
    """Point-to-point messages and native collectives over a torch.distributed process group."""

    def __init__(self, group: dist.ProcessGroup, *, owned: bool = False) -> None:
        self.group = group
        self._owned = owned
        self._rank = group.rank()
        self._size = group.size()
        self.name = f"torch:{group.name()}"
        self.host_capable = "nccl" not in self.name.lower()  # NCCL takes CUDA tensors only

    def send(self, tensor: torch.Tensor, dest: int) -> None:
        self._wait([self.group.send([tensor], dest, 0)], [dest], f"send to rank {dest}")

    def recv(self, tensor: torch.Tensor, source: int) -> None:
        self._wait([self.group.recv([tensor], source, 0)], [source], f"receive from rank {source}")

    def sendrecv(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int) -> None:
        """Both at once: NCCL's pair goes in one group (``ncclGroupStart``/``End``, what ``batch_isend_irecv``
        does), since an unbatched send waits for its receiver past NCCL's buffering and two ranks sending to each
        other first would hang; gloo's send returns at once."""
        nccl = None if self.host_capable else _nccl_backend(self.group)
        if nccl is not None:
            nccl._group_start()
        try:
            outgoing = self.group.send([send], dest, 0)
            incoming = self.group.recv([recv], source, 0)
        finally:
            if nccl is not None:
                nccl._group_end()
        self._wait([incoming, outgoing], [source, dest], f"exchange with ranks {source}/{dest}")

    def start_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> dist.Work:
        return self.group._allgather_base(out, inp)

    def start_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp) -> dist.Work:
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = _TORCH_OPS[op]
        return self.group._reduce_scatter_base(out, inp, opts)

    def start_all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> dist.Work:
        opts = dist.AllreduceOptions()
        opts.reduceOp = _TORCH_OPS[op]
        return self.group.allreduce([tensor], opts)

    def start_all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: Sequence[int] | None = None,
                         recv_counts: Sequence[int] | None = None) -> dist.Work:
        """torch's all-to-all on the bytes of the blocks (split sizes in bytes: any dtype, NCCL's included)."""
        check_split_counts(send_counts, recv_counts)
        size = inp.element_size()
        return self.group.alltoall_base(out.view(torch.uint8), inp.view(torch.uint8),
                                        [] if recv_counts is None else [c * size for c in recv_counts],
                                        [] if send_counts is None else [c * size for c in send_counts],
                                        dist.AllToAllOptions())

    def native_all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: Sequence[int],
                          recv_counts: Sequence[int]) -> None:
        self.wait(self.start_all_to_all(out, inp, send_counts, recv_counts), "native all-to-all")

    def wait(self, request: dist.Work, what: str) -> None:
        self._wait([request], self.others(), what)

    def native_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self.wait(self.start_all_gather(out, inp), "native all-gather")

    def native_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp) -> None:
        self.wait(self.start_reduce_scatter(out, inp, op), "native reduce-scatter")

    def native_all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        self.wait(self.start_all_reduce(tensor, op), "native all-reduce")

    def barrier(self) -> None:
        self._wait([self.group.barrier()], self.others(), "barrier")

    def _wait(self, works: list[dist.Work], peers: Sequence[int], what: str) -> None:
        """Wait for ``works`` within the timeout; a gloo/NCCL failure or timeout becomes ``Stalled``. NCCL's works
        are waited as ProcessGroupNCCL means them: the current stream waits, the host goes on (NCCL's own watchdog
        bounds them by the group's timeout). A host wait marks the running call's flight-recorder slot with who it
        waits for."""
        start = time.monotonic()
        waiting = flight_recorder.waiting_on(self, peers) if self.host_capable else None
        for work in works:
            try:
                if self.host_capable:
                    work.wait(datetime.timedelta(seconds=max(self.timeout_s - (time.monotonic() - start), 0.001)))
                else:
                    work.wait()
            except RuntimeError as exc:
                raise Stalled(self.communicator_ranks(peers), time.monotonic() - start,
                              f"{what} over {self.name}: {str(exc).splitlines()[0]}") from exc
        flight_recorder.waited(waiting)

    def close(self) -> None:
        """Let go of the group: an owned one is destroyed where torch registered it, else (a private group over a
        store) shut down; either way this transport drops it, so that a group nobody else holds is freed now,
        its threads joined, rather than in the interpreter's final teardown."""
        if self.group is None:
            return
        if self._owned:
            if dist.is_initialized() and self.group in dist.distributed_c10d._world.pg_map:
                dist.destroy_process_group(self.group)
            else:
                self.group.shutdown()
        self.group = None


def _nccl_backend(group: dist.ProcessGroup) -> Any | None:
    """The NCCL backend of ``group`` (which has ``_group_start``/``_group_end``): the group itself where it is one,
    else its CUDA backend, as torch's own abort finds it (a ``new_group`` / ``new_subgroups_by_enumeration``
    group is a ProcessGroup wrapping it: before, such groups' probe pairs went unbatched); None for other libraries."""
    if hasattr(group, "_group_start"):
        return group
    try:
        backend = group._get_backend(torch.device("cuda"))
    except (RuntimeError, AttributeError):
        return None
    return backend if hasattr(backend, "_group_start") else None
