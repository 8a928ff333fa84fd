"""pccl's collectives in ``torch.profiler`` traces, recorded as torch records NCCL's.

While a torch profiler records (``torch.profiler.profile``, ``torch.autograd.profiler.profile``), every pccl
collective, whichever way it was called (the API, the ``pccl`` backend, the FSDP and DeepSpeed adapters, the
compiled hot path), runs inside two ranges on the thread that runs it:

- ``record_param_comms``: torch's event of a collective's parameters, the one ``ProcessGroupNCCL`` records, with
  its fields (``Collective name``, ``dtype``, ``In msg nelems``, ``Out msg nelems``, ``Group size``, ``Rank``,
  ``Seq``, ``Process Group Name`` ``pccl``), shown in every trace and read by trace tools;
- inside it ``pccl:<collective>`` (``pccl:all_gather``, as NCCL's ``nccl:all_gather``), whose arguments add what
  torch's fields lack: ``collective``, ``bytes`` (the full buffer, as ``pccl_torch.stats()`` counts it), ``dtype``,
  ``algorithm`` (the plan's name), ``group_size``, ``rank``, ``seq`` and ``async_op``. The profiler keeps a range's
  arguments where it records shapes (``record_shapes=True``): the event's ``args`` in the Chrome trace,
  ``FunctionEvent.kwinputs`` in ``prof.events()``.

The phases of a two-level call nest inside ``pccl:<collective>`` (:func:`phase`): ``pccl:pack``,
``pccl:intra:<collective>``, ``pccl:inter:<collective>``, ``pccl:unpack``, and a compressed call's ``pccl:encode``
and ``pccl:decode``, each with the ``bytes`` it works on and, for the exchanges, the level's ``group_size``. A
pipelined call's chunks overlap, so each step of a chunk is a range of its own (:func:`chunk_step`): an exchange's
issue as ``pccl:intra:<collective>`` or ``pccl:inter:<collective>`` and its completion as ``pccl:wait``, a local
step (``pccl:pack``, ``pccl:encode``...) whole, each with its ``chunk``.

Both call ranges come from the compiled extension (``pccl_torch/hotpath/_hotpath.cpp``, ATen's
``RecordFunction``), for the hot path's own calls and for the Python path's alike. A call that runs on the
communicator's worker thread (``async_op=True`` on CPU; on CUDA, a plan crossing MPI) carries the caller's
profiler there (:func:`carried`, as torch's ``at::launch`` carries its thread-local state), so its ranges and
phases show on the worker's row of the caller's trace. Without the extension (``PCCL_HOTPATH=off``, another MPI,
no compiler) ``pccl:<collective>`` and the phases are recorded from Python with the same arguments,
``record_param_comms`` is absent, and the worker's calls show only where the profiler records every thread
(``experimental_config=torch._C._profiler._ExperimentalConfig(profile_all_threads=True)``).

With no profiler recording, a call pays one check of torch's own flag for it,
``torch.autograd.profiler._is_profiler_enabled`` (set while a torch profiler records; aot_autograd reads it for
the same reason): an attribute read in Python, a dictionary look-up (~10 ns) in the hot path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import profiler as torch_profiler

from pccl_torch import flight_recorder

try:
    from torch._C._profiler import _RecordFunctionFast  # a range with keyword arguments (torch >= 2.4)
except ImportError:  # pragma: no cover - older torch: names only
    _RecordFunctionFast = None

GROUP = "pccl"
"""``record_param_comms``' process group name and description."""
_OFF = contextlib.nullcontext()


def recording() -> bool:
    """Whether a torch profiler records (what every call checks, inlined as ``torch_profiler._is_profiler_enabled``
    on the call paths)."""
    return torch_profiler._is_profiler_enabled


def call_ranges(collective: str, dtype: torch.dtype, nbytes: int, algorithm: str, group_size: int, rank: int,
                sequence: int, async_op: bool) -> contextlib.AbstractContextManager[Any]:
    """The ranges of call ``sequence`` of ``collective`` on a full buffer of ``nbytes`` of ``dtype`` under plan
    ``algorithm``: a context manager, entered and exited on the thread that runs the call."""
    elements = nbytes // dtype.itemsize
    block = elements // group_size
    in_nelems = block if collective == "all_gather" else elements
    out_nelems = block if collective == "reduce_scatter" else elements
    extension = _extension()
    if extension is not None:
        return extension.Range(collective, dtype, in_nelems, out_nelems, nbytes, algorithm, group_size, rank,
                               sequence, async_op, GROUP)
    return _range(f"pccl:{collective}", {"collective": collective, "bytes": nbytes,
                                         "dtype": str(dtype).removeprefix("torch."), "algorithm": algorithm,
                                         "group_size": group_size, "rank": rank, "seq": sequence,
                                         "async_op": async_op})


def carried(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` carrying the calling thread's profiler to the thread that will run it (the communicator's worker);
    ``fn`` itself without the extension."""
    extension = _extension()
    if extension is None:
        return fn
    state = extension.ProfilerState()

    def run_carried() -> Any:
        with state:
            return fn()

    return run_carried


def phase(name: str, data: torch.Tensor, level: Any = None) -> contextlib.AbstractContextManager[Any]:
    """The range of one phase of a call (``pccl:intra:all_gather``...), nested in the call's: ``bytes`` of
    ``data`` (what the phase works on) and, for an exchange, the ``group_size`` of its ``level`` (a transport).
    A shared empty context when no profiler records. Either way the flight recorder notes the phase reached."""
    flight_recorder.mark_phase(name)
    if not torch_profiler._is_profiler_enabled:
        return _OFF
    args = {"bytes": data.numel() * data.element_size()}
    if level is not None:
        args["group_size"] = level.size
    return _range(name, args)


def chunk_step(what: str, chunk: int, level: Any = None,
               waiting: bool = False) -> contextlib.AbstractContextManager[Any]:
    """The range of one step of a pipelined call (``algorithms.pipelined.run``), nested in the call's: its start
    (an exchange's issue, or a local step's whole work) as ``pccl:<phase>``, or with ``waiting`` its completion as
    ``pccl:wait``, carrying the ``chunk``, the step (``phase``) and, for an exchange, the ``group_size`` of its
    ``level``. Chunks overlap, so a started exchange's own time shows as the gap to its ``pccl:wait``. A shared
    empty context when no profiler records. Either way the flight recorder notes the step reached."""
    flight_recorder.mark_phase(f"{'wait ' if waiting else ''}{what}", chunk)
    if not torch_profiler._is_profiler_enabled:
        return _OFF
    words = what.split(" (")[0].replace("-", "_").split(" ")  # "inter all-gather (encoded)", "decode and combine"
    level_name = words[0] in ("intra", "inter")
    name = "pccl:" + (f"{words[0]}:{'_'.join(words[1:])}" if level_name else "_".join(words))
    args: dict[str, Any] = {"chunk": chunk, "phase": name}
    if level is not None:
        args["group_size"] = level.size
    return _range("pccl:wait" if waiting else name, args)


def _range(name: str, args: dict[str, Any]) -> contextlib.AbstractContextManager[Any]:
    """A range recorded from Python: ``name`` with keyword arguments ``args``."""
    if _RecordFunctionFast is None:  # pragma: no cover - older torch
        return torch.profiler.record_function(name)
    return _RecordFunctionFast(name, (), args)


def _extension() -> Any:
    """The compiled extension's profiler types, or None without it (imported here, while a profiler records:
    the hot path sits above this module)."""
    from pccl_torch import hotpath

    extension = getattr(hotpath, "_ext", None)
    return extension if extension is not None and hasattr(extension, "Range") else None
