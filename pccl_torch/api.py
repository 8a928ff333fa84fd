"""The public collectives: the single dispatch point.

The first call of a shape validates its arguments (before any communication), chooses the algorithm
(``pccl_torch.choice``: the explicit ``algorithm=``, else ``PCCL_ALGO``, else the selector, else the heuristic) and
binds it (``pccl_torch.calls``); later calls of the shape re-check only device, contiguity and aliasing. Each runs
in issue order on the communicator and returns ``None`` (blocking) or a :class:`~pccl_torch.work.Work`
(``async_op=True``), as torch.distributed.
Every call gets a sequence number; with checking on, the ranks agree on its signature before it runs; a
collective that fails (timeout, dead peer) raises ``PcclTimeoutError`` and breaks the communicator.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import torch

from pccl_torch import calls
from pccl_torch.algorithms import Collective
from pccl_torch.choice import attach, choice_of
from pccl_torch.communicator import (DEFAULT_TIMEOUT, Communicator, create, default_communicator,
                                     require_uninitialized, set_default)
from pccl_torch.ops import ReduceOp, as_reduction
from pccl_torch.plan import Plan
from pccl_torch.validation import check_reduction, check_same_dtype, check_sizes, check_tensor
from pccl_torch.work import Work

def init(comm=None, *, local_size: int | None = None, device: str | torch.device | None = None,
         timeout: datetime.timedelta = DEFAULT_TIMEOUT, check: bool | None = None,
         tune: str | None = None) -> Communicator:
    """Create the default communicator (``communicator.create``: collective over ``comm``, default
    ``MPI.COMM_WORLD``) with its algorithm choice, and return it. ``tune``: ``"online"`` or ``"off"``
    (default ``PCCL_TUNE``, else off; ``pccl_torch.tuning``)."""
    require_uninitialized()
    created = create(comm, local_size=local_size, device=device, timeout=timeout, check=check)
    attach(created, tune)
    return set_default(created)


def _plan(comm: Communicator, collective: Collective, algorithm: str | None, nbytes: int,
          dtype: torch.dtype, compression: str | None = None, *, issued: bool = True) -> Plan:
    """The one place algorithms (and wire formats) are chosen (see ``pccl_torch.choice``)."""
    choice = comm.choice
    if choice is None:
        choice = choice_of(comm)
    return choice.plan(comm, collective, algorithm, nbytes, dtype, compression,  # type: ignore[attr-defined]
                       issued=issued)


def choose_algorithm(collective: Collective, nbytes: int, comm: Communicator | None = None,
                     dtype: torch.dtype = torch.float32, compression: str | None = None) -> str:
    """The plan ``algorithm=None`` would run for a call of ``collective`` on ``nbytes`` (full buffer), named
    ``<algorithm>+<format>`` when the call is compressed (``compression``, or ``PCCL_COMPRESSION``)."""
    comm = comm or default_communicator()
    return _plan(comm, collective, None, nbytes, dtype, compression, issued=False).name


def _bind(comm: Communicator, key: tuple, collective: Collective, algorithm: str | None, nbytes: int,
          dtype: torch.dtype, numel: int, op: ReduceOp | None, compression: str | None, async_op: bool,
          body: Callable[[Plan], calls.Body]) -> calls.BoundCall:
    """Choose the plan of a validated call and bind it (``pccl_torch.calls``); kept for the later calls of
    ``key`` unless online tuning is still trying candidates for it."""
    choice = comm.choice if comm.choice is not None else choice_of(comm)
    plan, final = choice.bind_plan(comm, collective, algorithm, nbytes, dtype, compression)  # type: ignore[attr-defined]
    bound = calls.BoundCall(comm, plan, body(plan), nbytes, async_op, calls.signature(plan, dtype, numel, op))
    return calls.remember(comm, key, bound) if final else bound


def _on(comm: Communicator, tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a contiguous tensor on ``comm``'s device (what a cached call shape re-checks)."""
    index = comm.cuda_index
    return tensor.is_contiguous() and (tensor.is_cpu if index < 0 else tensor.get_device() == index)


def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor, *, algorithm: str | None = None,
                           async_op: bool = False, comm: Communicator | None = None,
                           compression: str | None = None) -> Work | None:
    """``output`` (world x input.numel() elements) receives every rank's ``input`` in rank order.

    ``input`` may be this rank's slice of ``output`` (in-place); it is never modified. ``compression``
    (``"bf16"``, ``"int8"``, ``"fp8"``, ``"lossless"``; default exact, or ``PCCL_COMPRESSION``) encodes what
    crosses nodes; every rank then holds the same decoded values, its own block included.
    """
    comm = comm or default_communicator()
    try:
        key = ("all_gather", output.dtype, output.numel(), input.dtype, input.numel(), algorithm, compression, async_op)
        bound = comm.calls.get(key)
        ready = bound is not None and _on(comm, output) and _on(comm, input)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, an unhashable argument: validate in full
        bound, ready = None, False
    if not ready:
        check_tensor(output, "output", comm.device)
        check_tensor(input, "input", comm.device)
        check_same_dtype(output, input)
        check_sizes(output, "output", input, "input", comm.topology.world_size)
    block = input.numel() * input.element_size()
    in_ptr, out_ptr = input.data_ptr(), output.data_ptr()
    in_place = block > 0 and in_ptr == out_ptr + comm.topology.rank * block
    if not in_place and block and in_ptr < out_ptr + block * comm.topology.world_size and out_ptr < in_ptr + block:
        raise ValueError("input overlaps output but is not this rank's slice of it: use separate buffers")
    if bound is None:
        nbytes = output.numel() * output.element_size()
        bound = _bind(comm, key, "all_gather", algorithm, nbytes, output.dtype, output.numel(), None, compression,
                      async_op, lambda plan: calls.all_gather_body(comm, plan, nbytes))
    return bound(output, None if in_place else input)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: Any = ReduceOp.SUM, *,
                          algorithm: str | None = None, async_op: bool = False,
                          comm: Communicator | None = None, compression: str | None = None) -> Work | None:
    """``output`` receives this rank's block of the element-wise ``op`` over every rank's ``input``.

    ``input`` has world x output.numel() elements, block ``r`` for rank ``r``; it is never modified.
    With ``compression``, contributions crossing nodes are encoded once and combined in float32.
    """
    comm = comm or default_communicator()
    try:
        key = ("reduce_scatter", input.dtype, input.numel(), output.dtype, output.numel(), op, algorithm,
               compression, async_op)
        bound = comm.calls.get(key)
        if bound is not None and _on(comm, output) and _on(comm, input):
            return bound(output, input)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, a torch ReduceOp (unhashable): in full
        pass
    reduction = as_reduction(op)
    check_tensor(output, "output", comm.device)
    check_tensor(input, "input", comm.device)
    check_same_dtype(output, input)
    check_reduction(reduction, input.dtype)
    check_sizes(input, "input", output, "output", comm.topology.world_size)
    key = ("reduce_scatter", input.dtype, input.numel(), output.dtype, output.numel(), reduction, algorithm,
           compression, async_op)
    bound = comm.calls.get(key)
    if bound is None:
        nbytes = input.numel() * input.element_size()
        bound = _bind(comm, key, "reduce_scatter", algorithm, nbytes, input.dtype, input.numel(), reduction.op,
                      compression, async_op,
                      lambda plan: calls.reduce_scatter_body(comm, plan, reduction, input.dtype, nbytes))
    return bound(output, input)


def all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, *, algorithm: str | None = None,
               async_op: bool = False, comm: Communicator | None = None,
               compression: str | None = None) -> Work | None:
    """In place element-wise ``op`` over every rank's ``tensor``; bitwise identical on every rank (with
    ``compression`` too: every rank decodes the same bytes)."""
    comm = comm or default_communicator()
    try:
        bound = comm.calls.get(("all_reduce", tensor.dtype, tensor.numel(), op, algorithm, compression, async_op))
        if bound is not None and _on(comm, tensor):
            return bound(tensor)
    except (AttributeError, TypeError, RuntimeError):  # not a tensor, a torch ReduceOp (unhashable): in full
        pass
    reduction = as_reduction(op)
    check_tensor(tensor, "tensor", comm.device)
    check_reduction(reduction, tensor.dtype)
    key = ("all_reduce", tensor.dtype, tensor.numel(), reduction, algorithm, compression, async_op)
    bound = comm.calls.get(key)
    if bound is None:
        nbytes = tensor.numel() * tensor.element_size()
        bound = _bind(comm, key, "all_reduce", algorithm, nbytes, tensor.dtype, tensor.numel(), reduction.op,
                      compression, async_op, lambda plan: calls.all_reduce_body(comm, plan, reduction, tensor.dtype,
                                                                                nbytes))
    return bound(tensor)


# torch 2.13 names for the same calls.
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor
