"""pccl's collectives in torch.profiler (``pccl_torch.profiling``) in one process, a world of one: every call is a
``pccl:<collective>`` range with its arguments (inside torch's ``record_param_comms`` where the extension is
built), the phases of a two-level call nest in it, an async call's range is on the worker thread, the ranges
recorded from Python say the same as the extension's, and with no profiler nothing is recorded (the phases are
one shared empty context). The real layouts, the hot path and the backend: ``tests/multiprocess/test_profiler.py``."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.profiler import profile

import pccl_torch as pc
from pccl_torch import hotpath, profiling

ARGS = ("collective", "bytes", "dtype", "algorithm", "group_size", "rank", "seq", "async_op")
"""What a call's range says."""


@pytest.fixture
def comm(monkeypatch):
    monkeypatch.setenv("PCCL_ASYNC", "thread")  # async calls on the worker thread
    created = pc.init()
    yield created
    pc.shutdown()


def _calls(events) -> list:
    return [e for e in events if e.name.startswith("pccl:") and "collective" in e.kwinputs]


def test_with_no_profiler_the_phases_are_one_empty_context_and_nothing_is_recorded() -> None:
    data = torch.ones(4)
    assert not profiling.recording()
    assert profiling.phase("pccl:pack", data) is profiling.phase("pccl:unpack", data)
    with profiling.call_ranges("all_reduce", torch.float32, 16, "ring", 1, 0, 1, False):
        pass  # no profiler: opening and closing a call's ranges records nothing and raises nothing


def test_every_route_is_a_range_with_its_arguments_and_phases(comm) -> None:
    x, out, part = torch.ones(64), torch.empty(64), torch.empty(64)
    pc.all_reduce(x)  # a bound shape before profiling, as in a training loop
    with profile(record_shapes=True) as prof:
        pc.all_reduce(x)
        pc.all_gather_into_tensor(out, x, algorithm="hier:ring")
        pc.reduce_scatter_tensor(part, x, algorithm="ring", async_op=True).wait()
    calls = _calls(prof.events())
    carried = hotpath.available  # without the extension the worker thread's calls are not recorded
    assert [(e.name, e.kwinputs["algorithm"], e.kwinputs["async_op"]) for e in calls] == [
        ("pccl:all_reduce", "mpi", False), ("pccl:all_gather", "hier:ring", False),
        *([("pccl:reduce_scatter", "ring", True)] if carried else [])]
    for e in calls:
        assert set(e.kwinputs) == set(ARGS), e.kwinputs
        assert e.kwinputs["bytes"] == 256 and e.kwinputs["dtype"] == "float32", e.kwinputs
        assert e.kwinputs["group_size"] == 1 and e.kwinputs["rank"] == 0, e.kwinputs
    assert len({e.kwinputs["seq"] for e in calls}) == len(calls)
    gather = calls[1]
    phases = [e.name for e in prof.events() if e.cpu_parent is gather and e.name.startswith("pccl:")]
    assert phases == ["pccl:inter:all_gather", "pccl:intra:all_gather", "pccl:unpack"], phases
    if carried:  # the async call on the worker thread; torch's event of the call's parameters around pccl's range
        assert calls[0].thread == calls[1].thread != calls[2].thread
        for e in calls:
            parent = e.cpu_parent
            assert parent is not None and parent.name == "record_param_comms", (e.name, parent)


def test_ranges_recorded_from_python_say_what_the_extension_s_say(monkeypatch) -> None:
    def record() -> dict:
        with profile(record_shapes=True) as prof:
            with profiling.call_ranges("all_gather", torch.bfloat16, 48, "hier:ring", 4, 1, 7, True):
                pass
        (event,) = _calls(prof.events())
        return {"name": event.name, **event.kwinputs}

    want = {"name": "pccl:all_gather", "collective": "all_gather", "bytes": 48, "dtype": "bfloat16",
            "algorithm": "hier:ring", "group_size": 4, "rank": 1, "seq": 7, "async_op": True}
    if hotpath.available:
        assert record() == want
    monkeypatch.setattr(profiling, "_extension", lambda: None)
    assert record() == want


def test_a_work_item_carries_the_caller_s_profiler_to_another_thread(monkeypatch) -> None:
    def work() -> None:
        with profiling.phase("pccl:pack", torch.ones(2)):
            pass

    with profile() as prof:
        carried = profiling.carried(work)
        thread = threading.Thread(target=carried)
        thread.start()
        thread.join()
    recorded = [e for e in prof.events() if e.name == "pccl:pack"]
    assert len(recorded) == (1 if hotpath.available else 0)
    monkeypatch.setattr(profiling, "_extension", lambda: None)
    assert profiling.carried(work) is work  # without the extension: the work item as it is
