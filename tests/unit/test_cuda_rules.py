"""The CUDA rules of issue 56, each where it is decidable: on CPU (static reads of the code, the queue's error routing
with a failing call, the delegated path's no-wait, capture refusal) and on a GPU (skipped here; the GPU check's
``rules-cuda`` section runs this file first). Every GPU test names the assertion that fails on the code before the
rule was built, and why.
"""

from __future__ import annotations

import ast
import concurrent.futures
import faulthandler
import threading
import time
from pathlib import Path

import pytest
import torch

from pccl_torch import cuda_streams
from pccl_torch.errors import CommunicatorBrokenError, PcclError, PcclMismatchError
from pccl_torch.work import Queue, Work, device_future

ROOT = Path(__file__).resolve().parents[2]
CUDA_PATH = [*sorted((ROOT / "pccl_torch").rglob("*.py")), *sorted((ROOT / "integrations").glob("*.py")),
             *sorted((ROOT / "triton_kernels").glob("*.py"))]
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU check runs it)")

HOST_WAITS = {
    ("pccl_torch/cuda_streams.py", "host_wait"): "the one helper: an event, allowed in sync-debug mode",
    ("pccl_torch/work.py", "wait"): "Work.wait(timeout=...) and the no-gate fallback: the caller asked the host",
    ("pccl_torch/work.py", "synchronize"): "Work.synchronize: torch's contract blocks the host",
    ("pccl_torch/transport/staging.py", "host"): "the last call's copies back out of pinned memory (worker)",
    ("pccl_torch/transport/staging.py", "run"): "per chunk: MPI reads the bytes the device copied to the host",
}
"""Every host wait for the device left in pccl (file, function): docs/gpus.md lists them with the same reasons."""


def _calls(path: Path):
    """(enclosing function name, call node) of every call in ``path``."""
    tree = ast.parse(path.read_text())
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, ast.Call):
                    yield function.name, node


def test_no_stream_of_torchs_pool_in_pccl() -> None:
    """Rule 1: pccl never calls ``torch.cuda.Stream(...)`` (one of 32 pool streams shared with NCCL, FSDP2 and the
    user); its streams come from ``cuda_streams.new_stream``."""
    found = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in CUDA_PATH for _, node in _calls(path)
             if ast.unparse(node.func) in ("torch.cuda.Stream", "cuda.Stream", "Stream")]
    assert not found, f"torch.cuda.Stream() in pccl's code: {found}"


def test_every_host_wait_is_one_of_the_named() -> None:
    """Rule 2: no ``Stream.synchronize``, ``torch.cuda.synchronize`` or ``Event.synchronize`` on a CUDA path but the
    named ones (each with why it cannot be a stream wait)."""
    found = set()
    for path in CUDA_PATH:
        for function, node in _calls(path):
            if isinstance(node.func, ast.Attribute) and node.func.attr == "synchronize":
                found.add((str(path.relative_to(ROOT)), function))
    unnamed, gone = sorted(found - set(HOST_WAITS)), sorted(set(HOST_WAITS) - found)
    assert not unnamed, f"host waits not named in HOST_WAITS (and docs/gpus.md): {unnamed}"
    assert not gone, f"HOST_WAITS names waits that are gone: {gone}"


class _Stream:
    """What the worker's part touches of its stream (``torch.cuda.stream`` is a no-op without CUDA)."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.waited: list[object] = []

    def wait_event(self, event: object) -> None:
        self.waited.append(event)


class _Gate:
    def __init__(self) -> None:
        self.opened: list[int] = []

    def open_after(self, stream: object, number: int) -> None:
        self.opened.append(number)


def _worker_part(queue: Queue, fn, output: torch.Tensor, gate: _Gate) -> concurrent.futures.Future:
    """Run ``fn`` as the worker runs a host-driven call's part (the real ``Queue._behind_gate`` on its thread)."""
    queue._worker_stream = _Stream()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pccl_torch.work.host_wait", lambda stream: None)
        future = queue.submit(lambda: queue._behind_gate(fn, "ready", gate, 7, output))
        concurrent.futures.wait([future])
    return future


def test_a_failed_worker_call_breaks_the_group_poisons_its_output_then_opens_its_gate() -> None:
    """Rule 3 (NCCL's async error handling): the failure is the group's; the output reads NaN, not a half-written
    result; the gate still opens; every later wait and call of the rank raises, on any thread."""
    queue = Queue("test", device=torch.device("cpu"))
    gate, output = _Gate(), torch.ones(5)

    def half_written() -> None:
        output[:2] = 3.0
        raise RuntimeError("MPI_ERR_OTHER on the inter-node level")

    future = _worker_part(queue, half_written, output, gate)
    assert isinstance(future.exception(), RuntimeError)
    assert gate.opened == [7], "the gate must open, or the device waits forever"
    assert torch.isnan(output).all(), output
    assert queue.failure is future.exception()
    earlier = Work(_done(None), "all_reduce", "hier:ring", end=object(), gated=True, queue=queue)
    errors: list[BaseException] = []
    other = threading.Thread(target=lambda: _catch(earlier.wait, errors))
    other.start()
    other.join()
    assert len(errors) == 1 and isinstance(errors[0], CommunicatorBrokenError), errors
    assert errors[0].__cause__ is queue.failure
    with pytest.raises(CommunicatorBrokenError, match="broken"):
        queue.issue(lambda: None, host_driven=True)
    queue.shutdown()


def test_a_mismatch_on_the_worker_breaks_the_group_but_leaves_the_buffer() -> None:
    """A mismatch is found before any data moves: the caller's buffer stays as given (never corrupted), the group
    is still broken (a consumer may already have read it as a result)."""
    queue = Queue("test", device=torch.device("cpu"))
    gate, output = _Gate(), torch.arange(4.0)

    def mismatch() -> None:
        raise PcclMismatchError("rank 1 called all_gather #3 with 8 elements, rank 0 with 4")

    _worker_part(queue, mismatch, output, gate)
    assert gate.opened == [7] and torch.equal(output, torch.arange(4.0))
    with pytest.raises(CommunicatorBrokenError):
        queue.raise_if_failed()
    queue.shutdown()


def test_a_successful_worker_call_opens_its_gate_and_leaves_the_group_sound() -> None:
    queue = Queue("test", device=torch.device("cpu"))
    gate, output = _Gate(), torch.zeros(3)
    future = _worker_part(queue, lambda: output.add_(2), output, gate)
    assert future.exception() is None and gate.opened == [7] and queue.failure is None
    assert queue._worker_stream.waited == ["ready"]
    queue.raise_if_failed()
    queue.shutdown()


def test_a_delegated_call_rerouted_to_the_busy_worker_returns_without_waiting(monkeypatch) -> None:
    """Rule 2 (enqueue and return): ``_in_group_order`` must not ask a queued future for its exception (that waits
    for the worker, i.e. for MPI). Fails before the fix: ``future.exception()`` blocked until the worker finished."""
    from pccl_torch.integrations import torch_backend

    queue = Queue("test", device=torch.device("cpu"))
    pending: concurrent.futures.Future = concurrent.futures.Future()  # still on the worker
    monkeypatch.setattr(queue, "issue", lambda fn, **_: (pending, object(), True))
    monkeypatch.setattr(torch_backend, "_as_work", lambda work, result, then=None: work)
    done = concurrent.futures.ThreadPoolExecutor(1).submit(
        torch_backend._in_group_order, queue, lambda: None, "result", torch.device("cuda", 0))
    try:
        work = done.result(timeout=5)
    except concurrent.futures.TimeoutError:
        pytest.fail("the delegated call waited on the host for the worker")
    finally:
        pending.set_result(None)
    assert isinstance(work, Work) and work.queue is queue


def test_a_host_driven_call_under_graph_capture_is_refused_by_name(monkeypatch) -> None:
    """Rule 7: a call the host drives (MPI) cannot be captured; refused before anything is queued, naming capture
    and the plan."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    queue = Queue("test", device=torch.device("cpu"))
    with pytest.raises(PcclError, match=r"CUDA graph.*all_gather \(plan hier:ring\)|all_gather \(plan hier:ring\).*CUDA graph"):
        queue.issue(lambda: None, host_driven=True, what="all_gather (plan hier:ring)")


def test_every_group_of_a_device_queues_its_host_driven_calls_on_one_thread_in_issue_order(monkeypatch) -> None:
    """Rule 6 (one order of NCCL enqueues a rank): two groups' host-driven calls run on the device's one worker, in
    issue order, and a group sees the device's worker busy with another group's call (so its own device-only calls
    follow it, rather than enqueueing NCCL beside it). Fails before: each group had its own worker (``b.busy``)."""
    from pccl_torch import work

    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)  # the worker's one call of CUDA, at start
    monkeypatch.setattr(work, "_DEVICE_WORKERS", {})
    cuda0 = torch.device("cuda", 0)
    a, b = Queue("a", device=cuda0), Queue("b", device=cuda0)
    release, seen = threading.Event(), []
    first = a.submit(lambda: (release.wait(5), seen.append(("a", threading.current_thread().name))))
    assert b.busy, "group b must see the device's worker busy with group a's call"
    second = b.submit(lambda: seen.append(("b", threading.current_thread().name)))
    release.set()
    concurrent.futures.wait([first, second])
    assert [group for group, _ in seen] == ["a", "b"] and seen[0][1] == seen[1][1], seen
    b.shutdown()
    assert not a.busy


def test_a_probe_pair_on_a_wrapped_nccl_group_is_batched() -> None:
    """Rule 8: ``new_group`` / ``new_subgroups_by_enumeration`` groups wrap their NCCL backend; the send/recv pair of
    a link probe must find it (as torch's abort does) and run as one NCCL group. Fails before: only a bare backend
    with ``_group_start`` was batched, and the wrapped one's pair went unbatched (two ranks sending first hang)."""
    from types import SimpleNamespace

    from pccl_torch.transport.torch_group import _nccl_backend

    nccl = SimpleNamespace(_group_start=lambda: None, _group_end=lambda: None)
    assert _nccl_backend(nccl) is nccl
    assert _nccl_backend(SimpleNamespace(_get_backend=lambda device: nccl)) is nccl

    def gloo_only(device: torch.device):
        raise RuntimeError(f"No backend type associated with device type {device.type}")

    assert _nccl_backend(SimpleNamespace(_get_backend=gloo_only)) is None


def _done(value: object) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(value)
    return future


def _catch(fn, errors: list[BaseException]) -> None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - collected for the assertion
        errors.append(exc)


# -- on a GPU (the GPU check's rules-cuda section) ------------------------------------------------------------
@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture
def hang_guard():
    """A device deadlock cannot be interrupted: dump every thread's stack and exit after 60 s instead of hanging."""
    faulthandler.dump_traceback_later(60, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@needs_gpu
def test_gpu_pccl_streams_are_its_own(device) -> None:
    """Fails before: the order and worker streams were ``torch.cuda.Stream()``, so one of 64 pool streams drawn
    here (both priorities) has the same handle (``assert not shared``)."""
    queue = Queue("test", device=device)
    x = torch.zeros(8, device=device)
    future, end, gated = queue.issue(lambda: x.add_(1), host_driven=True, tensors=(x,))
    Work(future, "all_reduce", "mpi", end=end, gated=gated, output=x, queue=queue).wait()
    mine = {queue.order_stream().cuda_stream, queue.worker_stream().cuda_stream}
    pool = {torch.cuda.Stream(device, priority=p).cuda_stream for p in (0, -1) for _ in range(32)}
    shared = mine & pool
    assert not shared and all(cuda_streams.owned(s) for s in (queue.order_stream(), queue.worker_stream()))
    queue.shutdown()


@needs_gpu
def test_gpu_host_driven_calls_with_futures_on_pool_streams_never_hang(device, hang_guard) -> None:
    """Fails before (a hang, ended by the guard with every stack): a device future took a pool stream per call and
    queued ``wait_event(end_k)`` on it; within 32 calls that stream was the worker's, ahead of gate k's write."""
    queue = Queue("test", device=device)
    x = torch.zeros(1024, device=device)
    for k in range(200):
        user = torch.cuda.Stream(device)  # the user's and torch's pool, drawn round-robin
        with torch.cuda.stream(user):
            future, end, gated = queue.issue(lambda: x.add_(1), host_driven=True, tensors=(x,))
            device_future(Work(future, "all_reduce", "mpi", end=end, gated=gated, output=x, queue=queue), x).wait()
    torch.cuda.current_stream(device).wait_stream(user)
    assert float(x[0]) == 200.0
    queue.shutdown()


@needs_gpu
def test_gpu_gate_works_in_sync_debug_error_mode(device) -> None:
    """Fails before: the gate's probe called ``Stream.synchronize()``, which raises in this mode; the gate was
    dropped for the process (``assert gated``)."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        queue = Queue("test", device=device)
        x = torch.full((256,), 2.0, device=device)
        future, end, gated = queue.issue(lambda: (time.sleep(0.05), x.mul_(3))[1], host_driven=True, tensors=(x,))
        Work(future, "all_reduce", "mpi", end=end, gated=gated, output=x, queue=queue).wait()
        assert gated, "the gate must work in sync-debug mode"
        concurrent.futures.wait([future])
        assert future.exception() is None, future.exception()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert bool((x == 6).all())
    queue.shutdown()


@needs_gpu
def test_gpu_failed_call_raises_at_the_next_wait_and_its_consumer_reads_nan(device) -> None:
    """Fails before: the Work waited at issue never raised (``pytest.raises`` of the second wait), the gate opened
    on the half-written output (``assert isnan``)."""
    queue = Queue("test", device=device)
    x = torch.ones(64, device=device)

    def fails() -> None:
        time.sleep(0.05)
        x[:8].fill_(5.0)
        raise RuntimeError("injected MPI failure")

    future, end, gated = queue.issue(fails, host_driven=True, tensors=(x,))
    work = Work(future, "all_reduce", "mpi", end=end, gated=gated, output=x, queue=queue)
    work.wait()  # at issue: nothing known yet, the stream waits
    consumer = x * 2
    concurrent.futures.wait([future])
    with pytest.raises((RuntimeError, CommunicatorBrokenError)):
        work.wait()
    with pytest.raises(CommunicatorBrokenError):
        Work(_done(None), "all_reduce", "mpi", end=end, gated=True, queue=queue).synchronize()
    end.synchronize()
    assert bool(torch.isnan(consumer).all()), consumer[:10]
    queue.shutdown()


@needs_gpu
def test_gpu_copy_out_buffer_is_kept_until_the_copies_ran(device) -> None:
    """Rule 5. Fails before (``device_future`` took a wait callable; with it, the flat buffer freed at return was
    handed to the caller's next allocation while the copy out was pending): the outputs read the 7s."""
    queue = Queue("test", device=device)
    outputs = [torch.zeros(1 << 16, device=device) for _ in range(2)]
    flat = torch.empty(2 << 16, device=device)
    flat_ptr = flat.data_ptr()
    future, end, gated = queue.issue(lambda: (time.sleep(0.1), flat.fill_(1.0))[1], host_driven=True,
                                     tensors=(flat,))

    def copy_out() -> None:
        for out, chunk in zip(outputs, flat.view(2, -1)):
            out.copy_(chunk)

    fut = device_future(Work(future, "all_gather", "mpi", end=end, gated=gated, output=flat, queue=queue), outputs,
                        copy_out)
    del flat, copy_out
    junk = torch.full((2 << 16,), 7.0, device=device)  # the caller's next allocation of the same size
    fut.wait()
    torch.cuda.synchronize(device)
    assert all(bool((out == 1).all()) for out in outputs), (junk.data_ptr() == flat_ptr, outputs[0][:4])
    queue.shutdown()


@needs_gpu
def test_gpu_capture_refuses_host_driven_and_captures_device_calls(device) -> None:
    """Rule 7. Fails before: no refusal (``pytest.raises``); the worker waited on a captured event."""
    queue = Queue("test", device=device)
    x = torch.zeros(16, device=device)
    queue.issue(lambda: x.add_(0), host_driven=False, tensors=(x,))  # the order stream exists before capture
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph):
            with pytest.raises(PcclError, match="CUDA graph"):
                queue.issue(lambda: x.add_(1), host_driven=True, tensors=(x,))
            future, end, gated = queue.issue(lambda: x.add_(1), host_driven=False, tensors=(x,))
            Work(future, "all_reduce", "vendor", end=end, gated=gated, output=x, queue=queue).wait()
    torch.cuda.current_stream(device).wait_stream(side)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize(device)
    assert float(x[0]) == 2.0, x[:4]
    queue.shutdown()
