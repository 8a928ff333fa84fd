"""The torch.distributed backend ``pccl``: ``import pccl_torch`` registers it.

    dist.init_process_group("pccl")            # under mpiexec, torchrun, deepspeed or accelerate
    dist.new_group(ranks, backend="pccl")      # a subgroup

A :class:`PcclProcessGroup` runs all-reduce, all-gather and reduce-scatter (tensor and list forms, both
the torch 2.13 names and the older ones, coalesced forms) through pccl's API on CPU tensors, with real
async work handles, and delegates every other call (broadcast, barrier, all_to_all, send/recv, gather,
scatter, reduce, ...) and tensors of other devices to a private gloo group built from the same store.
Creating a subgroup involves only its members: the MPI communicator comes from ``Comm.Create_group``
(collective over the group alone) and the gloo groups from the group's own store. Without an MPI launch
(torchrun, DeepSpeed's launcher, accelerate) pccl's levels are torch groups over that store
(``pccl_torch.launcher``).

Device maps work as in torch: with ``"cpu:gloo,cuda:pccl"`` CUDA tensors run through pccl and CPU tensors
through gloo; with ``"cpu:pccl,cuda:nccl"`` the reverse. torch hands a Python process group every device
of the map, so the group reads its map back (``dist.get_backend_config``) and routes each call by its
tensors' device: pccl for the devices mapped to ``pccl``, the vendor library (gloo; NCCL for CUDA) for the
rest. The CUDA communicator (NCCL inside a node, MPI between nodes) is built at the group's first CUDA call,
which every member makes, as NCCL builds its communicators at the first collective.

The group has a name (``group_name``), so DeviceMesh and the functional collectives (DTensor, FSDP2's
``_c10d_functional`` ops) reach its all-gather, reduce-scatter and all-reduce like ``dist.*`` calls do.
"""

from __future__ import annotations

import datetime
import logging
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from pccl_torch import api, failure_notice
from pccl_torch.choice import attach
from pccl_torch.communicator import Communicator, checking_from_env, over_torch
from pccl_torch.launcher import group_over, topology_from_store, transport_for
from pccl_torch.topology import Topology, TopologyError, detect, ranks_on_this_machine
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


_LIVE_GROUPS: weakref.WeakSet[PcclProcessGroup] = weakref.WeakSet()


@dataclass(frozen=True)
class _GroupSetup:
    """What building a communicator for another device of the group needs (all collective over the group)."""

    store: dist.Store
    rank: int
    size: int
    timeout: datetime.timedelta
    mpi: object | None
    """The group's MPI communicator (mpi4py ``Comm``), duplicated by each communicator built from it; None
    without an MPI launch (the levels are torch groups over ``store``)."""
    topology: Topology


class PcclProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group whose AG/RS/AR run pccl's algorithms (see module docstring)."""

    def __init__(self, setup: _GroupSetup, comm: Communicator, vendor: dist.ProcessGroup) -> None:
        super().__init__(setup.rank, setup.size)
        self._setup = setup
        self._rank, self._size = setup.rank, setup.size
        self._comms: dict[str, Communicator] = {comm.device.type: comm}
        self._vendors: dict[str, dist.ProcessGroup] = {"cpu": vendor}
        self._served: frozenset[str] | None = None
        self._group_name = self._group_desc = ""
        #: Calls handed to the vendor group, by ProcessGroup method name: the proof that no all-gather,
        #: reduce-scatter or all-reduce bypassed pccl is that those names never appear here.
        self.delegated: Counter[str] = Counter()
        _LIVE_GROUPS.add(self)

    @property
    def comm(self) -> Communicator:
        """The CPU communicator (built with the group; CUDA's comes at the first CUDA call)."""
        return self._comms["cpu"]

    @property
    def vendor(self) -> dist.ProcessGroup:
        """The private gloo group that serves what pccl does not (CPU tensors)."""
        return self._vendors["cpu"]

    def communicators(self) -> list[Communicator]:
        """Every pccl communicator this group has built (CPU, and CUDA once used)."""
        return list(self._comms.values())

    # -- routing ----------------------------------------------------------------------------------------
    def served_devices(self) -> frozenset[str]:
        """Device types whose tensors run through pccl: those the group's backend map gives to ``pccl``
        (every device for a plain ``"pccl"``); read once, after torch registered the group."""
        if self._served is None:
            try:
                config = dist.get_backend_config(self)
            except (KeyError, ValueError, RuntimeError):  # a group torch did not register: serve everything
                return frozenset(("cpu", "cuda"))
            self._served = _pccl_devices(config)
        return self._served

    def _pccl_for(self, *tensors: torch.Tensor) -> Communicator | None:
        """The communicator for these tensors' device, or None when pccl does not serve that device."""
        kind = _device_type(tensors)
        if kind not in self.served_devices():
            return None
        if kind not in self._comms:  # CUDA: every member makes this first CUDA call, so building is collective
            self._comms[kind] = _build_communicator(self._setup, tensors[0].device, self._vendor(kind))
        return self._comms[kind]

    def _vendor(self, kind: str) -> dist.ProcessGroup:
        """The vendor group for a device type: gloo for CPU, NCCL for CUDA (gloo when NCCL is missing)."""
        if kind not in self._vendors:
            if kind == "cuda" and dist.is_nccl_available():
                s = self._setup
                self._vendors[kind] = group_over(dist.PrefixStore("pccl/vendor/cuda", s.store), s.rank, s.size,
                                                 "cuda", s.timeout)
            else:
                self._vendors[kind] = self._vendors["cpu"]
        return self._vendors[kind]

    def _to_vendor(self, method: str, *args, target: str | None = None, **kwargs):
        """Hand ``method`` (counted under that name) to the vendor group of its tensors' device, as ``target``."""
        self.delegated[method] += 1
        tensor = next(_tensors_in(args), None)
        vendor = self._vendor(tensor.device.type if tensor is not None else "cpu")
        return getattr(vendor, target or method)(*args, **kwargs)

    # -- identity ---------------------------------------------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    # torch sets and reads these through its Python-process-group trampoline; DeviceMesh and the functional
    # collectives find the group by this name.
    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802 - torch's name
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802 - torch's name
        self._group_desc = desc

    def __repr__(self) -> str:
        t = self.comm.topology
        return f"PcclProcessGroup(rank={t.rank}, size={t.world_size}, {t.num_nodes} nodes x {t.local_size})"

    # -- all-reduce -------------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        comm = self._pccl_for(*tensors)
        if comm is None:
            return self._to_vendor("allreduce", tensors, opts)
        works = [api.all_reduce(t, opts.reduceOp, async_op=True, comm=comm) for t in tensors]
        return _as_work(works[-1], tensors)  # issued in order: the last one completes last

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        return self.allreduce(tensors, opts)

    # -- all-gather -------------------------------------------------------------------------------------
    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's signature
        comm = self._pccl_for(output, input)
        if comm is None:
            return self._to_vendor("_allgather_base", output, input)
        return _as_work(api.all_gather_into_tensor(output, input, async_op=True, comm=comm), output)

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
        comm = self._pccl_for(inp, *outputs)
        if comm is None:
            return self._to_vendor("allgather", output_lists, inputs)
        flat = torch.empty(self._size * inp.numel(), dtype=inp.dtype, device=inp.device)
        work = api.all_gather_into_tensor(flat, inp.contiguous(), async_op=True, comm=comm)

        def copy_out() -> None:
            for out, chunk in zip(outputs, flat.view(self._size, -1)):
                out.copy_(chunk.view_as(out))

        return _as_work(work, output_lists, then=copy_out)

    # -- reduce-scatter ---------------------------------------------------------------------------------
    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002 - torch's signature
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        comm = self._pccl_for(output, input)
        if comm is None:
            return self._to_vendor("_reduce_scatter_base", output, input, opts)
        return _as_work(api.reduce_scatter_tensor(output, input, opts.reduceOp, async_op=True, comm=comm), output)

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
        comm = self._pccl_for(out, *parts)
        if comm is None:
            return self._to_vendor("reduce_scatter", outputs, input_lists, opts)
        flat = torch.cat([p.reshape(-1) for p in parts])
        return _as_work(api.reduce_scatter_tensor(out, flat, opts.reduceOp, async_op=True, comm=comm), outputs)


def _delegate(name: str, target: str):
    def call(self, *args, **kwargs):
        return self._to_vendor(name, *args, target=target, **kwargs)

    call.__name__ = name
    call.__doc__ = f"Delegated to the vendor group's (gloo; NCCL for CUDA) {target}: pccl does not implement {name}."
    return call


for _name, _target in DELEGATED.items():
    setattr(PcclProcessGroup, _name, _delegate(_name, _target))


def _tensors_in(args) -> Iterator[torch.Tensor]:
    """The tensors among a ProcessGroup call's arguments (bare, or in (nested) lists), in order."""
    for arg in args:
        if isinstance(arg, torch.Tensor):
            yield arg
        elif isinstance(arg, (list, tuple)):
            yield from _tensors_in(arg)


def _device_type(tensors: tuple[torch.Tensor, ...]) -> str:
    kinds = {t.device.type for t in tensors}
    if len(kinds) != 1:
        raise ValueError(f"pccl collectives take tensors of one device type; got {sorted(kinds)}")
    return kinds.pop()


def _pccl_devices(config: str) -> frozenset[str]:
    """Device types a torch backend config string (``"cpu:gloo,cuda:pccl"``, or ``"pccl"``) gives to pccl."""
    pairs = [entry.split(":", 1) for entry in config.split(",") if entry.strip()]
    if all(len(p) == 1 for p in pairs):  # a bare backend name serves every device
        return frozenset(("cpu", "cuda")) if any(p[0].strip().lower() == BACKEND_NAME for p in pairs) else frozenset()
    return frozenset(d.strip().lower() for d, b in (p for p in pairs if len(p) == 2) if b.strip().lower() == BACKEND_NAME)


def _topology_for(comm, size: int) -> Topology:
    """The group's topology; a subgroup that does not split into whole nodes runs flat (one rank a node). A
    group of every MPI rank fails as ``init()`` does (e.g. a ``PCCL_LOCAL_SIZE`` that does not divide it)."""
    try:
        return detect(comm)
    except TopologyError as exc:
        from mpi4py import MPI

        if size == MPI.COMM_WORLD.Get_size():
            raise
        log.info("pccl group of %d ranks runs flat: %s", size, exc)
        return Topology(comm.Get_rank(), size, 1, cpu_ranks=ranks_on_this_machine(comm))


def _build_communicator(setup: _GroupSetup, device: torch.device, vendor: dist.ProcessGroup, mpi=None) -> Communicator:
    """A communicator of the group for ``device``. Over MPI: the node's ranks over MPI and over gloo (CPU) or
    NCCL (CUDA), every node's same local rank over MPI; ``mpi`` (default: a duplicate of the group's MPI
    communicator) becomes the communicator's own. Without MPI (``setup.mpi`` None): every level a torch group
    over the group's store (``pccl_torch.launcher``). Collective over the group."""
    t = setup.topology
    if setup.mpi is None:
        comm = over_torch(dist.PrefixStore(f"pccl/{device.type}", setup.store), t, device, setup.timeout, vendor,
                          check=checking_from_env())
    else:
        intra_store = dist.PrefixStore(f"pccl/intra/{device.type}/{t.node}", setup.store)
        intra = group_over(intra_store, t.local_rank, t.local_size, device.type, setup.timeout)
        mpi = mpi if mpi is not None else setup.mpi.Dup()
        comm = Communicator(
            topology=t,
            device=device,
            world=MPITransport(mpi, owned=True),
            vendor=TorchGroupTransport(vendor),
            intra_mpi=MPITransport(mpi.Split(color=t.node, key=t.local_rank), owned=True),
            intra_torch=TorchGroupTransport(intra),
            inter=MPITransport(mpi.Split(color=t.local_rank, key=t.node), owned=True),
            timeout_s=setup.timeout.total_seconds(),
            check=checking_from_env(),
        )
    attach(comm)
    return comm


def create_process_group(opts, backend_options=None) -> PcclProcessGroup:
    """The creator registered with torch.distributed (``extended_api=True``). Called on members only.

    Under an MPI launch whose ranks are torch's the group's levels are MPI communicators; under torchrun,
    DeepSpeed's launcher or accelerate (every process an MPI singleton) they are torch groups over the group's
    store (``pccl_torch.launcher``)."""
    store, rank, size, timeout = opts.store, opts.group_rank, opts.group_size, opts.timeout
    members = list(opts.global_ranks_in_group) or list(range(size))
    world_size = dist.get_world_size() if dist.is_initialized() else max(members) + 1
    if transport_for(members[rank], world_size) == "mpi":
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        group_comm = world.Dup() if len(members) == world.Get_size() else \
            world.Create_group(world.Get_group().Incl(members))
        setup = _GroupSetup(store, rank, size, timeout, group_comm, _topology_for(group_comm, size))
    else:
        setup = _GroupSetup(store, rank, size, timeout, None, topology_from_store(store, rank, size))
    vendor = dist.ProcessGroupGloo(dist.PrefixStore("pccl/vendor", store), rank, size, timeout)
    # The CPU communicator is built now (it owns the group's MPI communicator); CUDA's at its first call.
    comm = _build_communicator(setup, torch.device("cpu"), vendor, mpi=setup.mpi)
    failure_notice.install()
    return PcclProcessGroup(setup, comm, vendor)


def register() -> None:
    """Register ``pccl`` with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=["cpu", "cuda"])


ROUTED = ("allreduce", "allreduce_coalesced", "_allgather_base", "allgather", "allgather_into_tensor_coalesced",
          "_reduce_scatter_base", "reduce_scatter", "reduce_scatter_tensor_coalesced")


def bypassed(group: dist.ProcessGroup | None = None) -> dict[str, int]:
    """All-gathers, reduce-scatters and all-reduces of a pccl group that went to the vendor group
    (tensors on a device pccl does not serve); empty when every one ran through pccl."""
    return {name: n for name, n in _pccl_group(group).delegated.items() if name in ROUTED}


def communicator_of(group: dist.ProcessGroup | None) -> Communicator:
    """The pccl Communicator behind a ``pccl`` process group (its counters, topology and selector)."""
    return _pccl_group(group).comm


def pccl_groups() -> list[PcclProcessGroup]:
    """Every live pccl process group of this process (the world group and each ``new_group``)."""
    return list(_LIVE_GROUPS)


def _pccl_group(group: dist.ProcessGroup | None) -> PcclProcessGroup:
    pg = group if group is not None else dist.group.WORLD
    if not isinstance(pg, PcclProcessGroup):
        raise TypeError(f"{pg!r} is not a pccl process group (create it with backend='pccl')")
    return pg
