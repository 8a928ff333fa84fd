"""How a communicator waits and runs ``async_op`` calls: ``PCCL_WAIT`` and ``PCCL_ASYNC`` against the
machine's cores per rank, and the inline executor."""

from __future__ import annotations

import threading

import pytest
import torch

from pccl_torch.communicator import blocking_waits_from_env, threaded_async_from_env
from pccl_torch.topology import Topology
from pccl_torch.work import Queue, Work

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
SHARED = Topology(0, 4, 2, cpu_ranks=4, cores=2)      # 4 ranks on 2 cores: the local demo, the testbed
ONE_EACH = Topology(0, 4, 2, cpu_ranks=4, cores=4)    # a core per rank, none spare
SPARE = Topology(0, 4, 2, cpu_ranks=4, cores=16)      # cores to spare (a GPU node's host CPU)


def test_cores_per_rank_counts_every_rank_on_the_machine() -> None:
    assert SHARED.cores_per_rank == 0.5 and SPARE.cores_per_rank == 4
    assert SHARED.ranks_share_cores and not ONE_EACH.ranks_share_cores and not SPARE.ranks_share_cores
    assert Topology(0, 2, 1).cpu_ranks == 1 and Topology(0, 2, 1).cores >= 1


@pytest.mark.parametrize("value,topology,blocking", [
    ("", SHARED, False), ("", ONE_EACH, True), ("auto", SPARE, True), ("AUTO", SHARED, False),
    ("blocking", SHARED, True), ("bounded", SPARE, False), (" bounded ", ONE_EACH, False)])
def test_wait_mode_follows_cores_per_rank_unless_set(monkeypatch, value, topology, blocking) -> None:
    monkeypatch.setenv("PCCL_WAIT", value)
    assert blocking_waits_from_env(topology) is blocking


@pytest.mark.parametrize("value,topology,device,threaded", [
    ("", SHARED, CPU, False), ("", ONE_EACH, CPU, False), ("", SPARE, CPU, True), ("", SHARED, CUDA, True),
    ("thread", SHARED, CPU, True), ("inline", SPARE, CUDA, False), ("auto", SPARE, CPU, True)])
def test_async_mode_follows_device_and_spare_cores_unless_set(monkeypatch, value, topology, device,
                                                              threaded) -> None:
    monkeypatch.setenv("PCCL_ASYNC", value)
    assert threaded_async_from_env(topology, device) is threaded


@pytest.mark.parametrize("name,check", [("PCCL_WAIT", lambda: blocking_waits_from_env(SHARED)),
                                        ("PCCL_ASYNC", lambda: threaded_async_from_env(SHARED, CPU))])
def test_unknown_modes_are_rejected_with_the_valid_ones(monkeypatch, name, check) -> None:
    monkeypatch.setenv(name, "spin")
    with pytest.raises(ValueError, match=rf"{name}='spin' is not a valid mode; expected one of auto, "):
        check()


def test_inline_executor_runs_in_the_caller_and_keeps_errors_for_wait() -> None:
    executor = Queue("t", inline=True)
    ran_in: list[threading.Thread] = []
    done = executor.submit(lambda: ran_in.append(threading.current_thread()) or 7)
    assert ran_in == [threading.current_thread()] and done.done() and done.result() == 7

    def fails() -> None:
        raise RuntimeError("peer gone")

    work = Work(executor.submit(fails), "all_reduce", "mpi")
    assert work.is_completed() and not work.is_success()
    with pytest.raises(RuntimeError, match="peer gone"):
        work.wait()
    executor.drain()
    executor.shutdown()


def test_threaded_executor_keeps_issue_order_off_the_caller() -> None:
    executor = Queue("t")
    order: list[int] = []
    caller = threading.current_thread()
    futures = [executor.submit(lambda i=i: order.append(i) or threading.current_thread()) for i in range(20)]
    executor.drain()
    assert order == list(range(20)) and all(f.result() is not caller for f in futures)
    executor.shutdown()


def test_polled_waits_spin_for_a_multiple_of_the_fastest_recent_wait_of_their_kind() -> None:
    from mpi4py import MPI

    from pccl_torch.transport import mpi as tm

    transport = tm.MPITransport(MPI.COMM_SELF)
    transport.spin_s = tm.SHARED_CORES_SPIN_S
    small, large = ("MPI's native all-reduce", 10), ("MPI's native all-reduce", 21)
    assert transport._spin_for(large) == tm.SHARED_CORES_SPIN_S  # nothing seen yet: the machine's spin
    transport._learn(large, 0.001)
    assert transport._spin_for(large) == pytest.approx(tm.SPIN_FACTOR * 0.001)
    assert transport._spin_for(small) == tm.SHARED_CORES_SPIN_S  # each size class learns its own
    transport._learn(large, 0.5)  # one wait for a late peer barely moves it
    assert transport._spin_for(large) == pytest.approx(tm.SPIN_FACTOR * 0.001 * tm._TYPICAL_RISE)
    for _ in range(80):  # a lasting slow-down is followed, up to the cap
        transport._learn(large, 0.5)
    assert transport._spin_for(large) == tm.MAX_SPIN_S
    transport._learn(small, 1e-6)  # never below the machine's spin
    assert transport._spin_for(small) == tm.SHARED_CORES_SPIN_S
    transport.spin_s = tm.SPIN_S  # a core per rank: the long spin stays
    assert transport._spin_for(large) == tm.SPIN_S


@pytest.mark.parametrize("what", ["MPI's native all-to-all", "compressed all-to-all"])
def test_all_to_all_waits_yield_for_at_most_a_millisecond_where_cores_are_shared(what: str) -> None:
    from mpi4py import MPI

    from pccl_torch.transport import mpi as tm

    transport = tm.MPITransport(MPI.COMM_SELF)
    transport.spin_s = tm.SHARED_CORES_SPIN_S
    key, other = (what, 21), ("MPI's native all-gather", 21)
    for _ in range(80):  # waits of 5 ms: twice that is past both caps
        transport._learn(key, 0.005)
        transport._learn(other, 0.005)
    assert transport._spin_for(key) == tm.ALL_TO_ALL_MAX_SPIN_S == 0.001
    assert transport._spin_for(other) == tm.MAX_SPIN_S
    transport.spin_s = tm.SPIN_S
    assert transport._spin_for(key) == tm.SPIN_S  # a core per rank: unchanged


def test_a_completed_wait_teaches_its_kind() -> None:
    from mpi4py import MPI

    from pccl_torch.transport import mpi as tm

    transport = tm.MPITransport(MPI.COMM_SELF)
    received = torch.empty(256)
    transport.sendrecv(torch.ones(256), 0, received, 0)  # 1 KiB each way
    assert received.eq(1).all()
    [(key, seconds)] = transport._typical.items()
    assert key == ("exchange with", (2 * 1024).bit_length()) and 0 <= seconds < 1
