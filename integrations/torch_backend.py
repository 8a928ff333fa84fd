"""The torch.distributed backend ``pccl``: ``import pccl_torch`` registers it.

    dist.init_process_group("pccl")            # under mpiexec; or dist.new_group(ranks, backend="pccl")

A :class:`PcclProcessGroup` runs all-reduce, all-gather and reduce-scatter (tensor and list forms, both
the torch 2.13 names and the older ones, coalesced forms) through pccl's API on CPU tensors, with real
async work handles, and delegates every other call (broadcast, barrier, all_to_all, send/recv, gather,
scatter, reduce, ...) and tensors of other devices to a private gloo group built from the same store.
Creating a subgroup involves only its members: the MPI communicator comes from ``Comm.Create_group``
(collective over the group alone) and the gloo groups from the group's own store.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from pccl_torch import api, failure_notice
from pccl_torch.communicator import Communicator, _agreed_selector, checking_from_env
from pccl_torch.topology import Topology, TopologyError, detect
from pccl_torch.transport.mpi import MPITransport
from pccl_torch.transport.torch_group import TorchGroupTransport

log = logging.getLogger(__name__)

BACKEND_NAME = "pccl"

# Calls pccl leaves to the vendor library, unchanged: ProcessGroup method -> the gloo backend's method.
DELEGATED = {
    "broadcast": "broadcast", "barrier": "barrier", "monitored_barrier": "monitored_barrier",
    "alltoall": "alltoall", "alltoall_base": "alltoall_base", "all_to_all_single": "alltoall_base",
    "send": "send", "recv": "recv", "recv_anysource": "recv_anysource", "gather": "gather",
    "scatter": "scatter", "reduce": "reduce", "allgather_coalesced": "allgather_coalesced",
}


def _completed(tensor_or_none=None) -> dist.Work:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(tensor_or_none)
    return _create_work_from_future(fut)


def _as_work(work: api.Work | None, result: object, then: Callable[[], object] | None = None) -> dist.Work:
    """A c10d Work completing when pccl's ``work`` has (after ``then`` ran, if given)."""
    if work is None:
        if then is not None:
            then()
        return _completed(result)
    future = work.get_future()
    if then is not None:
        future = future.then(lambda f: (f.value(), then())[0])
    return _create_work_from_future(future)


class PcclProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group whose AG/RS/AR run pccl's algorithms (see module docstring)."""

    def __init__(self, comm: Communicator, vendor: dist.ProcessGroup, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self.comm = comm
        self.vendor = vendor
        self._rank, self._size = rank, size
        #: Calls handed to the vendor group, by ProcessGroup method name: the proof that no all-gather,
        #: reduce-scatter or all-reduce bypassed pccl is that those names never appear here.
        self.delegated: Counter[str] = Counter()

    def _to_vendor(self, method: str, *args):
        self.delegated[method] += 1
        return getattr(self.vendor, method)(*args)

    # -- identity ---------------------------------------------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def __repr__(self) -> str:
        t = self.comm.topology
        return f"PcclProcessGroup(rank={t.rank}, size={t.world_size}, {t.num_nodes} nodes x {t.local_size})"

    def _ours(self, *tensors: torch.Tensor) -> bool:
        return all(t.device.type == self.comm.device.type for t in tensors)

    # -- all-reduce -------------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        if not self._ours(*tensors):
            return self._to_vendor("allreduce", tensors, opts)
        works = [api.all_reduce(t, opts.reduceOp, async_op=True, comm=self.comm) for t in tensors]
        return _as_work(works[-1], tensors)  # issued in order: the last one completes last

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        return self.allreduce(tensors, opts)

    # -- all-gather -------------------------------------------------------------------------------------
    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's signature
        if not self._ours(output, input):
            return self._to_vendor("_allgather_base", output, input)
        return _as_work(api.all_gather_into_tensor(output, input, async_op=True, comm=self.comm), output)

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._allgather_base(o, i) for o, i in zip(outputs, inputs, strict=True)]
        return works[-1]

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def allgather(self, output_lists, inputs, opts=None):
        """List form: ``output_lists[0][r]`` receives rank r's ``inputs[0]``."""
        if len(inputs) != 1 or len(output_lists) != 1:
            raise ValueError("pccl supports one tensor per rank in all_gather (multi-device lists are not supported)")
        outputs, inp = output_lists[0], inputs[0]
        if not self._ours(inp, *outputs):
            return self._to_vendor("allgather", output_lists, inputs)
        flat = torch.empty(self._size * inp.numel(), dtype=inp.dtype, device=inp.device)
        work = api.all_gather_into_tensor(flat, inp.contiguous(), async_op=True, comm=self.comm)

        def copy_out() -> None:
            for out, chunk in zip(outputs, flat.view(self._size, -1)):
                out.copy_(chunk.view_as(out))

        return _as_work(work, output_lists, then=copy_out)

    # -- reduce-scatter ---------------------------------------------------------------------------------
    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002 - torch's signature
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        if not self._ours(output, input):
            return self._to_vendor("_reduce_scatter_base", output, input, opts)
        return _as_work(api.reduce_scatter_tensor(output, input, opts.reduceOp, async_op=True, comm=self.comm),
                        output)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return works[-1]

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None):
        """List form: ``outputs[0]`` receives the reduction of every rank's ``input_lists[0][rank]``."""
        if len(outputs) != 1 or len(input_lists) != 1:
            raise ValueError("pccl supports one tensor per rank in reduce_scatter (multi-device lists are not supported)")
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        out, parts = outputs[0], input_lists[0]
        if not self._ours(out, *parts):
            return self._to_vendor("reduce_scatter", outputs, input_lists, opts)
        flat = torch.cat([p.reshape(-1) for p in parts])
        return _as_work(api.reduce_scatter_tensor(out, flat, opts.reduceOp, async_op=True, comm=self.comm), outputs)


def _delegate(name: str, target: str):
    def call(self, *args, **kwargs):
        self.delegated[name] += 1
        return getattr(self.vendor, target)(*args, **kwargs)

    call.__name__ = name
    call.__doc__ = f"Delegated to the vendor (gloo) group's {target}: pccl does not implement {name}."
    return call


for _name, _target in DELEGATED.items():
    setattr(PcclProcessGroup, _name, _delegate(_name, _target))


def _topology_for(comm, size: int) -> Topology:
    """The group's topology; a group that does not split into whole nodes runs flat (one rank a node)."""
    try:
        return detect(comm)
    except TopologyError as exc:
        log.info("pccl group of %d ranks runs flat: %s", size, exc)
        return Topology(comm.Get_rank(), size, 1)


def create_process_group(opts, backend_options=None) -> PcclProcessGroup:
    """The creator registered with torch.distributed (``extended_api=True``). Called on members only."""
    from mpi4py import MPI

    store, rank, size, timeout = opts.store, opts.group_rank, opts.group_size, opts.timeout
    members = list(opts.global_ranks_in_group) or list(range(size))
    world = MPI.COMM_WORLD
    if world.Get_size() < max(members) + 1 or world.Get_rank() != members[rank]:
        raise RuntimeError(
            f"the pccl backend needs an MPI launch whose ranks are torch's ranks: torch rank {members[rank]} of "
            f"{max(members) + 1}, but MPI rank {world.Get_rank()} of {world.Get_size()}. Launch with mpiexec "
            "(e.g. `mpiexec -n 4 python train.py`)"
        )
    group_comm = world.Dup() if len(members) == world.Get_size() else \
        world.Create_group(world.Get_group().Incl(members))
    topology = _topology_for(group_comm, size)
    vendor = dist.ProcessGroupGloo(dist.PrefixStore("pccl/vendor", store), rank, size, timeout)
    intra = dist.ProcessGroupGloo(dist.PrefixStore(f"pccl/intra/{topology.node}", store), topology.local_rank,
                                  topology.local_size, timeout)
    comm = Communicator(
        topology=topology,
        device=torch.device("cpu"),
        world=MPITransport(group_comm, owned=True),
        vendor=TorchGroupTransport(vendor),
        intra=TorchGroupTransport(intra),
        inter=MPITransport(group_comm.Split(color=topology.local_rank, key=topology.node), owned=True),
        selector=_agreed_selector(group_comm),
        timeout_s=timeout.total_seconds(),
        check=checking_from_env(),
    )
    failure_notice.install()
    return PcclProcessGroup(comm, vendor, rank, size)


def register() -> None:
    """Register ``pccl`` with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=["cpu", "cuda"])


ROUTED = ("allreduce", "allreduce_coalesced", "_allgather_base", "allgather", "allgather_into_tensor_coalesced",
          "_reduce_scatter_base", "reduce_scatter", "reduce_scatter_tensor_coalesced")


def bypassed(group: dist.ProcessGroup | None = None) -> dict[str, int]:
    """All-gathers, reduce-scatters and all-reduces of a pccl group that went to the vendor group
    (tensors on a device pccl does not serve); empty when every one ran through pccl."""
    pg = group if group is not None else dist.group.WORLD
    if not isinstance(pg, PcclProcessGroup):
        raise TypeError(f"{pg!r} is not a pccl process group (create it with backend='pccl')")
    return {name: n for name, n in pg.delegated.items() if name in ROUTED}


def communicator_of(group: dist.ProcessGroup | None) -> Communicator:
    """The pccl Communicator behind a ``pccl`` process group (its counters, topology and selector)."""
    pg = group if group is not None else dist.group.WORLD
    if not isinstance(pg, PcclProcessGroup):
        raise TypeError(f"{pg!r} is not a pccl process group (create it with backend='pccl')")
    return pg.comm
