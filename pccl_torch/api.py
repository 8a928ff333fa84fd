"""The public collectives: the single dispatch point.

Each call validates its arguments (before any communication), chooses the algorithm (``pccl_torch.choice``:
the explicit ``algorithm=``, else ``PCCL_ALGO``, else the selector, else the heuristic), runs it in issue order on the communicator, and
returns ``None`` (blocking) or a :class:`~pccl_torch.work.Work` (``async_op=True``), as torch.distributed.
Every call gets a sequence number; with checking on, the ranks agree on its signature before it runs; a
collective that fails (timeout, dead peer) raises ``PcclTimeoutError`` and breaks the communicator.
"""

from __future__ import annotations

import datetime
import functools
from time import perf_counter
from collections.abc import Callable
from typing import Any

import torch

from pccl_torch.algorithms import Collective
from pccl_torch.choice import attach, choice_of
from pccl_torch.communicator import (DEFAULT_TIMEOUT, Communicator, create, default_communicator,
                                     require_uninitialized, set_default)
from pccl_torch.errors import PcclError, PcclMismatchError, PcclTimeoutError, Stalled
from pccl_torch.ops import ReduceOp, Reduction, as_reduction
from pccl_torch.plan import Plan
from pccl_torch.signature import Signature, agree
from pccl_torch.triton_kernels import scale_
from pccl_torch.validation import check_reduction, check_same_dtype, check_sizes, check_tensor, overlaps
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


def _launch(comm: Communicator, plan: Plan, dtype: torch.dtype, numel: int, op: ReduceOp | None,
            body: Callable[[], torch.Tensor], async_op: bool) -> Work | None:
    """Number the call, then run ``body`` in issue order (now, or on the worker for ``async_op``).

    The blocking success path allocates nothing but ``body``'s closure (the signature only with checking
    on): with 4 ranks sharing 2 cores, every microsecond spent here is paid about seven times over in the
    collective's time, by the ranks that wait for this one."""
    sequence = comm.next_sequence()
    if async_op:
        run = functools.partial(_run, comm, plan, sequence, dtype, numel, op, body)
        return Work(comm.executor.submit(run), plan.collective, plan.name)
    comm.executor.drain()
    _run(comm, plan, sequence, dtype, numel, op, body)
    return None


def _run(comm: Communicator, plan: Plan, sequence: int, dtype: torch.dtype, numel: int, op: ReduceOp | None,
         body: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Run one numbered call: agree on its signature (checking on), time it, turn failures into errors
    that break the communicator (a ``PcclTimeoutError`` for a peer that never answered)."""
    try:
        if comm.check:
            agree(comm, Signature(plan.collective, plan.name, dtype, numel, op.value if op else "none"), sequence)
        if plan.probe is not None:  # an online-tuning trial: timed from a common start, as pccl-bench times
            comm.world.barrier()
        start = perf_counter()
        result = body()
        seconds = perf_counter() - start
        comm.stats.record(plan, numel * dtype.itemsize, seconds)
        if plan.probe is not None:
            plan.probe(seconds)
        return result
    except PcclMismatchError:
        raise  # found before any data moved: the communicator is still sound
    except Stalled as exc:
        error = PcclTimeoutError(plan.collective, sequence, plan.name, comm.topology.rank, exc)
        comm.mark_broken(error)
        raise error from exc
    except Exception as exc:
        comm.mark_broken(PcclError(f"pccl {plan.collective} #{sequence} ({plan.name}) failed: {exc}"))
        raise


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as 1-D (itself when it already is: ``view(-1)`` costs ~2.5 us a call)."""
    return tensor if tensor.dim() == 1 else tensor.view(-1)


def _finish_reduction(tensor: torch.Tensor, reduction: Reduction, world: int) -> None:
    if reduction.divide_by_world:
        scale_(tensor, 1.0 / world)


def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor, *, algorithm: str | None = None,
                           async_op: bool = False, comm: Communicator | None = None,
                           compression: str | None = None) -> Work | None:
    """``output`` (world x input.numel() elements) receives every rank's ``input`` in rank order.

    ``input`` may be this rank's slice of ``output`` (in-place); it is never modified. ``compression``
    (``"bf16"``, ``"int8"``, ``"fp8"``, ``"lossless"``; default exact, or ``PCCL_COMPRESSION``) encodes what
    crosses nodes; every rank then holds the same decoded values, its own block included.
    """
    comm = comm or default_communicator()
    check_tensor(output, "output", comm.device)
    check_tensor(input, "input", comm.device)
    check_same_dtype(output, input)
    world = comm.topology.world_size
    check_sizes(output, "output", input, "input", world)
    in_place = bool(input.numel()) and input.data_ptr() == (
        output.data_ptr() + comm.topology.rank * input.numel() * input.element_size())
    if not in_place and overlaps(output, input):
        raise ValueError("input overlaps output but is not this rank's slice of it: use separate buffers")
    plan = _plan(comm, "all_gather", algorithm, output.numel() * output.element_size(), output.dtype, compression)

    def body() -> torch.Tensor:
        flat_out = _flat(output)
        inp = flat_out[comm.topology.rank * input.numel():][: input.numel()] if in_place else _flat(input)
        plan.run_all_gather(comm, flat_out, inp)
        return output

    return _launch(comm, plan, output.dtype, output.numel(), None, body, async_op)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: Any = ReduceOp.SUM, *,
                          algorithm: str | None = None, async_op: bool = False,
                          comm: Communicator | None = None, compression: str | None = None) -> Work | None:
    """``output`` receives this rank's block of the element-wise ``op`` over every rank's ``input``.

    ``input`` has world x output.numel() elements, block ``r`` for rank ``r``; it is never modified.
    With ``compression``, contributions crossing nodes are encoded once and combined in float32.
    """
    comm = comm or default_communicator()
    reduction = as_reduction(op)
    check_tensor(output, "output", comm.device)
    check_tensor(input, "input", comm.device)
    check_same_dtype(output, input)
    check_reduction(reduction, input.dtype)
    world = comm.topology.world_size
    check_sizes(input, "input", output, "output", world)
    plan = _plan(comm, "reduce_scatter", algorithm, input.numel() * input.element_size(), input.dtype, compression)

    def body() -> torch.Tensor:
        inp = _flat(input)
        if reduction.pre_scale is not None:
            inp = scale_(inp.clone(), reduction.pre_scale)
        target = torch.empty_like(output) if overlaps(output, input) else output
        plan.run_reduce_scatter(comm, inp, _flat(target), reduction.combine)
        _finish_reduction(target, reduction, world)
        if target is not output:
            output.copy_(target)
        return output

    return _launch(comm, plan, input.dtype, input.numel(), reduction.op, body, async_op)


def all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, *, algorithm: str | None = None,
               async_op: bool = False, comm: Communicator | None = None,
               compression: str | None = None) -> Work | None:
    """In place element-wise ``op`` over every rank's ``tensor``; bitwise identical on every rank (with
    ``compression`` too: every rank decodes the same bytes)."""
    comm = comm or default_communicator()
    reduction = as_reduction(op)
    check_tensor(tensor, "tensor", comm.device)
    check_reduction(reduction, tensor.dtype)
    plan = _plan(comm, "all_reduce", algorithm, tensor.numel() * tensor.element_size(), tensor.dtype, compression)

    def body() -> torch.Tensor:
        buf = _flat(tensor)
        if reduction.pre_scale is not None:
            scale_(buf, reduction.pre_scale)
        plan.run_all_reduce(comm, buf, reduction.combine)
        _finish_reduction(buf, reduction, comm.topology.world_size)
        return tensor

    return _launch(comm, plan, tensor.dtype, tensor.numel(), reduction.op, body, async_op)


# torch 2.13 names for the same calls.
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor
