"""The flight recorder's ring and its dumps, without a launch: slots are reused in place, the newest calls are
kept, and a dump in pccl's format is read by torch's own loader and analyzer (``fr_trace``'s ``build_db``)."""

from __future__ import annotations

import argparse
import pickle
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.flight_recorder.components.builder import build_db
from torch.distributed.flight_recorder.components.loader import read_dir

from pccl_torch import flight_recorder, trace_dump, trace_report


def _call(collective: str = "all_reduce", numel: int = 1024, world: int = 2) -> SimpleNamespace:
    """A stand-in for ``calls.BoundCall``: what the recorder and the dump read of one."""
    plan = SimpleNamespace(collective=collective, name="hier:ring", hierarchical=True)
    return SimpleNamespace(plan=plan, dtype=torch.float32, nbytes=numel * 4, async_op=False,
                           comm=SimpleNamespace(topology=SimpleNamespace(world_size=world)))


def _recorder(rank: int, size: int = 8) -> flight_recorder.Recorder:
    """Rank ``rank``'s recorder of a 2-rank group, named as each rank's first communicator is."""
    recorder = flight_recorder.Recorder(size, rank, [0, 1], timeout_s=3.0)
    recorder.name = "0"
    return recorder


def test_ring_keeps_the_newest_calls_in_preallocated_slots() -> None:
    recorder = _recorder(0, size=3)
    slots = list(recorder.slots)
    call = _call()
    for seq in range(1, 6):
        recorder.begin(seq, call, float(seq), started=True).completed = seq + 0.5
    assert [r.seq for r in recorder.records()] == [3, 4, 5]
    assert all(a is b for a, b in zip(slots, recorder.slots))  # written in place, never replaced


def test_phase_is_marked_on_the_running_slot_of_its_own_thread_only() -> None:
    """A phase belongs to the call its thread runs: another thread's call (a group's worker beside the caller)
    never receives it."""
    import threading

    recorder = _recorder(0)
    slot = recorder.begin(1, _call(), 1.0, started=True)
    other = recorder.begin(2, _call(), 1.0, started=True)
    flight_recorder.running.slot = slot
    try:
        def on_other_thread() -> None:
            flight_recorder.running.slot = other
            flight_recorder.mark_phase("pccl:intra:reduce_scatter", 0)

        thread = threading.Thread(target=on_other_thread)
        thread.start()
        thread.join()
        flight_recorder.mark_phase("pccl:inter:all_gather", 2)
    finally:
        flight_recorder.running.slot = None
    flight_recorder.mark_phase("pccl:intra:all_gather")  # no call running: nothing to mark
    assert (slot.phase, slot.step) == ("pccl:inter:all_gather", 2)
    assert (other.phase, other.step) == ("pccl:intra:reduce_scatter", 0)


@pytest.mark.parametrize("value, error", [("x", "expected a number"), ("-1", "must be 0")])
def test_bad_buffer_size_is_refused(monkeypatch, value, error) -> None:
    monkeypatch.setenv(flight_recorder.BUFFER_ENV, value)
    with pytest.raises(ValueError, match=error):
        flight_recorder.buffer_size()


def _dumps(tmp_path, late_rank_calls: int) -> None:
    """Two ranks' dumps: rank 0 started call 3 and failed waiting for rank 1, which made only ``late_rank_calls``."""
    for rank, calls in ((0, 3), (1, late_rank_calls)):
        recorder = _recorder(rank)
        for seq in range(1, calls + 1):
            slot = recorder.begin(seq, _call(), float(seq), started=True)
            slot.completed = 0.0 if seq == 3 else seq + 0.5
        if rank == 0:
            recorder.failed(3, "timed out", (1,))
        data = trace_dump.snapshot("test", [recorder])
        (tmp_path / f"{trace_dump.PREFIX}{rank}").write_bytes(pickle.dumps(data))


def test_dump_is_read_by_torchs_analyzer(tmp_path) -> None:
    _dumps(tmp_path, late_rank_calls=2)
    args = argparse.Namespace(trace_dir=str(tmp_path), prefix=None, verbose=False, just_print_entries=False,
                              allow_incomplete_ranks=False, mismatch_cap=10, selected_ranks=None, pg_filters=None)
    details, version = read_dir(args)
    assert version == trace_dump.VERSION
    db = build_db(details, args, version)
    assert [c.collective_seq_id for c in db.collectives] == [1, 2, 3]
    assert db.collectives[-1].missing_ranks == {1}


def test_report_names_the_rank_behind_and_the_peer_waited_for(tmp_path) -> None:
    _dumps(tmp_path, late_rank_calls=2)
    text = trace_report.render(trace_report.analyse(trace_report.load(tmp_path)))
    assert "BEHIND: rank 1 never started call #3 (all_reduce #3, hier:ring)" in text
    assert "waiting for rank(s) [1]" in text


def test_report_refuses_a_folder_without_dumps(tmp_path) -> None:
    assert trace_report.main([str(tmp_path)]) == 2


class _Level:
    """A stand-in transport of 2 ranks whose transport rank 1 is communicator rank ``other``."""

    def __init__(self, other: int) -> None:
        self.other = other

    def others(self) -> list[int]:
        return [1]

    def communicator_ranks(self, peers: list[int]) -> list[int]:
        return [self.other if p == 1 else 0 for p in peers]


def test_a_wait_names_its_peers_in_the_launch_s_numbering_until_it_ends() -> None:
    """A transport's wait marks the running call's slot (``waiting_on``): a dump taken meanwhile names the peers,
    as the group's launch ranks, before any failure says so; once the wait is over (``waited``) it names none."""
    recorder = flight_recorder.Recorder(8, 0, [0, 5, 6, 7], timeout_s=3.0)
    slot = recorder.begin(1, _call(world=4), 1.0, started=True)
    flight_recorder.running.slot = slot
    try:
        flight_recorder.mark_phase("pccl:inter:all_gather")
        waiting = flight_recorder.waiting_on(_Level(other=2), (None,))  # a native collective: every other rank
        assert trace_dump.entry(recorder, recorder.records()[0])["pccl"]["peers"] == [6]
        flight_recorder.waited(waiting)
        assert trace_dump.entry(recorder, recorder.records()[0])["pccl"]["peers"] == []
        flight_recorder.waiting_on(_Level(other=1), [1, 1])  # a sendrecv with one neighbour both ways
    finally:
        flight_recorder.running.slot = None
    assert flight_recorder.waiting_on(_Level(other=1), [1]) is None  # no call running: nothing to mark
    assert trace_dump.entry(recorder, recorder.records()[0])["pccl"]["peers"] == [5]
    recorder.failed(1, "timed out", (3,))  # a failure's own peers come first
    assert trace_dump.entry(recorder, recorder.records()[0])["pccl"]["peers"] == [7]
    slot.completed = 2.0
    del recorder.failures[1]
    assert trace_dump.entry(recorder, recorder.records()[0])["pccl"]["peers"] == []  # a completed call waits for no one


def test_report_names_a_rank_waiting_for_one_that_left_no_dump(tmp_path) -> None:
    """A killed rank leaves no dump: the survivor waiting for it is named, with the rank it waits for."""
    recorder = _recorder(0)
    recorder.begin(1, _call(), 1.0, started=True).completed = 1.5
    slot = recorder.begin(2, _call(), 2.0, started=True)
    slot.phase = "pccl:inter:all_reduce"
    slot.peers, slot.level = (None,), _Level(other=1)
    (tmp_path / f"{trace_dump.PREFIX}0").write_bytes(pickle.dumps(trace_dump.snapshot("test", [recorder])))
    report = trace_report.analyse(trace_report.load(tmp_path))
    assert report["groups"]["0"]["no_dump"] == [1] and report["groups"]["0"]["waiting_on_no_dump"] == {0: [1]}
    text = trace_report.render(report)
    assert ("WAITING: rank 0 waits for rank(s) [1], which left no dump (killed or dead), in all_reduce #2, phase "
            "pccl:inter:all_reduce") in text
    assert "every rank that dumped reached the same call" in text
