"""The torch.distributed backend ``pccl``: ``import pccl_torch`` registers it.

    dist.init_process_group("pccl")            # under mpiexec, torchrun, deepspeed or accelerate
    dist.new_group(ranks, backend="pccl")      # a subgroup

A :class:`PcclProcessGroup` runs all-reduce, all-gather, reduce-scatter and all-to-all (tensor and list forms,
both the torch 2.13 names and the older ones, coalesced forms) through pccl's API on CPU tensors, with real
async work handles, and delegates every other call (broadcast, barrier, send/recv, gather,
scatter, reduce, ...) and tensors of other devices to a private gloo group built from the same store. It is a
drop-in: what pccl does not implement (dtypes such as uint8 or bool, the bitwise ops, sparse or non-contiguous
tensors, uneven lists) goes to that vendor group unchanged, decided before pccl's API is called, counted per kind
(:func:`bypassed`) and logged once per kind.

Creating a subgroup involves only its members: the MPI communicator comes from ``Comm.Create_group``
(collective over the group alone) and the gloo groups from the group's own store. Without an MPI launch
(torchrun, DeepSpeed's launcher, accelerate) pccl's levels are torch groups over that store
(``pccl_torch.launcher``).

``import pccl_torch`` also completes torch's ``env://`` rendezvous for MPI launches: under ``mpiexec`` without
``RANK``, ``init_process_group`` with no ``init_method`` takes rank and world size from MPI and the store's address
agreed over MPI, as torchrun's variables would give them.

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

import concurrent.futures
import datetime
import functools
import importlib
import logging
import os
import socket
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlparse

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.distributed.constants import default_pg_timeout

from pccl_torch import api, failure_notice
from pccl_torch.selection import attach
from pccl_torch.communicator import Communicator, _free_port, checking_from_env, over_torch
from pccl_torch.launcher import LaunchError, group_over, mpi_world, topology_from_store, transport_for
from pccl_torch.ops import _FLOAT_ONLY, SUPPORTED_DTYPES, ReduceOp, Reduction, premul_sum, torch_premul_factor
from pccl_torch.topology import Topology, TopologyError, detect, ranks_on_this_machine
from pccl_torch.transport.mpi import MPITransport
from pccl_torch.transport.torch_group import TorchGroupTransport
from pccl_torch.validation import overlaps
from pccl_torch.work import Queue, Work, device_future, tensors_in

log = logging.getLogger(__name__)

BACKEND_NAME = "pccl"

# Calls pccl leaves to the vendor library, unchanged: ProcessGroup method -> the gloo backend's method.
DELEGATED = {
    "broadcast": "broadcast", "barrier": "barrier",
    "send": "send", "recv": "recv", "recv_anysource": "recv_anysource", "gather": "gather",
    "scatter": "scatter", "reduce": "reduce", "allgather_coalesced": "allgather_coalesced",
}


_BYPASSES_LOGGED: set[str] = set()
"""Kinds of call already logged as handed to the vendor library (one debug line per kind and process)."""


class _Unserved(ValueError):
    """pccl does not implement this call; the message names the kind (``dtype uint8``, ``op BAND``, ...)."""


def _falls_back(method: Callable) -> Callable:
    """``method`` of :class:`PcclProcessGroup`, made a drop-in: a call it finds pccl does not implement (it raises
    :class:`_Unserved` before anything is sent) goes unchanged to the vendor group's method of the same name."""
    name = method.__name__

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except _Unserved as unserved:
            return self._to_vendor(name, *args, kind=str(unserved), **kwargs)

    return call


POINT_TO_POINT = frozenset(("send", "recv", "recv_anysource"))
"""Delegated calls outside the group's FIFO: ProcessGroupNCCL runs point-to-point on communicators of their own,
ordered after the caller's stream only (a pair's ``irecv`` then ``send`` must not wait for each other)."""


def _completed(tensor_or_none=None) -> dist.Work:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(tensor_or_none)
    return _create_work_from_future(fut)


# -- the values of c10d's futures ---------------------------------------------------------------------------
# A Work's future holds what ProcessGroupGloo's holds for the same call (``returnFutureWithOutput`` over the call's
# output lists): DDP comm hooks chain ``.then(lambda fut: fut.wait()[0] ...)`` on it. Where gloo's Work has no
# future (reduce-scatter), the value is ProcessGroupNCCL's: the list of output tensors.


def _c10d_value(output_lists: Sequence[Sequence[torch.Tensor]]) -> list:
    """c10d's future value for a call with these output lists: ``[]`` for none, the one list's tensors for one,
    the list of lists for several (ProcessGroupGloo's ``returnFutureWithOutput``)."""
    if len(output_lists) == 1:
        return list(output_lists[0])
    return [list(outputs) for outputs in output_lists]


def _gathered_value(output: torch.Tensor, size: int) -> list:
    """c10d's future value for an all-gather into the flat ``output`` (``_allgather_base``): its ``size`` blocks,
    one a rank, as views (gloo's ``output.chunk(size)``)."""
    return list(output.chunk(size))


def _gathered_coalesced_value(outputs: Sequence[torch.Tensor], size: int) -> list:
    """c10d's future value for a coalesced all-gather into the flat ``outputs``: one list a rank, of that rank's
    block of every output (gloo's output lists; a single list on one rank)."""
    return _c10d_value(list(zip(*(_gathered_value(output, size) for output in outputs))))


def _outputs_value(outputs: object) -> list:
    """c10d's future value for a delegated call whose first argument is ``outputs``: a tensor (``[tensor]``), a
    list of tensors (that list), a list of lists (:func:`_c10d_value`), or none of those (``barrier``: ``[]``)."""
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if not isinstance(outputs, (list, tuple)) or not outputs:
        return []
    if isinstance(outputs[0], torch.Tensor):
        return list(outputs)
    return _c10d_value(outputs)


def _resolved(value: object, then: Callable[[], object] | None, done: torch.futures.Future) -> object:
    """``value``, once ``done`` (pccl's future) completed: its error re-raised, else ``then`` (copies out) run."""
    done.value()
    if then is not None:
        then()
    return value


def _as_work(work: api.Work | None, result: object, then: Callable[[], object] | None = None) -> dist.Work:
    """A c10d Work completing when pccl's ``work`` has (after ``then`` ran, if given), its future holding
    ``result`` (c10d's value for the call). On CUDA its ``wait()`` orders the current stream and ``then`` (copies
    out) runs in stream order, on the issuing thread."""
    if work is None:
        if then is not None:
            then()
        return _completed(result)
    if work.on_device:
        return _create_work_from_future(device_future(work, result, then))
    return _create_work_from_future(work.get_future().then(functools.partial(_resolved, result, then)))


def _all_of(works: Sequence[dist.Work], result: object, queue: Queue | None = None) -> dist.Work:
    """One Work completing when every one of ``works`` has (they may come from pccl and the vendor group); on CUDA
    ``queue`` is the group's, whose FIFO they all joined: the last ends last."""
    if len(works) == 1:
        return works[0]
    if queue is not None:  # the order stream, now, is behind every one of them (and their copies out)
        end = torch.cuda.Event()
        end.record(queue.order_stream())
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(result)
        return _create_work_from_future(device_future(Work(done, "coalesced", "pccl", end=end, queue=queue), result))
    return _create_work_from_future(torch.futures.collect_all([w.get_future() for w in works]).then(lambda _: result))


def _in_group_order(queue: Queue, call: Callable[[], dist.Work], result: object, device: torch.device) -> dist.Work:
    """Run a delegated collective ``call`` in the group's FIFO (``pccl_torch.work``): on CUDA issued on the group's
    order stream (behind everything issued before it, the caller's stream waits when the Work is waited); on CPU
    queued on the worker behind pccl's calls, or where calls run inline, finished before the next one starts."""
    if device.type == "cuda":
        future, end, gated = queue.issue(lambda: call().wait(), host_driven=False, what="a call pccl delegates")
        if future.done() and future.exception() is not None:  # run here, and failed (never wait: it may be queued)
            raise future.exception()
        return _as_work(Work(future, "delegated", "vendor", end=end, gated=gated, output=result, queue=queue), result)
    if queue.inline:
        call().wait()
        return _completed(result)
    return _as_work(Work(queue.submit(lambda: (call().wait(), result)[1]), "delegated", "vendor"), result)


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
        self._destroyed = False
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
        self._require_live()
        return self._vendors["cpu"]

    def _require_live(self) -> None:
        if self._destroyed:
            raise RuntimeError("this pccl process group was destroyed (destroy_process_group); create a new one")

    def communicators(self) -> list[Communicator]:
        """Every pccl communicator this group has built (CPU, and CUDA once used)."""
        return list(self._comms.values())

    def shutdown(self) -> None:
        """Release the group's resources now; ``destroy_process_group`` calls this, as it does on torch's own
        groups. The communicators close (their MPI communicators and torch groups freed; collective, as the
        destroy is) and the private vendor groups shut their threads down while the interpreter is whole. Left to
        the interpreter's final teardown, the gloo threads they hold could abort the process ("terminate called
        without an active exception"), after the script had finished."""
        for comm in self._comms.values():
            comm.close()
        for vendor in {id(group): group for group in self._vendors.values()}.values():
            vendor.shutdown()
        self._vendors.clear()  # gloo's destructor joins its threads: let it run now, not at the interpreter's exit
        self._destroyed = True

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

    def comm_for(self, device: torch.device) -> Communicator:
        """The group's communicator for tensors on ``device``: CPU's, built with the group, or CUDA's, built at its
        first use (collective: every member makes that first CUDA call, as NCCL builds its communicators)."""
        self._require_live()
        comm = self._comms.get(device.type)
        if comm is None:
            if device.type != "cuda":
                raise ValueError(f"pccl runs on cpu and cuda tensors, not on {device.type} tensors")
            self.comm.executor.drain()  # building duplicates the CPU communicator's MPI one: not beside its worker
            comm = self._comms[device.type] = _build_communicator(self._setup, device, self._vendor(device.type))
        return comm

    def _pccl_for(self, *tensors: torch.Tensor) -> Communicator | None:
        """The communicator for these tensors' device, or None when pccl does not serve that device."""
        kind = _device_type(tensors)
        if kind not in self.served_devices():
            return None
        return self.comm_for(tensors[0].device)

    def _route(self, tensors: Sequence[torch.Tensor]) -> Communicator:
        """pccl's communicator for a call on ``tensors``; :class:`_Unserved` when pccl does not take them (a device
        the group's map gives to another library, a dtype, layout or memory layout pccl's API rejects)."""
        comm = self._pccl_for(*tensors)
        if comm is None:
            raise _Unserved(f"device {tensors[0].device.type}")
        unsupported = _unsupported(tensors)
        if unsupported is not None:
            raise _Unserved(unsupported)
        return comm

    def _cuda_queue(self, tensors: Sequence[torch.Tensor]) -> Queue | None:
        """The queue of the group's CUDA communicator when ``tensors`` are CUDA tensors and it exists (the FIFO
        their calls joined), else None."""
        comm = self._comms.get("cuda") if tensors and tensors[0].is_cuda else None
        return comm.executor if comm is not None else None

    def _vendor(self, kind: str) -> dist.ProcessGroup:
        """The vendor group for a device type: gloo for CPU, NCCL for CUDA (gloo when NCCL is missing)."""
        self._require_live()
        if kind not in self._vendors:
            if kind == "cuda" and dist.is_nccl_available():
                s = self._setup
                self._vendors[kind] = group_over(dist.PrefixStore("pccl/vendor/cuda", s.store), s.rank, s.size,
                                                 "cuda", s.timeout)
            else:
                self._vendors[kind] = self._vendors["cpu"]
        return self._vendors[kind]

    def _to_vendor(self, method: str, *args, target: str | None = None, kind: str | None = None, **kwargs):
        """Hand ``method`` to the vendor group of its tensors' device, as ``target``; counted under ``method``, or
        ``"method:kind"`` for a call pccl routes but does not implement (logged once per kind at debug level)."""
        key = method if kind is None else f"{method}:{kind}"
        self.delegated[key] += 1
        if kind is not None and key not in _BYPASSES_LOGGED:
            _BYPASSES_LOGGED.add(key)
            log.debug("pccl hands %s with %s to the vendor library (pccl does not implement it); such calls are "
                      "counted in pccl_torch.stats(group)['bypassed'][%r]", method, kind, key)
        tensor = next(tensors_in(args), None)
        device = tensor.device if tensor is not None else torch.device("cpu")
        call = functools.partial(getattr(self._vendor(device.type), target or method), *args, **kwargs)
        comm = self._comms.get(device.type)  # whose FIFO the call joins: pccl's calls on this device's tensors
        if comm is None or method in POINT_TO_POINT or device.type not in self.served_devices():
            return call()
        return _in_group_order(comm.executor, call, _delegated_value(method, args, self._size), device)

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
    def _all_reduce(self, tensors: Sequence[torch.Tensor], reduce_op: dist.ReduceOp) -> dist.Work:
        comm = self._route(tensors)
        op = pccl_reduce_op(reduce_op, tensors[0].dtype)
        works = [api.all_reduce(t, op, async_op=True, comm=comm) for t in tensors]
        return _as_work(works[-1], list(tensors))  # issued in order: the last one completes last

    @_falls_back
    def allreduce(self, tensors, opts=None):
        return self._all_reduce(tensors, opts.reduceOp if opts is not None else _TORCH_SUM)

    @_falls_back
    def allreduce_coalesced(self, tensors, opts=None):
        return self._all_reduce(tensors, opts.reduceOp if opts is not None else _TORCH_SUM)

    # -- all-gather -------------------------------------------------------------------------------------
    @_falls_back
    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's signature
        comm = self._route((output, input))
        if overlaps(output, input) and not _is_slice_of(input, output, self._rank):
            raise _Unserved("overlapping buffers")
        work = api.all_gather_into_tensor(output, input, async_op=True, comm=comm)
        return _as_work(work, _gathered_value(output, self._size))

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._allgather_base(o, i) for o, i in zip(outputs, inputs, strict=True)]
        return _all_of(works, _gathered_coalesced_value(outputs, self._size), self._cuda_queue(outputs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    @_falls_back
    def allgather(self, output_lists, inputs, opts=None):
        """List form: ``output_lists[0][r]`` receives rank r's ``inputs[0]``."""
        if len(inputs) != 1 or len(output_lists) != 1:
            raise _Unserved("several tensors per rank")
        outputs, inp = output_lists[0], inputs[0]
        comm = self._route((inp, *outputs))
        if len(outputs) != self._size or any(out.numel() != inp.numel() for out in outputs):
            raise _Unserved("uneven sizes")
        flat = torch.empty(self._size * inp.numel(), dtype=inp.dtype, device=inp.device)
        work = api.all_gather_into_tensor(flat, inp, async_op=True, comm=comm)

        def copy_out() -> None:
            for out, chunk in zip(outputs, flat.view(self._size, -1)):
                out.copy_(chunk.view_as(out))

        return _as_work(work, _c10d_value(output_lists), then=copy_out)

    # -- reduce-scatter ---------------------------------------------------------------------------------
    @_falls_back
    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002 - torch's signature
        comm = self._route((output, input))
        op = pccl_reduce_op(opts.reduceOp if opts is not None else _TORCH_SUM, input.dtype)
        return _as_work(api.reduce_scatter_tensor(output, input, op, async_op=True, comm=comm), [output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _all_of(works, list(outputs), self._cuda_queue(outputs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    @_falls_back
    def reduce_scatter(self, outputs, input_lists, opts=None):
        """List form: ``outputs[0]`` receives the reduction of every rank's ``input_lists[0][rank]``."""
        if len(outputs) != 1 or len(input_lists) != 1:
            raise _Unserved("several tensors per rank")
        out, parts = outputs[0], input_lists[0]
        comm = self._route((out, *parts))
        if len(parts) != self._size or any(part.numel() != out.numel() for part in parts):
            raise _Unserved("uneven sizes")
        op = pccl_reduce_op(opts.reduceOp if opts is not None else _TORCH_SUM, out.dtype)
        flat = torch.cat([p.reshape(-1) for p in parts])
        return _as_work(api.reduce_scatter_tensor(out, flat, op, async_op=True, comm=comm), list(outputs))

    # -- host control -----------------------------------------------------------------------------------
    def monitored_barrier(self, timeout: datetime.timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier on the group's private gloo group (same ranks), once every call issued on the
        group before it has finished: rank 0 raises naming the ranks that did not arrive within ``timeout``
        (all of them with ``wait_all_ranks``), the others raise naming rank 0. torch's
        ``dist.monitored_barrier`` refuses a group not named gloo: call :func:`monitored_barrier`."""
        self.delegated["monitored_barrier"] += 1
        timeout = timeout if timeout is not None else default_pg_timeout
        self.comm.executor.run_now(lambda: self.vendor.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks))

    # -- all-to-all -------------------------------------------------------------------------------------
    @_falls_back
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        """torch's ``all_to_all_single``: split sizes in rows of dim 0 (empty lists: equal splits)."""
        comm = self._route((output, input))
        if overlaps(output, input):
            raise _Unserved("overlapping buffers")
        work = api.all_to_all_single(output, input, list(output_split_sizes) or None,
                                     list(input_split_sizes) or None, async_op=True, comm=comm)
        return _as_work(work, [output])

    all_to_all_single = alltoall_base

    @_falls_back
    def alltoall(self, output_tensors, input_tensors, opts=None):
        """List form: ``input_tensors[j]`` goes to rank j, ``output_tensors[i]`` comes from rank i (any sizes)."""
        comm = self._route((*output_tensors, *input_tensors))
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise _Unserved("lists that are not one tensor per rank")
        inp = torch.cat([t.reshape(-1) for t in input_tensors])
        flat = torch.empty(sum(t.numel() for t in output_tensors), dtype=inp.dtype, device=inp.device)
        work = api.all_to_all_single(flat, inp, [t.numel() for t in output_tensors],
                                     [t.numel() for t in input_tensors], async_op=True, comm=comm)

        def copy_out() -> None:
            for out, chunk in zip(output_tensors, flat.split([t.numel() for t in output_tensors])):
                out.copy_(chunk.view_as(out))

        return _as_work(work, list(output_tensors), then=copy_out)


def _delegate(name: str, target: str):
    def call(self, *args, **kwargs):
        return self._to_vendor(name, *args, target=target, **kwargs)

    call.__name__ = name
    call.__doc__ = f"Delegated to the vendor group's (gloo; NCCL for CUDA) {target}: pccl does not implement {name}."
    return call


for _name, _target in DELEGATED.items():
    setattr(PcclProcessGroup, _name, _delegate(_name, _target))


def _delegated_value(method: str, args: tuple, size: int) -> list:
    """c10d's future value for ``method(*args)`` handed to the vendor group (delegated, or a routed call pccl does
    not implement): what the routed method would give, from its output argument."""
    if not args:
        return []
    if method == "_allgather_base":
        return _gathered_value(args[0], size)
    return _outputs_value(args[0])


_PCCL_DTYPES = frozenset(SUPPORTED_DTYPES)
_TORCH_SUM = dist.ReduceOp.SUM
_PCCL_OPS = {getattr(dist.ReduceOp, op.name).value: op for op in ReduceOp}
"""torch's reduce ops pccl implements, by their RedOpType's value (a RedOpType hashes slowly: ~1.6 us)."""


def _unsupported(tensors: Sequence[torch.Tensor]) -> str | None:
    """What among ``tensors`` pccl's API would reject (``dtype uint8``, ``mixed dtypes``, ``layout ...``,
    ``non-contiguous``), or None: the few attribute reads of the hot path, before anything is sent."""
    dtype = tensors[0].dtype
    if dtype not in _PCCL_DTYPES:
        return f"dtype {str(dtype).removeprefix('torch.')}"
    for tensor in tensors:
        if tensor.dtype is not dtype:
            return "mixed dtypes"
        if tensor.layout is not torch.strided:
            return f"layout {str(tensor.layout).removeprefix('torch.')}"
        if not tensor.is_contiguous():
            return "non-contiguous"
    return None


def pccl_reduce_op(reduce_op: Any, dtype: torch.dtype) -> ReduceOp | Reduction:
    """pccl's form of torch's ``reduce_op`` (a ``dist.ReduceOp`` or its ``RedOpType``) on ``dtype``: the
    backend and the FSDP hooks pass it to pccl's API. ``ValueError`` (:class:`_Unserved`, naming the op) where
    pccl does not define it: BAND/BOR/BXOR, AVG and PREMUL_SUM on integers."""
    if reduce_op == _TORCH_SUM:  # the common case: one comparison
        return ReduceOp.SUM
    kind = getattr(reduce_op, "op", reduce_op)
    ours = _PCCL_OPS.get(kind.value)
    if ours is None:
        raise _Unserved(f"op {kind.name}")
    if ours in _FLOAT_ONLY and not dtype.is_floating_point:
        raise _Unserved(f"op {kind.name} on {str(dtype).removeprefix('torch.')}")
    if ours is ReduceOp.PREMUL_SUM:
        return premul_sum(_premul_factor(reduce_op))
    return ours


def _premul_factor(reduce_op: dist.ReduceOp) -> float | torch.Tensor:
    """The factor of torch's PREMUL_SUM op (``ops.torch_premul_factor``); ``ValueError`` for an op without one."""
    factor = torch_premul_factor(reduce_op)
    if factor is None:
        raise ValueError("a PREMUL_SUM ReduceOp without a factor: build it with dist._make_nccl_premul_sum(factor)")
    return factor


def _is_slice_of(inp: torch.Tensor, output: torch.Tensor, rank: int) -> bool:
    """Whether ``inp`` is block ``rank`` of ``output`` (the in-place all-gather pccl's API accepts)."""
    return inp.data_ptr() == output.data_ptr() + rank * inp.numel() * inp.element_size()


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
            intra_torch=TorchGroupTransport(intra, owned=True),
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
    """Register ``pccl`` with torch.distributed, and MPI launches with torch's ``env://`` rendezvous (idempotent)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=["cpu", "cuda"])
    _complete_env_rendezvous_from_mpi()


MPI_RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")
"""Set in every rank of an MPI launch (MPICH/Hydra and Slurm's PMI, PMIx, Open MPI): read before MPI is touched."""


def _complete_env_rendezvous_from_mpi() -> None:
    """Make torch's ``env://`` rendezvous (``init_process_group`` without ``init_method``) work under ``mpiexec``
    as under torchrun: without ``RANK``, an MPI launch's ranks take rank and world size from MPI and agree on
    the address (:func:`_mpi_endpoint`). With ``RANK`` set (torchrun, DeepSpeed, accelerate) nothing changes."""
    # ``torch.distributed.rendezvous`` is also the name of a function there: take the module itself.
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    if getattr(handlers.get("env"), "__pccl_wraps__", None) is None:
        handlers["env"] = _mpi_completed_env_handler(handlers["env"], handlers["tcp"])


def _mpi_completed_env_handler(torch_env: Callable, torch_tcp: Callable) -> Callable:
    """torch's ``env://`` handler, or under an MPI launch with no ``RANK`` its ``tcp://`` handler at the address
    the ranks agreed on over MPI, with MPI's rank and world size."""

    def handler(url: str, **kwargs):
        query = dict(parse_qsl(urlparse(url).query))
        if "rank" in query or os.environ.get("RANK", "").strip() or not _mpi_launched():
            return torch_env(url, **kwargs)
        rank, size = mpi_world()
        if query.setdefault("world_size", str(size)) != str(size):
            raise LaunchError(f"init_process_group(world_size={query['world_size']}) under an MPI launch of {size} ranks")
        addr, port = _mpi_endpoint()
        return torch_tcp(f"tcp://{addr}:{port}?{urlencode({**query, 'rank': rank})}", **kwargs)

    handler.__pccl_wraps__ = torch_env  # type: ignore[attr-defined]
    return handler


def _mpi_launched() -> bool:
    """Whether an MPI launcher started this process with others (its rank variable is set)."""
    return any(os.environ.get(name, "").strip() for name in MPI_RANK_VARIABLES)


def _mpi_endpoint() -> tuple[str, int]:
    """The torch.distributed store's address, agreed over ``MPI.COMM_WORLD`` (collective): rank 0's
    ``MASTER_ADDR``/``MASTER_PORT`` where set, else 127.0.0.1 when every rank runs on rank 0's host (its
    host name otherwise) and a port free on rank 0."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    hosts = world.allgather(socket.gethostname())
    endpoint = None
    if world.Get_rank() == 0:
        addr = os.environ.get("MASTER_ADDR") or ("127.0.0.1" if len(set(hosts)) == 1 else hosts[0])
        endpoint = (addr, int(os.environ.get("MASTER_PORT") or _free_port()))
    return world.bcast(endpoint, root=0)


ROUTED = ("allreduce", "allreduce_coalesced", "_allgather_base", "allgather", "allgather_into_tensor_coalesced",
          "_reduce_scatter_base", "reduce_scatter", "reduce_scatter_tensor_coalesced", "alltoall_base", "alltoall")


_TORCH_MONITORED_BARRIER = dist.monitored_barrier


def monitored_barrier(group: dist.ProcessGroup | None = None, timeout: datetime.timedelta | float | None = None,
                      wait_all_ranks: bool = False) -> None:
    """``torch.distributed.monitored_barrier`` for pccl groups too, with its contract: block until every rank of
    ``group`` (default: the world group) arrived, or raise on rank 0 naming the first rank that did not arrive
    within ``timeout`` (every such rank with ``wait_all_ranks``) and on the others naming rank 0. ``timeout``:
    a timedelta or seconds; torch's default process-group timeout when None.

    torch's own refuses every group whose backend is not named ``gloo`` ("only implemented for GLOO backend": it
    reads the name the group was created with) and offers no registration to lift that; on a pccl group this runs
    gloo's monitored barrier on the group's private gloo group (:meth:`PcclProcessGroup.monitored_barrier`), on
    any other group torch's. ``pccl_torch.run`` makes ``dist.monitored_barrier`` this function."""
    pg = group if group is not None else dist.distributed_c10d.GroupMember.WORLD
    if not isinstance(pg, PcclProcessGroup):
        return _TORCH_MONITORED_BARRIER(group, timeout, wait_all_ranks)
    if isinstance(timeout, (int, float)):
        timeout = datetime.timedelta(seconds=timeout)
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def bypassed(group: dist.ProcessGroup | None = None) -> dict[str, int]:
    """All-gathers, reduce-scatters, all-reduces and all-to-alls of a pccl group that went to the vendor group, by
    ``"method:kind"``: ``device cpu`` (a device the group's map gives to another library), ``dtype uint8``,
    ``op BAND``, ``op AVG on int32``, ``non-contiguous``, ``uneven sizes``, ...; empty when every one ran
    through pccl."""
    return {key: n for key, n in _pccl_group(group).delegated.items() if key.partition(":")[0] in ROUTED}


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
