"""Which launch started the ranks, and pccl's levels where it was not ``mpiexec``.

Under ``mpiexec`` pccl's point-to-point levels are MPI communicators (the ``mpi`` transport). Under ``torchrun``,
DeepSpeed's local launcher or ``accelerate launch`` every process is an MPI singleton (a world of one), so
the same levels are built as torch.distributed groups instead (the ``torch`` transport: gloo for CPU tensors,
NCCL for CUDA), from the rendezvous store torch.distributed already has: the world, this node's ranks, and
this local rank's peers on every node. The algorithms, the selection and the wire formats run unchanged on
either, since they see only the transport interface; the names that say ``mpi`` (``hier:mpi``, ``hier-mpi:ring``,
the flat ``mpi``) then mean that level's own library.

Nodes come from the launcher's variables: the node index (``GROUP_RANK`` from torchrun, ``CROSS_RANK`` from
DeepSpeed's launcher, ``NODE_RANK``), else the host name; ``PCCL_LOCAL_SIZE`` emulates nodes as under mpiexec.
``PCCL_TRANSPORT=auto|mpi|torch`` chooses (auto: ``mpi`` when MPI's ranks are torch's ranks, ``torch`` when
every process is an MPI singleton).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket

import torch
import torch.distributed as dist

from pccl_torch.topology import Topology, from_placements, kernel_id

log = logging.getLogger(__name__)

TRANSPORT_ENV = "PCCL_TRANSPORT"
TRANSPORTS = ("auto", "mpi", "torch")
NODE_VARIABLES = ("GROUP_RANK", "CROSS_RANK", "NODE_RANK")
"""A node's index, as torchrun, DeepSpeed's launcher and others (accelerate, Lightning) name it."""
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", *NODE_VARIABLES,
                    "MASTER_ADDR", "MASTER_PORT", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
"""What launchers set: torch's env:// variables, torchrun's and DeepSpeed's node variables, MPI's (PMI, Open MPI)."""
ENV_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
"""What torch's ``env://`` rendezvous needs."""


class LaunchError(RuntimeError):
    """pccl cannot serve this launch (MPI ranks that are not torch's, a rendezvous with variables missing)."""


def launch_variables() -> str:
    """The launcher variables this process has, for error messages (``RANK=1 WORLD_SIZE=4 ...`` or ``none``)."""
    found = [f"{name}={os.environ[name]}" for name in LAUNCH_VARIABLES if name in os.environ]
    return " ".join(found) or "none"


def mpi_world() -> tuple[int, int]:
    """(rank, size) of ``MPI.COMM_WORLD``: a world of one for a process no MPI launcher started."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def transport_for(global_rank: int, world_size: int) -> str:
    """``mpi`` or ``torch``: the transport of a group whose member of torch rank ``global_rank`` this process is,
    in a torch world of ``world_size`` (``PCCL_TRANSPORT``; see the module docstring). ``LaunchError`` naming
    the launcher variables when pccl cannot serve the launch."""
    mode = os.environ.get(TRANSPORT_ENV, "").strip().lower() or "auto"
    if mode not in TRANSPORTS:
        raise ValueError(f"{TRANSPORT_ENV}={mode!r} is not a valid transport; expected one of {', '.join(TRANSPORTS)}")
    if mode == "torch":
        return "torch"
    mpi_rank, mpi_size = mpi_world()
    if mpi_size == world_size and mpi_rank == global_rank:
        return "mpi"
    if mode == "auto" and mpi_size == 1:
        return "torch"
    why = ("PCCL_TRANSPORT=mpi needs an MPI launch" if mpi_size == 1 else
           f"MPI started {mpi_size} ranks (this one {mpi_rank}) that are not torch's {world_size} (this one {global_rank})")
    raise LaunchError(
        f"pccl cannot serve this launch: {why}. Launcher variables found: {launch_variables()}. Launch with "
        "mpiexec (`mpiexec -n 4 python train.py`), or with torchrun / deepspeed / accelerate and no mpiexec around "
        f"them, or set {TRANSPORT_ENV}=torch"
    )


def require_env_rendezvous() -> None:
    """``LaunchError`` naming what is missing when torch's ``env://`` rendezvous cannot start."""
    missing = [name for name in ENV_RENDEZVOUS if not os.environ.get(name)]
    if missing:
        raise LaunchError(
            f"pccl found neither an MPI launch nor a complete torch.distributed one: {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set (launcher variables found: {launch_variables()}). Launch "
            "with mpiexec, torchrun, deepspeed or accelerate, or call torch.distributed.init_process_group first"
        )


_ENV_WORLDS = 0
"""Default groups :func:`init_world_from_env` initialised in this process so far (the same count on every rank)."""


def init_world_from_env(backend: str, timeout: datetime.timedelta) -> None:
    """``torch.distributed.init_process_group(backend)`` from the launcher's variables (``env://``), with its
    rendezvous keys under a prefix of their own (``pccl/world/<n>``, n counting these calls).

    Why the prefix: under torchrun the rendezvous store is the agent's, which outlives the process's default
    group, and torch names a default group created again after ``destroy_process_group`` as it named the first
    (``default_pg/0``). Without the prefix, ``init()`` after ``shutdown()`` (or after a default group of the
    script's own) had gloo read the destroyed group's addresses: a hang or "Connection refused" (under
    ``torchrun --nnodes 2``, in each of 3 tries; a one-node torchrun got through by luck of timing)."""
    global _ENV_WORLDS
    require_env_rendezvous()
    _ENV_WORLDS += 1
    store, rank, size = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    dist.init_process_group(backend, store=dist.PrefixStore(f"pccl/world/{_ENV_WORLDS}", store), rank=rank,
                            world_size=size, timeout=timeout)


def _node_key() -> str:
    """What names this process's node: the launcher's node index, else the host name."""
    for name in NODE_VARIABLES:
        if os.environ.get(name, "").strip():
            return f"{name}={os.environ[name].strip()}"
    return f"host={socket.gethostname()}"


def _launcher_local_size() -> int | None:
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        raw = os.environ.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


def topology_from_store(store: dist.Store, rank: int, size: int, local_size: int | None = None) -> Topology:
    """The topology of a group of ``size`` ranks that share ``store``: every rank publishes its node (see
    :func:`_node_key`) and kernel; nodes must be blocks of equal size, as with :func:`~pccl_torch.topology.detect`
    (``local_size``, else ``PCCL_LOCAL_SIZE``, overrides). Collective over the group."""
    mine = {"node": _node_key(), "kernel": kernel_id(), "local": _launcher_local_size()}
    store.set(f"pccl/place/{rank}", json.dumps(mine))
    everyone = [json.loads(store.get(f"pccl/place/{r}")) for r in range(size)]
    nodes = [entry["node"] for entry in everyone]
    placements = [(nodes.index(key), nodes.count(key)) for key in nodes]
    if mine["local"] not in (None, placements[rank][1]) and rank == 0:
        log.info("pccl: the launcher's local size %s differs from the %d ranks of this group on node %s",
                 mine["local"], placements[rank][1], mine["node"])
    cpu_ranks = sum(1 for entry in everyone if entry["kernel"] == mine["kernel"])
    return from_placements(rank, placements, cpu_ranks, local_size)


def group_over(store: dist.Store, rank: int, size: int, device_type: str,
               timeout: datetime.timedelta) -> dist.ProcessGroup:
    """A private process group of the device's library (gloo for CPU tensors, NCCL for CUDA) over ``store``."""
    if device_type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def control_group(store: dist.Store, topology: Topology, timeout: datetime.timedelta) -> dist.ProcessGroup:
    """A gloo group of every rank over ``store``: the host-capable level of a communicator whose levels are a
    device library's (NCCL refuses host tensors), for its set-up and control exchanges. Collective over the group."""
    return group_over(dist.PrefixStore("pccl/levels/control", store), topology.rank, topology.world_size, "cpu",
                      timeout)


def torch_levels(store: dist.Store, topology: Topology, device: torch.device,
                 timeout: datetime.timedelta) -> tuple[dist.ProcessGroup, dist.ProcessGroup, dist.ProcessGroup]:
    """(world, intra, inter): the ``torch`` transport's groups of ``device``'s library over ``store``: every rank,
    this node's ranks, and this local rank's peers on every node. Collective over the group."""
    t, kind = topology, device.type
    prefix = f"pccl/levels/{kind}"
    world = group_over(dist.PrefixStore(f"{prefix}/world", store), t.rank, t.world_size, kind, timeout)
    intra = group_over(dist.PrefixStore(f"{prefix}/intra/{t.node}", store), t.local_rank, t.local_size, kind, timeout)
    inter = group_over(dist.PrefixStore(f"{prefix}/inter/{t.local_rank}", store), t.node, t.num_nodes, kind, timeout)
    return world, intra, inter

