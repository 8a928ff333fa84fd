"""The flight recorder: a ring of each communicator's recent collectives, for the dumps a hang leaves behind.

Every collective a communicator runs, whichever way it was called (API, ``pccl`` backend, FSDP hooks, DeepSpeed),
passes ``pccl_torch.calls.BoundCall`` with its sequence number; there it is written into slot ``sequence % size``
of the communicator's :class:`Recorder`: the bound call (collective, dtype, sizes, plan), when it was scheduled,
started and completed, the phase of a hierarchical or pipelined plan it reached (:func:`mark_phase`, from
``pccl_torch.profiling``), the level and peers that phase is waiting for while it waits (:func:`waiting_on`, from
the transports' waits) and, with ``PCCL_TRACE_STACK=1``, the Python stack that issued it. The slots are
allocated once: a call writes a few attributes of an existing object and allocates nothing of its own. Calls the
compiled hot path runs (``pccl_torch.hotpath``) are written into a ring of C structs in its table instead, merged
here by sequence number (:meth:`Recorder.records`).

``PCCL_TRACE_BUFFER`` sets the slots per communicator (default :data:`DEFAULT_SIZE`; ``0`` turns recording off).
``pccl_torch.trace_dump`` writes the rings in torch's flight-recorder format.
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

from pccl_torch import environment

BUFFER_ENV = "PCCL_TRACE_BUFFER"
STACK_ENV = "PCCL_TRACE_STACK"
DEFAULT_SIZE = 2000
"""Slots per communicator when ``PCCL_TRACE_BUFFER`` is unset (torch's recorder keeps 2000 by default too)."""
STACK_LIMIT = 32
"""Frames kept of an issuing stack (``PCCL_TRACE_STACK=1``)."""


class _Running(threading.local):
    slot: Slot | None = None
    """None by default on every thread. Every transport wait reads it (:func:`waiting_on`), and a missing attribute
    of a ``threading.local`` raises inside ``getattr``: a wait's ``waiting_on`` and ``waited`` took 0.63 us that
    way on a thread that never ran a call with phases, 0.12 us with this default."""


running = _Running()
"""``running.slot``: the slot of the call whose phases run on this thread now (set by ``calls.BoundCall`` for plans
with phases). Per thread: a group's worker, another group's worker and the caller run calls at once, and each
phase belongs to the call of its own thread."""

_ids = itertools.count()
_live: weakref.WeakSet[Recorder] = weakref.WeakSet()


def buffer_size() -> int:
    """Slots per communicator from ``PCCL_TRACE_BUFFER`` (0: off); a clear error for a bad value."""
    return environment.count(BUFFER_ENV, DEFAULT_SIZE, "entries; must be 0 (off) or more")


def stacks_wanted() -> bool:
    """Whether ``PCCL_TRACE_STACK=1`` asks for the issuing Python stack of every call."""
    return environment.read(STACK_ENV) not in ("", "0")


class Slot:
    """One recorded call, overwritten in place by call ``seq + size``. Times are ``time.perf_counter()`` seconds
    (0.0: not reached); a phase, when one was reached, with its ``step`` (a pipelined chunk, else -1); while the
    phase waits on a transport, that ``level`` and the ``peers`` waited for (:func:`waiting_on`)."""

    __slots__ = ("seq", "call", "created", "started", "completed", "phase", "step", "level", "peers", "stack")

    def __init__(self) -> None:
        self.seq = 0
        self.call: Any = None
        self.created = 0.0
        self.started = 0.0
        self.completed = 0.0
        self.phase: str | None = None
        self.step = -1
        self.level: Any = None
        """The transport the call waits on now (None: not waiting, or the wait was not long enough to mark)."""
        self.peers: Sequence[int | None] = ()
        """Its transport ranks the wait is for (None: every other rank of the level)."""
        self.stack: list[traceback.FrameSummary] | None = None


class Record(NamedTuple):
    """A slot's content, copied out for a dump (a slot may be overwritten meanwhile)."""

    seq: int
    call: Any
    """The ``calls.BoundCall``: ``plan`` (``collective``, ``name``), ``dtype``, ``nbytes``."""
    created: float
    started: float
    completed: float
    phase: str | None
    step: int
    stack: list[traceback.FrameSummary] | None
    waiting: tuple[int, ...] = ()
    """The communicator ranks an unfinished call was waiting for when copied (:func:`waiting_on`; empty: none)."""


class Failure(NamedTuple):
    """Why a recorded call failed: the error's text and the peers it waited for (empty: unknown)."""

    message: str
    peers: tuple[int, ...]


class Recorder:
    """A communicator's ring of :data:`size` slots and what a dump says about the group it belongs to."""

    def __init__(self, size: int, rank: int, world_ranks: list[int], timeout_s: float,
                 stacks: bool = False) -> None:
        if size <= 0:
            raise ValueError(f"a recorder needs at least one slot, not {size}")
        self.size = size
        self.slots = [Slot() for _ in range(size)]
        self.stacks = stacks
        self.rank = rank
        """This process's rank in the group."""
        self.world_ranks = world_ranks
        """The group's ranks in the launch's numbering (``pg_config``'s ``ranks``)."""
        self.timeout_s = timeout_s
        self.name = str(next(_ids))
        """The group's name in dumps (torch's ``pg_id`` / ``process_group`` name): its creation order."""
        self.failures: dict[int, Failure] = {}
        """Failed calls by sequence number (written on the error path only)."""
        self.hot: Any = None
        """The hot path's table, whose own ring holds the calls it ran (None without it)."""
        self.clock = (time.time_ns(), time.perf_counter())
        """(epoch ns, perf_counter s) at one instant: converts recorded times to torch's epoch nanoseconds."""
        _live.add(self)

    def begin(self, seq: int, call: Any, now: float, started: bool) -> Slot:
        """Write call ``seq`` of ``call`` into its slot as scheduled at ``now`` (and started, with ``started``):
        the path of calls that are not the plain blocking one, which ``calls.BoundCall`` writes inline."""
        slot = self.slots[seq % self.size]
        slot.seq = seq
        slot.call = call
        slot.created = now
        slot.started = now if started else 0.0
        slot.completed = 0.0
        slot.phase = None
        slot.level = None
        slot.stack = traceback.extract_stack(limit=STACK_LIMIT)[:-2] if self.stacks else None
        return slot

    def failed(self, seq: int, message: str, peers: tuple[int, ...] = ()) -> None:
        """Remember why call ``seq`` failed (kept for the dump; the error path only)."""
        self.failures[seq] = Failure(message, tuple(peers))

    def records(self) -> list[Record]:
        """Every call still in the rings (this one's and the hot path's), oldest first: the last :attr:`size`."""
        found = {slot.seq: Record(slot.seq, slot.call, slot.created, slot.started, slot.completed, slot.phase,
                                  slot.step, slot.stack, _waiting_for(slot))
                 for slot in list(self.slots) if slot.seq > 0 and slot.call is not None}
        if self.hot is not None:
            for seq, call, started, completed in self.hot.trace():
                if seq not in found or found[seq].started < started:
                    found[seq] = Record(seq, call, started, started, completed, None, -1, None)
        return [found[seq] for seq in sorted(found)[-self.size:]]

    def epoch_ns(self, seconds: float) -> int:
        """A recorded ``perf_counter`` time as nanoseconds since the epoch (0 stays 0: not reached)."""
        if not seconds:
            return 0
        epoch, perf = self.clock
        return epoch + int((seconds - perf) * 1e9)


def mark_phase(name: str, step: int = -1) -> None:
    """Record that the running call reached phase ``name`` (``pccl:inter:all_gather``...), chunk ``step`` of a
    pipelined plan: three attribute writes, for ``pccl_torch.profiling`` to call on every phase."""
    slot = running.slot
    if slot is not None:
        slot.phase = name
        slot.step = step
        slot.level = None  # waiting for no one yet


def waiting_on(level: Any, peers: Sequence[int | None]) -> Slot | None:
    """Record that the running call now waits on transport ``level`` for ``peers`` (its transport ranks; None:
    every other rank of the level), and return its slot for :func:`waited` (None: no call with phases running).
    The transports call it where a wait cannot finish at once (an MPI request not done at its first test, a
    blocking native collective, a torch group's work), so a dump taken while a rank hangs names who it waits for,
    before any timeout or failure says so. Two attribute writes; the caller's ``peers``, not a copy."""
    slot = running.slot
    if slot is not None:
        slot.peers = peers
        slot.level = level
    return slot


def waited(slot: Slot | None) -> None:
    """The wait :func:`waiting_on` recorded on ``slot`` is over (a failed wait keeps its mark for the dump)."""
    if slot is not None:
        slot.level = None


def _waiting_for(slot: Slot) -> tuple[int, ...]:
    """The communicator ranks ``slot``'s unfinished call waits for (empty: none marked, or it completed)."""
    level, peers = slot.level, slot.peers
    if level is None or slot.completed:
        return ()
    ranks = [rank for peer in peers for rank in (level.others() if peer is None else [peer])]
    return tuple(sorted(set(level.communicator_ranks(ranks))))


def live() -> list[Recorder]:
    """The recorders of every live communicator, oldest first."""
    return sorted(_live, key=lambda recorder: int(recorder.name))
