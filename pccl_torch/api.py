"""The public collectives: the single dispatch point.

The first call of a shape validates its arguments (before any communication), chooses the algorithm
(``pccl_torch.selection``: the explicit ``algorithm=``, else ``PCCL_ALGO``, else the rules, the selector, the
heuristic) and binds it (``pccl_torch.calls``); later calls of the shape re-check only device, contiguity and
aliasing. Each runs
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
import torch.distributed as dist

from pccl_torch import calls, communicator, hotpath
from pccl_torch.algorithms import Collective
from pccl_torch.selection import attach, choice_of
from pccl_torch.communicator import (DEFAULT_TIMEOUT, Communicator, create, default_communicator, is_initialized,
                                     require_uninitialized, set_default)
from pccl_torch.ops import ReduceOp, Reduction, as_reduction
from pccl_torch.plan import Plan, algorithm_names, runnable_names
from pccl_torch.algorithms import Blocks
from pccl_torch.validation import (check_reduction, check_same_dtype, check_sizes, check_split_sizes, check_tensor,
                                   overlaps, row_elements)
from pccl_torch.work import Work

def init(comm=None, *, local_size: int | None = None, device: str | torch.device | None = None,
         timeout: datetime.timedelta = DEFAULT_TIMEOUT, check: bool | None = None,
         tune: str | None = None) -> Communicator:
    """Create the default communicator (``communicator.create``: collective over ``comm``, default
    ``MPI.COMM_WORLD``) with its algorithm choice, and return it. ``tune``: ``"online"`` or ``"off"``
    (default ``PCCL_TUNE``, else off; ``pccl_torch.selection.tuning``)."""
    require_uninitialized()
    created = create(comm, local_size=local_size, device=device, timeout=timeout, check=check)
    attach(created, tune)
    return set_default(created)


def _plan(comm: Communicator, collective: Collective, algorithm: str | None, nbytes: int,
          dtype: torch.dtype, compression: str | None = None, *, issued: bool = True) -> Plan:
    """The one place algorithms (and wire formats) are chosen (see ``pccl_torch.selection.choice``)."""
    choice = comm.choice
    if choice is None:
        choice = choice_of(comm)
    return choice.plan(comm, collective, algorithm, nbytes, dtype, compression,  # type: ignore[attr-defined]
                       issued=issued)


COMMUNICATOR_DEVICE = "communicator"
"""``algorithms()``'s default device: the default communicator's."""


def algorithms(collective: Collective, device: str | None = COMMUNICATOR_DEVICE) -> list[str]:
    """Algorithm names of ``collective``: by default every name ``algorithm=`` accepts on the default
    communicator's device (before ``init()``: every accepted name); ``None``: every accepted name; ``"cpu"`` or
    ``"cuda"``: the distinct names that run on that device's tensors. A bad collective or device raises."""
    if device != COMMUNICATOR_DEVICE:
        return algorithm_names(collective, device)
    names = algorithm_names(collective)
    return runnable_names(collective, default_communicator().device.type) if is_initialized() else names


def choose_algorithm(collective: Collective, nbytes: int, comm: Communicator | None = None,
                     dtype: torch.dtype = torch.float32, compression: str | None = None) -> str:
    """The plan ``algorithm=None`` would run for a call of ``collective`` on ``nbytes`` (full buffer), named
    ``<algorithm>+<format>`` when the call is compressed (``compression``, or ``PCCL_COMPRESSION``)."""
    comm = comm or default_communicator()
    return _plan(comm, collective, None, nbytes, dtype, compression, issued=False).name


def _bind(comm: Communicator, keys: tuple[tuple | None, ...], collective: Collective, algorithm: str | None,
          nbytes: int, dtype: torch.dtype, numel: int, op: ReduceOp | None, compression: str | None, async_op: bool,
          body: Callable[[Plan, bool], calls.Body], hot: tuple[int, int] = (0, 0)) -> calls.BoundCall:
    """Choose the plan of a validated call and bind it (``pccl_torch.calls``); kept under each of ``keys`` for
    the later calls of the shape unless online tuning is still trying candidates for it. A kept shape of a plain
    call (no algorithm, format or async) on MPI's own collective also goes to the compiled hot path
    (``pccl_torch.hotpath``), keyed by ``hot``: the element counts of its two tensors as the extension reads them."""
    choice = comm.choice if comm.choice is not None else choice_of(comm)
    plan, final = choice.bind_plan(comm, collective, algorithm, nbytes, dtype,  # type: ignore[attr-defined]
                                   compression)
    if final:
        calls.make_room(comm)
    # A persistent collective's binding is collective itself: never where a call may not match across ranks
    # (checking mode exists to report such calls cleanly, and an unmatched *_init would wedge the communicator).
    keep = final and not async_op and not comm.check
    bound = calls.BoundCall(comm, plan, body(plan, keep), nbytes, async_op, calls.signature(plan, dtype, numel, op))
    if not final:
        return bound
    spec = getattr(bound.body, "hot", None)
    if spec is not None and comm.hot is not None and bound.signature is None and algorithm is None and \
            compression is None and not async_op:
        hotpath.register(comm.hot, collective, dtype, hot[0], hot[1], spec.op if op is not None else None, bound,
                         spec)
    return calls.remember(comm, keys, bound)


def _on(comm: Communicator, tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a contiguous tensor on ``comm``'s device (what a cached call shape re-checks; the hot
    paths below spell it out, a call less)."""
    return tensor.is_contiguous() and comm.on_device(tensor)


_UNCHECKED = object()
"""An all-gather call whose input the cached path has not placed (in place: None; else the input)."""
_SUM = ReduceOp.SUM
"""The default op, keyed as ``"sum"`` (the same reduction): an Enum member hashes in Python, ~0.1 us a call."""
_KEYED_OPS = frozenset((ReduceOp, Reduction, str, type(dist.ReduceOp.SUM)))
"""Op types that may key a call shape as they are: equal values mean equal reductions. Not torch's ``ReduceOp``
objects: every PREMUL_SUM one compares and hashes equal whatever its factor; those key by their Reduction."""


def _lookup(comm: Communicator, key: tuple | None) -> calls.BoundCall | None:
    """The bound call of ``key``; None for a new shape, or a key that cannot be one (an unhashable argument,
    which the full validation then names)."""
    try:
        return comm.calls.get(key) if key is not None else None
    except TypeError:
        return None


def _cached(comm: Communicator, key: tuple | None, *tensors: torch.Tensor) -> calls.BoundCall | None:
    """The bound call of ``key`` when ``tensors`` pass the per-call checks of a cached shape, else None."""
    bound = _lookup(comm, key)
    return bound if bound is not None and all(_on(comm, t) for t in tensors) else None


def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor, *, algorithm: str | None = None,
                           async_op: bool = False, comm: Communicator | None = None,
                           compression: str | None = None) -> Work | None:
    """``output`` (world x input.numel() elements) receives every rank's ``input`` in rank order.

    ``input`` may be this rank's slice of ``output`` (in-place); it is never modified. ``compression``
    (``"bf16"``, ``"int8"``, ``"fp8"``, ``"lossless"``; default exact, or ``PCCL_COMPRESSION``) encodes what
    crosses nodes; every rank then holds the same decoded values, its own block included.
    """
    comm = comm or default_communicator()
    ready = _UNCHECKED
    try:
        key = ("all_gather", output.dtype, output.numel(), input.dtype, input.numel(), algorithm, compression, async_op)
        bound = comm.calls.get(key)
        if bound is not None and output.is_contiguous() and input.is_contiguous() and comm.on_device(output) \
                and comm.on_device(input):
            out_ptr, in_ptr = output.data_ptr(), input.data_ptr()
            block = bound.block
            if block and in_ptr == out_ptr + bound.offset:
                ready = None  # in place: the input is this rank's block of the output
            elif in_ptr >= out_ptr + bound.nbytes or out_ptr >= in_ptr + block:
                ready = input
    except (AttributeError, TypeError, RuntimeError):  # not tensors, an unhashable argument: validate in full
        key = None
    if ready is not _UNCHECKED:  # outside the try: the collective's own errors are never caught here
        return bound(output, ready)
    check_tensor(output, "output", comm.device)
    check_tensor(input, "input", comm.device)
    check_same_dtype(output, input)
    check_sizes(output, "output", input, "input", comm.topology.world_size)
    block = input.numel() * input.element_size()
    in_ptr, out_ptr = input.data_ptr(), output.data_ptr()
    in_place = block > 0 and in_ptr == out_ptr + comm.topology.rank * block
    if not in_place and block and in_ptr < out_ptr + block * comm.topology.world_size and out_ptr < in_ptr + block:
        raise ValueError("input overlaps output but is not this rank's slice of it: use separate buffers")
    bound = _lookup(comm, key)
    if bound is None:
        nbytes = output.numel() * output.element_size()
        bound = _bind(comm, (key,), "all_gather", algorithm, nbytes, output.dtype, output.numel(), None, compression,
                      async_op, lambda plan, keep: calls.all_gather_body(comm, plan, nbytes, keep),
                      (output.numel(), input.numel()))
    return bound(output, None if in_place else input)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: Any = ReduceOp.SUM, *,
                          algorithm: str | None = None, async_op: bool = False,
                          comm: Communicator | None = None, compression: str | None = None) -> Work | None:
    """``output`` receives this rank's block of the element-wise ``op`` over every rank's ``input``.

    ``input`` has world x output.numel() elements, block ``r`` for rank ``r``; it is never modified.
    With ``compression``, contributions crossing nodes are encoded once and combined in float32.
    """
    comm = comm or default_communicator()
    key, ready = None, False
    try:
        if op is _SUM or type(op) in _KEYED_OPS:
            key = ("reduce_scatter", input.dtype, input.numel(), output.dtype, output.numel(),
                   "sum" if op is _SUM else op, algorithm, compression, async_op)
            bound = comm.calls.get(key)
            ready = bound is not None and output.is_contiguous() and input.is_contiguous() and \
                comm.on_device(output) and comm.on_device(input)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, an unhashable argument: in full
        key = None
    if ready:  # outside the try: the collective's own errors are never caught here
        return bound(output, input)
    reduction = as_reduction(op)
    tensors = isinstance(input, torch.Tensor) and isinstance(output, torch.Tensor)
    canonical = ("reduce_scatter", input.dtype, input.numel(), output.dtype, output.numel(), reduction, algorithm,
                 compression, async_op) if tensors else None
    bound = _cached(comm, canonical, output, input)
    if bound is None:
        check_tensor(output, "output", comm.device)
        check_tensor(input, "input", comm.device)
        check_same_dtype(output, input)
        check_reduction(reduction, input.dtype)
        check_sizes(input, "input", output, "output", comm.topology.world_size)
        bound = _lookup(comm, canonical)
    if bound is None:
        nbytes = input.numel() * input.element_size()
        bound = _bind(comm, (canonical, key), "reduce_scatter", algorithm, nbytes, input.dtype, input.numel(),
                      reduction.op, compression, async_op,
                      lambda plan, keep: calls.reduce_scatter_body(comm, plan, reduction, input.dtype, nbytes,
                                                                   keep), (input.numel(), output.numel()))
    return bound(output, input)


def all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, *, algorithm: str | None = None,
               async_op: bool = False, comm: Communicator | None = None,
               compression: str | None = None) -> Work | None:
    """In place element-wise ``op`` over every rank's ``tensor``; bitwise identical on every rank (with
    ``compression`` too: every rank decodes the same bytes)."""
    comm = comm or default_communicator()
    key, ready = None, False
    try:
        if op is _SUM or type(op) in _KEYED_OPS:
            key = ("all_reduce", tensor.dtype, tensor.numel(), "sum" if op is _SUM else op, algorithm, compression,
                   async_op)
            bound = comm.calls.get(key)
            ready = bound is not None and tensor.is_contiguous() and comm.on_device(tensor)
    except (AttributeError, TypeError, RuntimeError):  # not a tensor, an unhashable argument: in full
        key = None
    if ready:  # outside the try: the collective's own errors are never caught here
        return bound(tensor)
    reduction = as_reduction(op)
    canonical = ("all_reduce", tensor.dtype, tensor.numel(), reduction, algorithm, compression, async_op) \
        if isinstance(tensor, torch.Tensor) else None
    bound = _cached(comm, canonical, tensor)
    if bound is None:
        check_tensor(tensor, "tensor", comm.device)
        check_reduction(reduction, tensor.dtype)
        bound = _lookup(comm, canonical)
    if bound is None:
        nbytes = tensor.numel() * tensor.element_size()
        bound = _bind(comm, (canonical, key), "all_reduce", algorithm, nbytes, tensor.dtype, tensor.numel(),
                      reduction.op, compression, async_op,
                      lambda plan, keep: calls.all_reduce_body(comm, plan, reduction, tensor.dtype, nbytes, keep),
                      (tensor.numel(), 0))
    return bound(tensor)


UNEVEN_CHOICE_BYTES = 1 << 20
"""The input size an all-to-all with split sizes is chosen for: its real size differs from rank to rank, and
every rank must choose the same plan (and, compressed, the same pieces)."""


def all_to_all_single(output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None, *, algorithm: str | None = None,
                      async_op: bool = False, comm: Communicator | None = None,
                      compression: str | None = None) -> Work | None:
    """Rank ``j`` receives block ``j`` of every rank's ``input``; ``output`` holds the blocks in source rank order.

    As ``torch.distributed.all_to_all_single``: blocks are rows along dim 0, ``input_split_sizes[j]`` rows for rank
    ``j`` and ``output_split_sizes[i]`` rows from rank ``i`` (zeros allowed); None splits dim 0 equally. Rank
    ``i``'s ``input_split_sizes[j]`` must be rank ``j``'s ``output_split_sizes[i]`` (checked with
    ``PCCL_DEBUG=check``); pass split sizes on every rank or on none: calls with split sizes, whose size differs
    by rank, are chosen alike on every rank as calls of :data:`UNEVEN_CHOICE_BYTES`. ``input`` is never modified
    and may not overlap ``output``. ``compression`` encodes the blocks that cross nodes, each at its source.
    """
    comm = comm or default_communicator()
    even = input_split_sizes is None and output_split_sizes is None
    ready, key = False, None
    try:
        if even:
            key = ("all_to_all", input.dtype, input.numel(), algorithm, compression, async_op)
            bound = comm.calls.get(key)
            rows = input.shape[0]
            ready = bound is not None and output.dtype == input.dtype and output.shape[0] == rows and \
                output.numel() == key[2] and rows % comm.topology.world_size == 0 and output.is_contiguous() and \
                input.is_contiguous() and comm.on_device(output) and comm.on_device(input)
            if ready:
                out_ptr, in_ptr, nbytes = output.data_ptr(), input.data_ptr(), bound.nbytes
                ready = not nbytes or in_ptr >= out_ptr + nbytes or out_ptr >= in_ptr + nbytes
    except (AttributeError, TypeError, RuntimeError, IndexError):  # not tensors, 0-dim: validate in full
        ready = False
    if ready:  # outside the try: the collective's own errors are never caught here
        return bound(output, input)
    check_tensor(output, "output", comm.device)
    check_tensor(input, "input", comm.device)
    check_same_dtype(output, input)
    row, out_row = row_elements(input, "input"), row_elements(output, "output")
    if out_row != row:
        raise ValueError(f"output rows (dim 0) have {out_row} elements but input rows have {row}: "
                         "all_to_all_single moves whole rows, so their shapes after dim 0 must hold as many")
    world = comm.topology.world_size
    send_rows = check_split_sizes(input_split_sizes, "input_split_sizes", input, "input", world)
    recv_rows = check_split_sizes(output_split_sizes, "output_split_sizes", output, "output", world)
    if even and output.numel() != input.numel():
        raise ValueError(f"output has {output.numel()} elements but input has {input.numel()}: with no split sizes "
                         "every block is the same size, so they must match (or pass split sizes)")
    if overlaps(output, input):
        raise ValueError("output overlaps input: all_to_all_single needs separate buffers")
    nbytes = input.numel() * input.element_size()
    if not even:  # sizes change call to call: chosen (cached by the choice) and counted per call, never bound
        choice = comm.choice if comm.choice is not None else choice_of(comm)
        plan, _ = choice.bind_plan(comm, "all_to_all", algorithm, UNEVEN_CHOICE_BYTES,  # type: ignore[attr-defined]
                                   input.dtype, compression)
        job = calls.Exchange(input, Blocks.from_counts([r * row for r in send_rows]),
                             Blocks.from_counts([r * row for r in recv_rows]))
        return calls.BoundCall(comm, plan, calls.exchange_body(comm, plan), nbytes, async_op,
                               calls.signature(plan, input.dtype, -1, None))(output, job)
    bound = _lookup(comm, key)  # the key the cached path built: tensors, so it could
    if bound is None:
        bound = _bind(comm, (key,), "all_to_all", algorithm, nbytes, input.dtype, input.numel(), None, compression,
                      async_op, lambda plan, keep: calls.all_to_all_body(comm, plan, input.numel(), nbytes),
                      (input.numel(), 0))
    return bound(output, input)


# The public calls: a bound shape's later calls in the compiled hot path, every other call in the functions above.
hotpath.setup(vars(communicator), "_DEFAULT",
              [(obj, mpi_name) for op, mpi_name in ((ReduceOp.SUM, "SUM"), (ReduceOp.PRODUCT, "PROD"),
                                                    (ReduceOp.MIN, "MIN"), (ReduceOp.MAX, "MAX"))
               for obj in (op, getattr(dist.ReduceOp, op.name))])
all_reduce = hotpath.entry("all_reduce", all_reduce)
all_gather_into_tensor = hotpath.entry("all_gather", all_gather_into_tensor)
reduce_scatter_tensor = hotpath.entry("reduce_scatter", reduce_scatter_tensor)
all_to_all_single = hotpath.entry("all_to_all", all_to_all_single)

# torch 2.13 names for the same calls.
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor
