"""FSDP2 with pccl: FSDP's custom all-gather and reduce-scatter hooks, set on every FSDPModule.

    from pccl_torch.integrations.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block, comm="pccl")
    fully_shard(model, comm="pccl")

or, after torch's own ``fully_shard`` calls, ``use_pccl(model)``. ``compression=`` picks a wire format per
collective for what crosses nodes (``{"all_gather": "int8", "reduce_scatter": "bf16"}``, or one format for
both; default: exact, or ``PCCL_COMPRESSION``). FSDP keeps its process group (gloo or
NCCL) for everything else (DTensor, ``clip_grad_norm_``, state-dict gathering); only its parameter
all-gathers and gradient reduce-scatters go through pccl, on the pccl communicator of that group for the
tensors' device: the default one of ``pccl_torch.init()`` for the world group, or the group's own for a ``pccl``
group. ``fully_shard`` and ``use_pccl`` fail at the call where pccl cannot serve FSDP's groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import fully_shard as _torch_fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from pccl_torch import api
from pccl_torch.communicator import Communicator, NotInitializedError, default_communicator
from pccl_torch.integrations.torch_backend import PcclProcessGroup, _as_work, pccl_reduce_op

COMMS = ("pccl", "default")
Compression = str | dict[str, str] | None
"""A format for both collectives, one per collective (``all_gather``, ``reduce_scatter``), or None."""


def per_collective(compression: Compression) -> dict[str, str | None]:
    """``compression`` as {"all_gather": format or None, "reduce_scatter": ...}; unknown keys raise."""
    if compression is None or isinstance(compression, str):
        return {"all_gather": compression, "reduce_scatter": compression}
    unknown = set(compression) - {"all_gather", "reduce_scatter"}
    if unknown:
        raise ValueError(f"FSDP compression keys must be 'all_gather' and/or 'reduce_scatter', got {sorted(unknown)}")
    return {"all_gather": compression.get("all_gather"), "reduce_scatter": compression.get("reduce_scatter")}


def communicator_for(group: dist.ProcessGroup, device: torch.device) -> Communicator:
    """The pccl communicator that spans exactly ``group``'s ranks for tensors on ``device``, or a clear error: a
    pccl group's own for that device (CUDA's built at its first use), else ``pccl_torch.init()``'s."""
    if isinstance(group, PcclProcessGroup):
        return group.comm_for(device)
    comm = _init_communicator(group)
    if comm.device.type != device.type:
        raise ValueError(f"FSDP's tensors are on {device.type} but pccl_torch.init() built its communicator for "
                         f"{comm.device.type}: call pccl_torch.init(device={device.type!r})")
    return comm


def _init_communicator(group: dist.ProcessGroup) -> Communicator:
    """``pccl_torch.init()``'s communicator, which serves FSDP's ``group`` (not a pccl group) when it is the world."""
    try:
        comm = default_communicator()
    except NotInitializedError as exc:
        raise NotInitializedError(
            "pccl's FSDP hooks (comm='pccl', use_pccl) need pccl_torch.init() first, or FSDP's mesh over a pccl "
            "group (DeviceMesh.from_group(dist.new_group(backend='pccl'), ...))") from exc
    if group.size() != comm.topology.world_size:
        raise ValueError(
            f"pccl's FSDP hooks need FSDP's group to be the world group or a pccl group; got a group of "
            f"{group.size()} of {comm.topology.world_size} ranks: create it with dist.new_group(..., backend='pccl')"
        )
    return comm


def _check_served(module: FSDPModule) -> None:
    """Fail now, not at the first forward pass, when pccl cannot serve the groups of ``module``'s parameters
    (a pccl group serves its devices; its CUDA communicator is left to be built at its first collective)."""
    for param_group in module._get_fsdp_state()._fsdp_param_groups:  # as FSDPModule.set_custom_all_gather does
        group = param_group.mesh_info.shard_process_group
        if not isinstance(group, PcclProcessGroup):
            communicator_for(group, param_group.device)


class _Allocating:
    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class PcclAllGather(_Allocating, AllGather):
    """FSDP2's parameter all-gather through pccl (``compression``: its wire format, None: exact)."""

    def __init__(self, compression: str | None = None) -> None:
        self.compression = compression

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        work = api.all_gather_into_tensor(output_tensor, input_tensor, async_op=async_op,
                                          comm=communicator_for(group, output_tensor.device),
                                          compression=self.compression)
        return _as_work(work, output_tensor) if async_op else None


class PcclReduceScatter(_Allocating, ReduceScatter):
    """FSDP2's gradient reduce-scatter through pccl (SUM or AVG, as FSDP asks; ``compression`` as above)."""

    def __init__(self, compression: str | None = None) -> None:
        self.compression = compression

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> dist.Work | None:
        work = api.reduce_scatter_tensor(output_tensor, input_tensor, pccl_reduce_op(op, input_tensor.dtype),
                                         async_op=async_op, comm=communicator_for(group, output_tensor.device),
                                         compression=self.compression)
        return _as_work(work, output_tensor) if async_op else None


def use_pccl(module: torch.nn.Module, compression: Compression = None) -> int:
    """Route the all-gathers and reduce-scatters of every FSDPModule in ``module`` through pccl.

    FSDP's setting is per FSDPModule, not recursive, so every one is set. Returns how many were set.
    ``TypeError`` when ``module`` is not sharded (no FSDPModule in it); ``NotInitializedError`` or ``ValueError``
    when pccl cannot serve FSDP's groups (no ``pccl_torch.init()`` and no pccl group), before any step runs.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"use_pccl takes a torch.nn.Module sharded with fully_shard, got {type(module).__name__}")
    sharded = [sub for sub in module.modules() if isinstance(sub, FSDPModule)]
    if not sharded:
        raise TypeError(f"use_pccl found no FSDPModule: {type(module).__name__} is not an FSDPModule and contains "
                        "none (call torch.distributed.fsdp.fully_shard first)")
    formats = per_collective(compression)
    for sub in sharded:
        _check_served(sub)
        sub.set_custom_all_gather(PcclAllGather(formats["all_gather"]))
        sub.set_custom_reduce_scatter(PcclReduceScatter(formats["reduce_scatter"]))
    return len(sharded)


def fully_shard(module: torch.nn.Module, *args: Any, comm: str = "pccl", compression: Compression = None,
                **kwargs: Any):
    """``torch.distributed.fsdp.fully_shard`` plus ``comm="pccl"`` (default) or ``comm="default"``, and
    with pccl a wire format per collective (``compression``)."""
    if comm not in COMMS:
        raise ValueError(f"comm must be one of {COMMS}, got {comm!r}")
    if compression is not None and comm != "pccl":
        raise ValueError("compression needs comm='pccl'")
    formats = per_collective(compression)
    sharded = _torch_fully_shard(module, *args, **kwargs)
    if comm == "pccl":
        use_pccl(sharded, formats)
    return sharded
