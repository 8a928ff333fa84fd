"""The compiled hot path: a bound call shape's later calls run in C++, not through the Python layers.

A small collective on one node costs MPI a few microseconds; every microsecond of Python around it shows (2 ranks,
1 KiB all-gather: 4.2 us through the Python layers against 2.5 us for mpi4py's own call), and where ranks share
cores each one is paid again by every rank that waits. So the public collectives are :class:`Entry` objects: a
call of a shape bound to MPI's own collective (``pccl_torch.calls``: a flat ``mpi`` plan on host tensors, blocking
or polled waits, no checking, no async) is recognised by the extension (``_hotpath.cpp``), which re-checks what
may differ between calls of one shape (dense, contiguous, on the CPU, dtype, aliasing), numbers and counts the
call exactly as ``BoundCall`` does, and runs MPI's collective on the tensors' memory: persistent over staging
copies up to 4 KiB, else blocking under the watchdog or started and polled. Everything else (a first call, other
keywords, a shape on another plan, a broken communicator, queued async calls) goes to the Python implementation
unchanged, which validates, chooses, binds and raises as before; so does every call where the extension is not
built or not usable (``why_not`` says why): the Python path is the reference, the extension only a shortcut.

The extension is compiled at the first ``import pccl_torch`` of an environment and cached per node, or ahead of time
by ``python -m pccl_torch.hotpath.build`` (``make install`` runs it; ``_builder.py`` says how); ``PCCL_HOTPATH=off``
turns it off. It is used only with the MPICH it was built against (its handles are compiled in): with another
MPI (the ULFM Open MPI of the fault trials) the Python path runs. Wherever it cannot be used, importing logs one
warning naming why.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

from mpi4py import MPI

from pccl_torch import environment
from pccl_torch.hotpath import _builder

log = logging.getLogger(__name__)

HOTPATH_ENV = "PCCL_HOTPATH"
"""``on`` (default) or ``off``."""
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
"""The collectives the extension runs, by its kind number."""


def _import(path: Any) -> ModuleType:
    """The extension module at ``path`` (in the build cache, not in this package: loaded by file name)."""
    name = f"{__name__}._hotpath"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"not an extension module: {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def _load() -> tuple[Any, str | None]:
    """The extension module, or None and why not."""
    setting = environment.read(HOTPATH_ENV) or "on"
    if setting not in ("on", "off"):
        raise ValueError(f"{HOTPATH_ENV}={setting!r}: expected on or off")
    if setting == "off":
        return None, f"{HOTPATH_ENV}=off"
    library = MPI.Get_library_version()
    path = None
    try:
        path = _builder.ensure(library)
        _hotpath = _import(path)
    except _builder.BuildError as exc:
        return None, str(exc)
    except ImportError as exc:
        return None, f"cannot load {path}: {exc}"
    abi = _hotpath.abi()
    sizes = {"comm": MPI.Comm, "request": MPI.Request, "datatype": MPI.Datatype, "op": MPI.Op}
    if any(abi[name] != MPI._sizeof(kind) for name, kind in sizes.items()):
        return None, f"built for other MPI handle sizes ({abi})"
    version = _builder.mpich_version(library)
    if version != abi["library"]:
        return None, f"built against MPICH {abi['library']}, mpi4py runs MPICH {version or '?'}"
    return _hotpath, None


_ext, why_not = _load()
available = _ext is not None
"""Whether calls of bound shapes run in the extension (else ``why_not`` says why they do not)."""
if _ext is None and why_not != f"{HOTPATH_ENV}=off":
    log.warning("pccl: the compiled hot path is off: %s; small collectives run through the Python layers",
                why_not.splitlines()[0] if why_not else "?")


def handle(obj: Any) -> int:
    """An mpi4py object's handle as the extension takes it."""
    return MPI._handleof(obj)


def entry(collective: str, implementation: Callable[..., Any]) -> Callable[..., Any]:
    """The public ``collective``: an :class:`Entry` over ``implementation`` (the Python path), or
    ``implementation`` itself without the extension."""
    if _ext is None:
        return implementation
    wrapped = _ext.Entry(KINDS.index(collective), implementation)
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(wrapped, name, getattr(implementation, name))
    wrapped.__wrapped__ = implementation  # inspect.signature and help() show the Python signature
    return wrapped


def setup(default_holder: dict, default_name: str, ops: list[tuple[object, str]]) -> None:
    """Tell the extension where the default communicator is kept (``default_holder[default_name]``) and which
    reduce-op objects mean which MPI op, by its name in ``MPI`` (by identity: any other op object goes to the
    Python path)."""
    if _ext is not None:
        _ext.setup(default_holder, default_name, [(obj, handle(getattr(MPI, name))) for obj, name in ops],
                   handle(MPI.SUM))


def table(trace: int = 0) -> Any:
    """A communicator's table of hot shapes, with a flight-recorder ring of ``trace`` slots for the calls it runs
    (``pccl_torch.flight_recorder``; 0: none); None without the extension."""
    return _ext.Table(trace) if _ext is not None else None


class Spec(NamedTuple):
    """What the extension needs of a bound native collective (``MPITransport.bind_*`` attaches one as ``hot``)."""

    comm: Any
    """The mpi4py communicator."""
    datatype: Any
    """The MPI datatype of the reduction (``MPI.BYTE`` for moves)."""
    op: Any
    """The MPI op (``MPI.OP_NULL`` for moves)."""
    count: int
    """Elements of the MPI call: all of an all-reduce, one block of a reduce-scatter, block bytes of a move."""
    request: Any
    """A persistent collective over ``staged_in``/``staged_out`` (``MPI.REQUEST_NULL``: none)."""
    staged_in: int
    staged_out: int
    """Addresses of the staging buffers (0: none)."""
    keep: Any
    """What owns the staging memory."""
    watch: Any
    """The watchdog's watch of a blocking call (None when polled)."""
    spin_s: float
    """The polled wait's spin floor (0 when blocking)."""
    failed: Callable[[Any], Exception]
    """The error of an MPI error (``MPITransport._failure_of``)."""
    complete: Callable[[Any, float], None] | None
    """``complete(request, spun)``: finish a started request the fast poll gave up on after ``spun`` seconds
    (naps, deadline, failure notices; None when blocking)."""


def register(table_: Any, kind: str, dtype: Any, a: int, b: int, op: Any, bound: Any, spec: Spec) -> None:
    """Run the later calls of ``bound`` (a ``calls.BoundCall``) in the extension: a call of collective ``kind``
    on ``dtype`` with ``a`` and ``b`` elements (see ``_hotpath.cpp``'s ``Key``) and MPI ``op`` (None: no op)."""
    def on_error(code: int, sequence: int) -> Exception:
        exc = MPI.Exception(code)
        return bound._failed(spec.failed(exc), sequence)

    def on_slow(request_handle: int, sequence: int, waited: float) -> Exception | None:
        request = (MPI.Prequest if spec.request != MPI.REQUEST_NULL else MPI.Request).fromhandle(request_handle)
        try:
            spec.complete(request, waited)
        except Exception as exc:  # noqa: BLE001 - the call's error, as BoundCall raises it
            return bound._failed(exc, sequence)
        return None

    table_.add(KINDS.index(kind), dtype, a, b, handle(op) if op is not None else 0, handle(spec.comm),
               handle(spec.datatype), handle(spec.op), spec.count, bound.nbytes, bound.block, bound.offset,
               bound.comm.topology.world_size, handle(spec.request), spec.staged_in, spec.staged_out,
               spec.watch is None, spec.spin_s, bound.entry, spec.watch, on_error, on_slow, spec.keep, bound)


def hits(comm: Any) -> int:
    """Calls of communicator ``comm`` the hot path has run (0 without it)."""
    return comm.hot.hits if comm.hot is not None else 0
