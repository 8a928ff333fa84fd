"""Dumps of the flight recorder in torch's format, so that torch's own analyzer (``torchfrtrace``) reads them.

One file per rank, ``$PCCL_TRACE_DIR/pccl_trace_rank_<rank>`` (default :data:`DEFAULT_DIR`; torch's NCCL dumps
are ``/tmp/nccl_trace_rank_<rank>``): a pickle of the dictionary torch's ``FlightRecorder::dump`` writes, version
:data:`VERSION`: ``version``, ``pg_config`` (each communicator as a process group: name, desc ``pccl``, its ranks
in the launch's numbering), ``pg_status`` (last enqueued, started and completed call of each) and ``entries``, one a
recorded call with torch's fields. torch's analyzer accepts only the backends it knows in ``profiling_name``, so
pccl's calls are named as NCCL's (``nccl:all_reduce``); ``backend`` says ``pccl``, and each entry's ``pccl`` field
carries what torch's lack: the plan, the bytes, the phase reached (level, chunk step), the error, and the peers
the call was waiting for (a failed call's, else those of the wait it was in when dumped), in the launch's rank
numbering (``pccl-trace`` reads those).

When a dump is written: on a pccl timeout or any failure that breaks a communicator (``Communicator.mark_broken``),
when the watchdog aborts the job, when the launcher reports a failed process (``failure_notice``: MPICH's
``-disable-auto-cleanup`` SIGUSR1), each at most once a process (the first failure's picture is the one that
explains the hang); and every time on :data:`SIGNAL_ENV`'s signal (``SIGUSR2`` by default: SIGUSR1 is the
launcher's failure notice) and on :func:`dump_trace`. A dump reads memory and writes one local file: nothing in it
waits on a peer, and a failure to write is reported on stderr, never raised over the error being handled.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import torch

from pccl_torch import failure_notice, flight_recorder

DIR_ENV = "PCCL_TRACE_DIR"
SIGNAL_ENV = "PCCL_TRACE_SIGNAL"
DEFAULT_DIR = "/tmp/pccl_trace"
PREFIX = "pccl_trace_rank_"
"""File names: this prefix and the rank (``torchfrtrace`` infers it, or takes ``-p pccl_trace_rank_``)."""
VERSION = "2.10"
"""The format version torch 2.13's recorder writes (``FlightRecorder.hpp``); the analyzer checks it."""
BACKEND_NAME = "nccl"
"""The ``profiling_name`` prefix: torch's analyzer refuses any backend it does not list ("pccl" included)."""
GROUP_DESC = "pccl"

_failure_dumped = False
_lock = threading.Lock()


def launch_rank() -> int:
    """This process's rank in the launch (MPI's, torchrun's), which names its dump file."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "RANK"):
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    recorders = flight_recorder.live()
    return recorders[0].world_ranks[recorders[0].rank] if recorders else 0


def dump_path(directory: str | os.PathLike[str] | None = None) -> Path:
    """Where this rank's dump goes: ``directory`` (default ``$PCCL_TRACE_DIR`` or :data:`DEFAULT_DIR`)."""
    folder = Path(directory or os.environ.get(DIR_ENV) or DEFAULT_DIR)
    return folder / f"{PREFIX}{launch_rank()}"


def _dtype_name(dtype: torch.dtype) -> str:
    """A dtype as torch's recorder names it (``c10::toString``: ``Float``, ``BFloat16``)."""
    return torch.empty(0, dtype=dtype).type().rsplit(".", 1)[-1].removesuffix("Tensor")


def _sizes(call: Any) -> tuple[list[list[int]], list[list[int]]]:
    """A bound call's input and output sizes as this rank passes them (torch's ``input_sizes``/``output_sizes``)."""
    elements = call.nbytes // call.dtype.itemsize
    block = elements // call.comm.topology.world_size
    collective = call.plan.collective
    if collective == "all_gather":
        return [[block]], [[elements]]
    if collective == "reduce_scatter":
        return [[elements]], [[block]]
    return [[elements]], [[elements]]


def _frames(stack: list[Any] | None) -> list[dict[str, Any]]:
    """An issuing stack as torch's ``frames`` (innermost first, as torch's recorder writes them)."""
    return [{"name": f.name, "filename": f.filename, "line": f.lineno} for f in reversed(stack or [])]


def _launch_rank(recorder: flight_recorder.Recorder, rank: int) -> int:
    """Communicator rank ``rank`` in the launch's numbering (the dump files' and ``pg_config``'s)."""
    return recorder.world_ranks[rank] if 0 <= rank < len(recorder.world_ranks) else rank


def entry(recorder: flight_recorder.Recorder, record: flight_recorder.Record) -> dict[str, Any]:
    """One recorded call as torch's recorder writes an entry, plus pccl's own fields under ``pccl``."""
    call = record.call
    inputs, outputs = _sizes(call)
    dtype = _dtype_name(call.dtype)
    state = "completed" if record.completed else "started" if record.started else "scheduled"
    failure = recorder.failures.get(record.seq)
    phase = record.phase if call.plan.hierarchical else None  # a slot reused by a flat call keeps a stale one
    level = next((name for name in ("inter", "intra") if phase and name in phase), None)
    peers = failure.peers if failure else record.waiting
    return {
        "record_id": record.seq,
        "pg_id": int(recorder.name),
        "process_group": (recorder.name, GROUP_DESC),
        "collective_seq_id": record.seq,
        "p2p_seq_id": 0,
        "op_id": record.seq,
        "profiling_name": f"{BACKEND_NAME}:{call.plan.collective}",
        "time_created_ns": recorder.epoch_ns(record.created),
        "duration_ms": (record.completed - record.started) * 1e3 if record.completed else None,
        "input_sizes": inputs,
        "input_dtypes": [dtype],
        "output_sizes": outputs,
        "output_dtypes": [dtype],
        "state": state,
        "time_discovered_started_ns": recorder.epoch_ns(record.started) or None,
        "time_discovered_completed_ns": recorder.epoch_ns(record.completed) or None,
        "retired": bool(record.completed),
        "timeout_ms": int(recorder.timeout_s * 1000),
        "is_p2p": False,
        "frames": _frames(record.stack),
        "pccl": {
            "collective": call.plan.collective,
            "algorithm": call.plan.name,
            "bytes": call.nbytes,
            "async_op": call.async_op,
            "phase": phase,
            "level": level,
            "step": record.step if phase else -1,
            "error": failure.message if failure else None,
            "peers": [_launch_rank(recorder, peer) for peer in peers],
        },
    }


def snapshot(reason: str, recorders: list[flight_recorder.Recorder] | None = None) -> dict[str, Any]:
    """The dump of ``recorders`` (default: every live communicator's): torch's keys plus ``backend``, ``reason``
    and ``rank``."""
    pg_config: dict[str, dict[str, str]] = {}
    pg_status: dict[str, dict[str, int]] = {}
    entries: list[dict[str, Any]] = []
    for recorder in flight_recorder.live() if recorders is None else recorders:
        records = recorder.records()
        pg_config[recorder.name] = {"name": recorder.name, "desc": GROUP_DESC, "ranks": str(recorder.world_ranks)}
        pg_status[recorder.name] = {
            "last_enqueued_collective": max((r.seq for r in records), default=-1),
            "last_started_collective": max((r.seq for r in records if r.started), default=-1),
            "last_completed_collective": max((r.seq for r in records if r.completed), default=-1),
        }
        entries.extend(entry(recorder, record) for record in records)
    return {"version": VERSION, "pg_config": pg_config, "pg_status": pg_status, "entries": entries,
            "comm_lib_version": "pccl", "backend": "pccl", "reason": reason, "rank": launch_rank()}


def dump_trace(directory: str | os.PathLike[str] | None = None, reason: str = "pccl_torch.dump_trace()") -> Path:
    """Write this rank's flight-recorder dump now into ``directory`` (made if missing; default ``$PCCL_TRACE_DIR``
    or :data:`DEFAULT_DIR`) as ``pccl_trace_rank_<rank>``, and return its path. Local only: any rank, any time."""
    target = dump_path(directory)
    data = snapshot(reason)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with open(partial, "wb") as out:
        pickle.dump(data, out)
    os.replace(partial, target)  # a reader never sees half a dump
    return target


def dump_on_failure(reason: str) -> None:
    """Dump once a process, on the first failure (timeout, broken communicator, abort, failure notice); a
    failure to write is said on stderr and swallowed: the error being handled must reach the caller."""
    global _failure_dumped
    if not flight_recorder.live():
        return
    with _lock:
        if _failure_dumped:
            return
        _failure_dumped = True
    _quietly(reason)


def _quietly(reason: str) -> None:
    try:
        path = dump_trace(reason=reason)
        sys.stderr.write(f"pccl (rank {launch_rank()}): flight recorder dumped to {path} ({reason.splitlines()[0]})\n")
    except Exception as exc:  # noqa: BLE001 - never replace the process's own error with the dump's
        sys.stderr.write(f"pccl: could not write the flight-recorder dump: {type(exc).__name__}: {exc}\n")


def _on_signal(signum: int, frame: object) -> None:
    _quietly(f"signal {signal.Signals(signum).name}")


def _on_failure_notice() -> None:
    dump_on_failure("the launcher reported a failed process")


def _on_terminate(signum: int, frame: object) -> None:
    """SIGTERM, as a launcher ends the ranks still running once one failed (torchrun's agent, mpiexec): the
    failure's dump (once), then the default action, so the process still ends as it would have."""
    dump_on_failure("terminated by SIGTERM (the launcher ends the job)")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def install() -> None:
    """Dump on the launcher's failure notice, on SIGTERM (once, then the default action) and on :data:`SIGNAL_ENV`'s
    signal (``SIGUSR2``; ``0``: none), each where nobody else handles it and this is the main thread. Idempotent."""
    if _on_failure_notice not in failure_notice.listeners:
        failure_notice.listeners.append(_on_failure_notice)
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a rank a launcher terminates leaves its record too
        signal.signal(signal.SIGTERM, _on_terminate)
    name = os.environ.get(SIGNAL_ENV, "SIGUSR2").strip()
    if name == "0":
        return
    try:
        signum = signal.Signals[name] if not name.isdigit() else signal.Signals(int(name))
    except (KeyError, ValueError):
        raise ValueError(f"{SIGNAL_ENV}={name!r}: expected a signal name such as SIGUSR2, or 0 for none") from None
    if signum == signal.SIGUSR1:
        raise ValueError(f"{SIGNAL_ENV}=SIGUSR1 is the launcher's failure notice (pccl_torch.failure_notice); "
                         "choose another signal")
    if signal.getsignal(signum) in (signal.SIG_DFL, _on_signal):
        signal.signal(signum, _on_signal)
