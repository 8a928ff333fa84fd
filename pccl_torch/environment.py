"""Every ``PCCL_*`` environment variable pccl-torch reads, in one table, and the parser of the per-collective
ones (``collective:value,...``).

The modules that read a variable keep its name as a constant beside the code that parses it; this table is
the user-facing reference of all of them (the configuration page of the docs is generated from it), and
``tests/unit/test_docs.py`` checks that it names exactly the variables the source reads.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def read(name: str) -> str:
    """The value of variable ``name`` without surrounding blanks (``""`` when unset)."""
    return os.environ.get(name, "").strip()


def count(name: str, default: int, unit: str) -> int:
    """Variable ``name`` as a whole number >= 0, ``default`` when unset; otherwise ``ValueError`` naming the variable,
    its value and ``unit`` (what it counts and what 0 means)."""
    raw = read(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name}={raw!r}: expected a number of {unit}")
    return value


def _malformed(entry: str, collective: str, value: str, collectives: Sequence[str]) -> str | None:
    """What is wrong with one ``collective:value`` entry, or None."""
    if not value:
        return f"entry {entry.strip()!r} is not collective:value"
    if collective not in collectives:
        return f"unknown collective {collective!r}"
    return None


def per_collective(name: str, collectives: Sequence[str], check: Callable[[str, str], object], example: str,
                   *, for_all: bool = False) -> dict[str, str]:
    """Variable ``name`` read as ``collective:value,...`` (``example`` shows one entry): {collective: value};
    with ``for_all``, a value without ``:`` is the value of every collective.

    Blanks around entries and around each ``:`` are dropped (``' all_reduce : hier:ring '``). ``check(collective,
    value)`` raises ``ValueError`` for a value it rejects. A malformed entry, an unknown collective, a collective
    given twice and a rejected value raise ``ValueError`` naming the variable and its value.
    """
    raw = read(name)
    entries = raw.split(",") if raw else []
    if for_all and raw and ":" not in raw:
        entries = [f"{collective}:{raw}" for collective in collectives]
    found: dict[str, str] = {}
    for entry in entries:
        collective, _, value = ":".join(part.strip() for part in entry.split(":")).partition(":")
        if problem := _malformed(entry, collective, value, collectives):
            raise ValueError(f"{name}={raw!r}: {problem}; each entry must look like {example!r}, with a collective "
                             f"of {', '.join(collectives)}")
        if collective in found:
            raise ValueError(f"{name}={raw!r}: {collective} is given twice ({found[collective]!r} and {value!r})")
        try:
            check(collective, value)
        except ValueError as exc:
            raise ValueError(f"{name}={raw!r}: {exc}") from None
        found[collective] = value
    return found


@dataclass(frozen=True)
class Variable:
    """One environment variable: its accepted values, the default, when it is read and what it does."""

    name: str
    values: str
    default: str
    read: str
    meaning: str
    page: str


VARIABLES: tuple[Variable, ...] = (
    Variable("PCCL_ALGO", "`collective:name,...` (e.g. `all_reduce:ring,all_gather:hier:bruck`)", "unset",
             "communicator creation",
             "Fixes the algorithm of each listed collective for the whole job, as `NCCL_ALGO` does; unknown "
             "collectives or names fail `init()`, listing the valid ones.", "selection.md"),
    Variable("PCCL_TUNE", "`off`, `online`", "`off`", "communicator creation (`init(tune=)` overrides)",
             "Online tuning: the first calls of each new call shape time the model's top candidates and all "
             "ranks lock in the same fastest one.", "selection.md"),
    Variable("PCCL_TUNE_CACHE", "a file path", "`~/.cache/pccl-torch/tuned.json`", "communicator creation",
             "Where online tuning keeps its choices (one entry per layout) for the next run.", "selection.md"),
    Variable("PCCL_PROFILE", "a profile path, or `none`", "the per-user cache, then the shipped default",
             "`init()` (rank 0 reads, then broadcasts)",
             "The learned selector profile; `none` leaves the choice to the heuristic.", "selection.md"),
    Variable("PCCL_COMPRESSION", "`collective:format,...` with format `bf16`, `int8`, `fp8`, `lossless`",
             "unset (exact)", "communicator creation",
             "Wire format of what crosses nodes, per collective, for calls that leave `compression=` unset.",
             "compression.md"),
    Variable("PCCL_LOCAL_SIZE", "a positive integer dividing the world size", "unset (detected)",
             "`init()`", "Ranks per node: emulates `world / L` nodes of `L` consecutive ranks on one machine.",
             "usage.md"),
    Variable("PCCL_TRANSPORT", "`auto`, `mpi`, `torch`", "`auto`", "`init()` / process-group creation",
             "Whether pccl's levels are MPI communicators (`mpi`) or torch groups over the launcher's "
             "rendezvous store (`torch`); `auto` picks MPI when MPI's ranks are torch's.", "usage.md"),
    Variable("PCCL_WAIT", "`auto`, `blocking`, `bounded`", "`auto`", "communicator creation",
             "`blocking`: MPI's blocking collectives under a watchdog that aborts the job past the timeout; "
             "`bounded`: polled waits that raise `PcclTimeoutError`; `auto`: `blocking` where every rank has "
             "a core, else `bounded`.", "reliability.md"),
    Variable("PCCL_ASYNC", "`auto`, `thread`, `inline`", "`auto`", "communicator creation",
             "Where `async_op=True` calls run: the communicator's worker thread, or at once in the caller's "
             "thread (`auto`: inline where ranks share cores, for CPU tensors).", "reliability.md"),
    Variable("PCCL_DEBUG", "`off`, `check`", "`off`", "communicator creation (`init(check=)` overrides)",
             "`check`: the ranks compare a signature of every call before it runs and raise "
             "`PcclMismatchError` on a difference.", "reliability.md"),
    Variable("PCCL_FAILURE_SIGNAL", "`0`, `1`", "`1`", "`init()`",
             "`0` leaves `SIGUSR1` (mpiexec's failed-process notice) to the application instead of pccl.",
             "reliability.md"),
    Variable("PCCL_TRACE_BUFFER", "an integer >= 0", "`2000`", "communicator creation",
             "Calls the flight recorder keeps per communicator; `0` turns it off.", "reliability.md"),
    Variable("PCCL_TRACE_STACK", "`0`, `1`", "`0`", "communicator creation",
             "`1` records the Python stack that issued each call (every call then takes the full path).",
             "reliability.md"),
    Variable("PCCL_TRACE_DIR", "a folder", "`/tmp/pccl_trace`", "each dump",
             "Where each rank writes its flight-recorder dump `pccl_trace_rank_<rank>`.", "reliability.md"),
    Variable("PCCL_TRACE_SIGNAL", "a signal name, or `0`", "`SIGUSR2`", "communicator creation",
             "The signal that makes a rank dump its flight recorder; `0`: none.", "reliability.md"),
    Variable("PCCL_PIPELINE_CHUNKS", "an integer from 1 to 1024", "unset (1 MiB chunks, at most 32)",
             "first pipelined call",
             "Fixes the chunk count of the `hier:pipelined` schedules.", "algorithms.md"),
    Variable("PCCL_SCRATCH_BYTES", "a number of bytes, `0` or more", "`1073741824` (1 GiB)", "each call",
             "The most host memory one thread keeps for the schedules' temporaries, reused from call to call "
             "instead of page-faulted anew; `0` keeps none.", "algorithms.md"),
    Variable("PCCL_CUDA_AWARE_MPI", "`0`, `1`", "`0`", "each CUDA buffer handed to MPI",
             "`1` hands CUDA buffers to MPI directly instead of staging them through host memory "
             "(only for a CUDA-aware MPI build).", "gpus.md"),
    Variable("PCCL_KERNELS", "`auto`, `torch`, `triton`", "`auto`", "communicator creation (checked), each kernel call",
             "`auto`: on CUDA the path the measured dispatch table gives for the kernel, dtype and size, on CPU "
             "the torch reference (the Triton interpreter under `TRITON_INTERPRET=1`); `triton` forces compiled "
             "Triton (CUDA) or the interpreter, `torch` the torch reference.",
             "gpus.md"),
    Variable("PCCL_HOTPATH", "`on`, `off`", "`on`", "`import pccl_torch`",
             "`off` runs every call through the Python layers instead of the compiled hot path (a bound shape's "
             "later calls in C++, compiled at the first import into a per-environment cache; "
             "`python -m pccl_torch.hotpath.build` builds it ahead).",
             "architecture.md"),
    Variable("PCCL_MACHINES_DIR", "a directory", "unset", "`pccl-sim` / cost model",
             "Extra directory searched first for machine profiles (`NAME.yaml`).", "algorithms.md"),
)


def by_name() -> dict[str, Variable]:
    """The table keyed by variable name."""
    return {variable.name: variable for variable in VARIABLES}
