"""How a communicator waits and runs ``async_op`` calls: ``PCCL_WAIT`` and ``PCCL_ASYNC`` against the
machine's cores per rank, and the inline executor."""

from __future__ import annotations

import threading

import pytest
import torch

from pccl_torch.communicator import blocking_waits_from_env, threaded_async_from_env
from pccl_torch.topology import Topology
from pccl_torch.work import OrderedExecutor, Work

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
    executor = OrderedExecutor("t", inline=True)
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
    executor = OrderedExecutor("t")
    order: list[int] = []
    caller = threading.current_thread()
    futures = [executor.submit(lambda i=i: order.append(i) or threading.current_thread()) for i in range(20)]
    executor.drain()
    assert order == list(range(20)) and all(f.result() is not caller for f in futures)
    executor.shutdown()
