"""torch.distributed transport: a process group (NCCL on CUDA, gloo on CPU) as the "vendor library".

Used for the intra-node phase of the hierarchical collectives and for the flat ``vendor`` algorithm.
Peers are group ranks; torch maps them to global ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from pccl_torch.ops import ReduceOp
from pccl_torch.transport.base import Transport

# torch 2.13 renamed the tensor forms and deprecated the old names; older releases only have those.
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

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
        self._rank = dist.get_rank(group)
        self._size = dist.get_world_size(group)
        self.name = f"torch:{dist.get_backend(group)}"

    def send(self, tensor: torch.Tensor, dest: int) -> None:
        dist.send(tensor, group=self.group, group_dst=dest)

    def recv(self, tensor: torch.Tensor, source: int) -> None:
        dist.recv(tensor, group=self.group, group_src=source)

    def sendrecv(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int) -> None:
        ops = [
            dist.P2POp(dist.isend, send, group=self.group, group_peer=dest),
            dist.P2POp(dist.irecv, recv, group=self.group, group_peer=source),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    def native_all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        _all_gather_tensor(out, inp, group=self.group)

    def native_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp) -> None:
        _reduce_scatter_tensor(out, inp, op=_TORCH_OPS[op], group=self.group)

    def native_all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        dist.all_reduce(tensor, op=_TORCH_OPS[op], group=self.group)

    def close(self) -> None:
        if self._owned and self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None
