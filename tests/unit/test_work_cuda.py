"""NCCL's contract in ``pccl_torch.work`` and ``calls.host_driven``: what a CPU run decides (which calls the worker
drives, when the worker may call MPI), and on a GPU (skipped here; ``scripts/gpu_check.sh`` runs this file) that a
CUDA call returns once enqueued and its wait orders streams."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from pccl_torch import communicator
from pccl_torch.calls import host_driven
from pccl_torch.plan import resolve
from pccl_torch.transport.mpi import MPITransport
from pccl_torch.work import HostGate, Queue, Work

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU check runs it)")


class _Level:
    """A level as ``host_driven`` sees it."""

    def __init__(self, host: bool) -> None:
        self.host_memory_only = host


def _layout(*, mpi_between: bool) -> SimpleNamespace:
    """A CUDA communicator's levels: torchrun's (NCCL everywhere) or mpiexec's (MPI between nodes and over all)."""
    nccl, mpi = _Level(False), _Level(True)
    between = mpi if mpi_between else nccl
    return SimpleNamespace(world=between, vendor=nccl, inter=between, device=torch.device("cuda", 0),
                           intra_level=lambda library: mpi if library == "mpi" else nccl)


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "all_reduce"])
def test_torchrun_levels_are_enqueued_by_the_caller(collective: str) -> None:
    """NCCL on every level: no plan needs the worker (a chain of NCCL calls, stream-ordered by construction)."""
    comm = _layout(mpi_between=False)
    for name in ("vendor", "mpi", "ring", "hier:ring", "hier:mpi", "hier-nccl:ring"):
        assert not host_driven(comm, resolve(collective, name)), name


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "all_reduce"])
def test_mpi_levels_are_driven_by_the_worker(collective: str) -> None:
    """MPI between nodes: every plan crossing it is the worker's; NCCL's own flat collective is not."""
    comm = _layout(mpi_between=True)
    assert not host_driven(comm, resolve(collective, "vendor"))
    for name in ("mpi", "ring", "hier:ring", "hier-nccl:mpi", "hier:pipelined"):
        assert host_driven(comm, resolve(collective, name)), name


def test_worker_calls_mpi_only_at_thread_multiple(monkeypatch) -> None:
    """Below MPI_THREAD_MULTIPLE async calls run in the caller's thread (the worker would call MPI beside it)."""
    from mpi4py import MPI

    levels = (object.__new__(MPITransport),)
    monkeypatch.setattr(MPI, "Query_thread", lambda: MPI.THREAD_SERIALIZED)
    assert not communicator.mpi_serves_threads(levels)
    assert communicator.mpi_serves_threads((_Level(False),))  # no MPI at all
    monkeypatch.setattr(MPI, "Query_thread", lambda: MPI.THREAD_MULTIPLE)
    assert communicator.mpi_serves_threads(levels)


def test_host_queue_is_fifo_and_leaves_streams_alone() -> None:
    queue = Queue("test", device=torch.device("cpu"))
    seen: list[int] = []
    futures = [queue.submit(lambda i=i: (time.sleep(0.001 * (3 - i)), seen.append(i))[1]) for i in range(3)]
    queue.drain()
    assert [f.done() for f in futures] == [True] * 3 and seen == [0, 1, 2]
    assert Work(futures[0], "all_reduce", "mpi").is_completed()
    queue.shutdown()


@needs_gpu
def test_cuda_call_returns_before_the_device_is_done_and_wait_orders_the_stream() -> None:
    """A device-level call behind a long kernel returns at once; its end follows that kernel; a wait from another
    stream orders that stream, not the host."""
    device = torch.device("cuda", torch.cuda.current_device())
    queue = Queue("test", device=device)
    x = torch.zeros(1 << 20, device=device)
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on the caller's stream
    start = time.perf_counter()
    future, end, gated = queue.issue(lambda: x.add_(1), host_driven=False)
    issued = time.perf_counter() - start
    assert gated and issued < 0.05 and not end.query()
    other = torch.cuda.Stream(device)
    with torch.cuda.stream(other):
        Work(future, "all_reduce", "vendor", end=end, output=x).wait()
        copy = x.clone()
    other.synchronize()
    assert bool((copy == 1).all())


@needs_gpu
def test_host_driven_call_opens_its_gate_behind_the_worker() -> None:
    """The worker's part runs after the issue event; the end waits for its gate (where the driver has one)."""
    device = torch.device("cuda", torch.cuda.current_device())
    queue = Queue("test", device=device)
    x = torch.zeros(1024, device=device)
    x.fill_(3)  # queued before the issue: the worker must see it
    future, end, gated = queue.issue(lambda: (time.sleep(0.05), x.mul_(2))[1], host_driven=True)
    assert gated == HostGate.available()
    Work(future, "all_reduce", "mpi", end=end, gated=gated, output=x).wait()
    assert bool((x == 6).all())
    queue.shutdown()


@needs_gpu
def test_device_call_behind_a_busy_worker_follows_it_without_blocking_the_host() -> None:
    """A device-library call issued while a host-driven one still runs on the worker is not a reason for the host
    to wait: it returns at once and runs after the earlier call, in the group's order."""
    device = torch.device("cuda", torch.cuda.current_device())
    queue = Queue("test", device=device)
    x = torch.ones(1024, device=device)
    slow, slow_end, slow_gated = queue.issue(lambda: (time.sleep(0.2), x.mul_(3))[1], host_driven=True)
    start = time.perf_counter()
    fast, fast_end, fast_gated = queue.issue(lambda: x.add_(1), host_driven=False)
    issued = time.perf_counter() - start
    if not slow_gated:  # the driver's stream memory operations absent or failing
        pytest.skip("no gate: the host waits for the worker by design")
    assert issued < 0.1, f"the issue waited {issued:.3f} s for the worker"
    Work(fast, "all_reduce", "vendor", end=fast_end, gated=fast_gated, output=x).wait()
    torch.cuda.current_stream(device).synchronize()
    assert bool((x == 4).all()), x[:4]  # (1 * 3) + 1: in issue order
    queue.shutdown()
