"""Faults under real mpiexec (4 ranks, 2 emulated nodes x 2): nothing hangs, nothing is left running, and
with PCCL_WAIT=bounded every surviving rank reports the clear error. One trial of each kind here; repeated trials of
one kind (what shows an intermittent hang) are the 10-trial series: ``python -m tests.multiprocess.faults``."""

from __future__ import annotations

import pytest

from .conftest import OPENMPI_PREFIX
from .faults import VICTIM, run_trial, ulfm_available

pytestmark = pytest.mark.multiprocess
needs_ulfm = pytest.mark.skipif(not ulfm_available(), reason=f"no Open MPI (ULFM) under {OPENMPI_PREFIX}: make ulfm")


def test_rank_that_never_calls_times_out_everywhere(tmp_path) -> None:
    outcome = run_trial("skip", tmp_path)
    assert outcome.ok, outcome.problems
    for rank in (0, 1, 2):
        assert "timed out after 3 s" in outcome.ranks[rank]["error"]
    assert "peers not heard from: [3]" in outcome.ranks[0]["error"]  # the ring's left neighbour of rank 0


@pytest.mark.parametrize("kind", ["skip", "kill"])
def test_blocking_waits_never_hang(tmp_path, kind) -> None:
    """PCCL_WAIT=blocking (the default where every rank has a core): MPI's blocking collective cannot time out, so the watchdog says what
    was stuck and aborts the job; nothing hangs and nothing is left running."""
    outcome = run_trial(kind, tmp_path, algorithm="mpi", wait="blocking")
    assert outcome.ok, outcome.problems


def test_mismatched_calls_are_reported_on_every_rank(tmp_path) -> None:
    outcome = run_trial("mismatch", tmp_path)
    assert outcome.ok, outcome.problems
    cases = {c["case"]: c["error"] for c in outcome.ranks[0]["trials"]}
    assert len(cases) == 12
    assert "split sizes disagree" in cases["all_to_all splits"] and "sends rank 0 3 elements" in \
        cases["all_to_all splits"] and "expects 2" in cases["all_to_all splits"]
    assert "fields that differ: numel" in cases["all_to_all sizes on one rank only"]
    assert "fields that differ: collective" in cases["collective"]
    assert "fields that differ: numel" in cases["numel"] and "numel=1000" in cases["numel"]
    assert "dtype=float16" in cases["dtype"] and "op=max" in cases["op"]
    assert "algorithm=ring" in cases["algorithm"]


def test_killed_rank_never_hangs_the_others(tmp_path) -> None:
    outcome = run_trial("kill", tmp_path)
    assert outcome.ok, outcome.problems


@needs_ulfm
@pytest.mark.parametrize("algorithm", [None, "hier:ring"])
def test_killed_rank_is_reported_by_every_survivor_under_ulfm(tmp_path, algorithm) -> None:
    """With a fault-tolerant MPI no survivor is torn down: each one says MPI reported the failure (or, in the
    intra-node gloo phase, times out), within the timeout + 10 s, and names the dead rank where MPI did."""
    outcome = run_trial("kill", tmp_path, mpi="ulfm", algorithm=algorithm)
    assert outcome.ok, outcome.problems
    assert not outcome.torn_down and sorted(outcome.ranks) == [0, 1, 2]
    assert any("MPI reported a failed process" in outcome.ranks[r]["error"] for r in (0, 1, 2))
    assert VICTIM not in outcome.ranks


@needs_ulfm
def test_rank_that_never_calls_times_out_under_ulfm(tmp_path) -> None:
    outcome = run_trial("skip", tmp_path, mpi="ulfm")
    assert outcome.ok, outcome.problems
