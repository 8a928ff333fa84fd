"""The CUDA rules of issue 56, each where it is decidable: on CPU (static reads of the code, the queue's error routing
with a failing call, the delegated path's no-wait, capture refusal) and on a GPU (skipped here; the GPU check's
``rules-cuda`` section runs this file first). Every GPU test names the assertion that fails on the code before the
rule was built, and why.
"""

from __future__ import annotations

import ast
import concurrent.futures
import faulthandler
import functools
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pccl_torch import cuda_streams
from pccl_torch.errors import CommunicatorBrokenError, PcclError, PcclMismatchError
from pccl_torch.transport.base import Transport
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


# -- Memory (item 5): the worker never allocates, nor frees, device memory behind a closed gate ------------------
WORKER_PATH = [*sorted((ROOT / "pccl_torch" / "algorithms").glob("*.py")),
               *sorted((ROOT / "pccl_torch" / "compression").glob("*.py")),
               *(ROOT / "pccl_torch" / name for name in ("calls.py", "plan.py", "scratch.py")),
               *(ROOT / "pccl_torch" / "transport" / name
                 for name in ("base.py", "mpi.py", "staging.py", "torch_group.py")),
               *(ROOT / "triton_kernels" / name for name in ("reduce.py", "pack.py", "planes.py", "quantize.py"))]
"""What a worker runs for a host-driven call: the plans' schedules, their transports and kernels."""
NOT_RESERVED = {
    ("pccl_torch/transport/mpi.py", "_typed"): "host tensors only: MPI's float32 copy of a 16-bit host buffer",
    ("pccl_torch/plan.py", "_announce"): "a compressed all-to-all's byte counts, on the control device (MPI: the host)",
    ("triton_kernels/pack.py", "gather_chunks"): "no plan uses it",
    **{(f"pccl_torch/compression/{name}", "*"): "compressed plans' codec buffers (pccl_torch.workspace, docs/gpus.md)"
       for name in ("formats.py", "schedules.py", "pipelined.py")},
    **{(f"triton_kernels/{name}", "*"): "the codecs of compressed plans" for name in ("planes.py", "quantize.py")},
}
"""Device allocations a worker may still make, each with why (``pccl_torch/workspace.py`` and docs/gpus.md)."""
_FACTORIES = {"empty", "zeros", "ones", "full", "tensor", "empty_strided", "arange", "rand", "randn", "randint"}
_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like"}
_JOINS = {"cat", "concat", "stack"}
_COPIES = {"clone", "contiguous", "to", "float", "half", "bfloat16", "double", "cuda", "new_empty", "new_zeros",
           "new_ones", "new_full", "new_tensor"}


def _allocations(path: Path):
    """(innermost function, call) of every call in ``path`` that may make a tensor on a device: a factory given a
    ``device=``, a ``*_like``, a join without ``out=``, a copying method. Triton kernels (``@triton.jit``) are
    device code, not calls of torch."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not any("jit" in ast.unparse(d) for d in child.decorator_list):
                    visit(child, child.name)
                continue
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                name, owner = child.func.attr, ast.unparse(child.func.value)
                keywords = {k.arg for k in child.keywords}
                if (owner == "torch" and ((name in _FACTORIES and "device" in keywords) or name in _LIKE or
                                          (name in _JOINS and "out" not in keywords))) or \
                        (owner not in ("torch", "tl") and name in _COPIES):
                    found.append((function, child))
            visit(child, function)

    visit(ast.parse(path.read_text()), "<module>")
    return found


def test_the_worker_path_allocates_device_memory_only_from_the_calls_workspace() -> None:
    """Item 5 (static): every device temporary of a plan's schedules, transports and kernels comes from
    ``scratch`` / ``workspace`` (the call's workspace on a worker), none from a torch factory, a ``*_like``, a join
    or a copying method, but the named ones. Fails before: ``calls.py``'s ``empty_like`` and ``clone``, native
    all-gather's ``clone``, ``staging.transfer``'s ``.to``, ``scratch.empty``'s ``torch.empty(device=...)``, the
    all-to-all's count tensors, ``pipelined.staged``'s ``.to`` and the 16-bit reduce reference's ``.float()``."""
    found = []
    for path in WORKER_PATH:
        where = str(path.relative_to(ROOT))
        for function, node in _allocations(path):
            if (where, function) not in NOT_RESERVED and (where, "*") not in NOT_RESERVED:
                found.append(f"{where}:{node.lineno} {function}: {ast.unparse(node)}")
    assert not found, "device allocations on the worker path outside the call's workspace:\n" + "\n".join(found)


class _Unguarded:
    """A transport whose calls run outside the allocation guard (the threads that stand in for MPI and NCCL
    copy what they carry; the real libraries do not allocate torch tensors)."""

    def __init__(self, transport) -> None:
        self._transport = transport

    def __getattr__(self, name: str):
        from torch.utils._python_dispatch import _disable_current_modes

        value = getattr(self._transport, name)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            with _disable_current_modes():
                return value(*args, **kwargs)

        return call


class _Levels:
    """What a plan and a call's body read of a communicator, over in-process transports (CPU tensors)."""

    def __init__(self, world, intra, inter, rank: int, size: int) -> None:
        self.world = self.vendor = _Unguarded(world)
        self.inter, self._intra = _Unguarded(inter), _Unguarded(intra)
        self.topology = SimpleNamespace(rank=rank, world_size=size)
        self.device = torch.device("cpu")
        self.check = False

    def intra_level(self, library: str | None):
        return self._intra


def _new_storages():
    """A dispatch mode (this thread only) that lists every op whose output has storage none of its inputs had."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class NewStorages(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.made: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            out = func(*args, **kwargs)
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage().data_ptr() not in given:
                    self.made.append(f"{func} -> {tuple(t.shape)} {t.dtype}")
            return out

    return NewStorages()


def _bodies(collective: str, plan, levels: _Levels, p: int, n: int, dtype: torch.dtype):
    """(body, a, b) of one call: the call layer's body (``pccl_torch.calls``) and its tensors (``n`` a rank's
    block); reductions with PREMUL_SUM's pre-scale and AVG's division, which take temporaries of their own."""
    from pccl_torch import calls
    from pccl_torch.ops import Reduction, ReduceOp

    g = torch.Generator().manual_seed(levels.topology.rank)
    data = torch.randint(-4, 5, (p * n,), generator=g).to(dtype)
    if collective == "all_gather":
        body = calls.all_gather_body(levels, plan, p * n * dtype.itemsize, False)
        return body, torch.empty(p * n, dtype=dtype), data[:n]
    if collective == "reduce_scatter":
        premul = Reduction(ReduceOp.PREMUL_SUM, ReduceOp.SUM, pre_scale=0.5)
        return (calls.reduce_scatter_body(levels, plan, premul, dtype, p * n * dtype.itemsize, False),
                torch.empty(n, dtype=dtype), data)
    if collective == "all_reduce":
        avg = Reduction(ReduceOp.AVG, ReduceOp.SUM, divide_by_world=True)
        return calls.all_reduce_body(levels, plan, avg, dtype, (p * n + 1) * dtype.itemsize, False), \
            torch.cat([data, data[:1]]), None  # an odd length: the hierarchy pads its shards
    return calls.all_to_all_body(levels, plan, p * n, p * n * dtype.itemsize), torch.empty(p * n, dtype=dtype), data


def _cuda_plans():
    """Every distinct uncompressed plan a CUDA call can name but the pipelined one (its temporaries are host
    memory there: staged once, only the lanes are the device's), with the collective."""
    from pccl_torch.plan import PIPELINED, names_for

    return [(c, name) for c in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
            for name in names_for(c, "cuda") if not name.endswith(PIPELINED)]


@pytest.mark.parametrize("collective,name", _cuda_plans(), ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_plan_takes_its_temporaries_from_the_workspace_its_issue_reserved(collective: str, name: str,
                                                                                 dtype: torch.dtype) -> None:
    """Item 5 (dynamic): each plan's call body, run as a worker runs it (its workspace served, sized by
    ``calls.workspace_need`` as the issuing thread sizes it) on 2 nodes x 2 ranks and 3 x 1 of CPU threads, makes
    no tensor storage of its own but from that workspace, never runs out of it, and reserves at most one rank's
    block more than the busiest rank took. Fails before: there was no workspace to reserve."""
    from pccl_torch import calls, workspace
    from pccl_torch.plan import resolve
    from pccl_torch.transport import ThreadedWorld

    plan = resolve(collective, name)
    for nodes, local in ((2, 2), (3, 1)):
        p, n = nodes * local, 5
        intra = [ThreadedWorld(local) for _ in range(nodes)]
        inter = [ThreadedWorld(nodes) for _ in range(local)]
        world = ThreadedWorld(p)
        used, made, reserved = [0] * p, [], []

        def rank(_t, g: int) -> None:
            levels = _Levels(world.transports[g], intra[g // local].transports[g % local],
                             inter[g % local].transports[g // local], g, p)
            body, a, b = _bodies(collective, plan, levels, p, n, dtype)
            nbytes = (a if collective != "reduce_scatter" else b).numel() * dtype.itemsize
            need = calls.workspace_need(levels, plan, body, nbytes, dtype)
            space = workspace.Workspace(need, torch.device("cpu"))
            guard = _new_storages()
            with workspace.serving(space), guard:
                body(a, b)
            used[g] = space.used
            made.extend(guard.made)
            reserved.append(sum(workspace.aligned(t) for t in need.takes))

        world.run(rank, [(g,) for g in range(p)])
        assert not made, f"{name} {collective} made tensors outside its workspace on a worker: {made}"
        block = workspace.aligned(n * dtype.itemsize) * 2
        assert max(reserved) <= max(used) + block, (name, collective, reserved, used)


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "all_reduce"])
def test_a_compressed_plan_allocates_what_its_workspace_does_not_count(collective: str) -> None:
    """The named exception: a compressed plan that is not pipelined reserves its lanes only (``Need.complete``
    False); on a worker its temporaries past them are allocated where it runs, never a ``WorkspaceExhausted``."""
    from pccl_torch import calls, workspace
    from pccl_torch.plan import resolve
    from pccl_torch.transport import ThreadedWorld

    plan, nodes, local = resolve(collective, "hier:ring").compressed("int8"), 2, 2
    p, n = nodes * local, 300
    intra, inter = [ThreadedWorld(local) for _ in range(nodes)], [ThreadedWorld(nodes) for _ in range(local)]
    world = ThreadedWorld(p)

    def rank(_t, g: int) -> None:
        levels = _Levels(world.transports[g], intra[g // local].transports[g % local],
                         inter[g % local].transports[g // local], g, p)
        body, a, b = _bodies(collective, plan, levels, p, n, torch.float32)
        nbytes = (a if collective != "reduce_scatter" else b).numel() * 4
        need = calls.workspace_need(levels, plan, body, nbytes, torch.float32)
        assert not need.complete
        with workspace.serving(workspace.Workspace(need, torch.device("cpu"))):
            body(a, b)

    world.run(rank, [(g,) for g in range(p)])


def test_a_worker_serves_its_calls_workspace_and_the_issuing_thread_frees_it() -> None:
    """Item 5: the worker's part runs with the workspace reserved at issue served, and drops nothing of the call's
    (its workspace, the caller's tensors): an issuing thread lets go of them once the call is done, so that the
    worker never frees device memory (which takes the caching allocator's lock). Fails before: ``_behind_gate``
    took no workspace."""
    import weakref

    from pccl_torch import workspace

    queue = Queue("test", device=torch.device("cpu"))
    space = workspace.Workspace(workspace.Need((64,), 256), torch.device("cpu"))
    seen: list[object] = []
    queue._worker_stream = _Stream()

    def fn() -> None:
        seen.append(workspace.current())
        seen.append(workspace.empty(16, torch.float32, torch.device("cpu")).untyped_storage().data_ptr())

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pccl_torch.work.host_wait", lambda stream: None)
        part = functools.partial(queue._behind_gate, fn, "ready", _Gate(), 7, None, space)
        future = queue.submit(part)
        queue._hold(future, part)
        concurrent.futures.wait([future])
    assert future.exception() is None and seen[0] is space and seen[1] == space.memory.untyped_storage().data_ptr()
    assert workspace.current() is None
    gone = weakref.ref(space)
    del space, part, seen[:]
    time.sleep(0.05)  # the worker thread is done with its work item
    assert gone() is not None, "the worker let go of the call's workspace: it may not free device memory"
    queue._release_done()
    assert gone() is None, "the issuing thread keeps the workspace of a finished call"
    queue.shutdown()


def test_lane_pieces_cover_every_element_once() -> None:
    """The pieces a copy goes through a lane in (``staging._pieces``): whole rows where they fit, else pieces of a
    row; every element once, in matching places of both views."""
    from pccl_torch.transport.staging import _pieces

    for rows, width, room in ((1, 10, 3), (3, 4, 4), (3, 4, 9), (5, 7, 2), (2, 0, 1), (4, 6, 100)):
        source = torch.arange(rows * (width + 2)).view(rows, width + 2)[:, 1:1 + width]  # strided, as a chunk
        target = torch.full((rows, width), -1)
        for src, dst in _pieces(source, target, room):
            assert src.numel() <= room and src.shape == dst.shape
            dst.copy_(src)
        assert torch.equal(target, source), (rows, width, room)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_a_16_bit_reduction_through_small_lanes_is_bitwise_the_same(dtype: torch.dtype) -> None:
    """The 16-bit reduce reference accumulates in float32 lanes piece by piece on a worker: element-wise, so
    bitwise what one float32 temporary gave."""
    from pccl_torch import workspace
    from pccl_torch.ops import ReduceOp
    from pccl_torch.triton_kernels.reduce import reduce_reference

    g = torch.Generator().manual_seed(3)
    inputs = [torch.randn(1000, generator=g).to(dtype) for _ in range(3)]
    expected = reduce_reference(torch.empty_like(inputs[0]), inputs, ReduceOp.SUM, scale=0.3)
    space = workspace.Workspace(workspace.Need((), 256), torch.device("cpu"))  # 64 float32 a piece
    with workspace.serving(space):
        got = reduce_reference(torch.empty_like(inputs[0]), inputs, ReduceOp.SUM, scale=0.3)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))


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


class _Self(Transport):
    """One rank alone, allocation-free: each collective a copy (what MPI and NCCL do at one rank), so that what a
    worker allocates on the GPU is pccl's own. ``host``: a level that needs host memory, as MPI, which cannot
    reduce 16-bit floats."""

    name = "self"

    def __init__(self, host: bool = False) -> None:
        self._rank, self._size, self.host_memory_only = 0, 1, host

    def reduces(self, dtype: torch.dtype) -> bool:
        return not (self.host_memory_only and dtype in (torch.float16, torch.bfloat16))

    def send(self, tensor, dest):
        raise AssertionError("one rank sends nothing")

    recv = sendrecv = send

    def native_all_gather(self, out, inp):
        out.copy_(inp)

    def native_reduce_scatter(self, out, inp, op):
        out.copy_(inp)

    def native_all_reduce(self, tensor, op):
        pass

    def native_all_to_all(self, out, inp, send_counts, recv_counts):
        out.copy_(inp)

    def start_all_gather(self, out, inp):
        self.native_all_gather(out, inp)

    def start_reduce_scatter(self, out, inp, op):
        self.native_reduce_scatter(out, inp, op)

    def start_all_reduce(self, tensor, op):
        pass

    def wait(self, request, what):
        pass


def _alone(device: torch.device, host_inter: bool = False) -> SimpleNamespace:
    """The levels of a communicator of one rank on ``device`` (a call's body reads these)."""
    world, inter, intra = _Self(), _Self(host_inter), _Self()
    return SimpleNamespace(world=world, vendor=world, inter=inter, intra_level=lambda library: intra,
                           topology=SimpleNamespace(rank=0, world_size=1), device=device, check=False)


def _gpu_calls(device: torch.device):
    """(label, worker part, its need, check) of host-driven calls whose schedules take temporaries: the
    hierarchical phases and inter-node schedules, PREMUL_SUM's pre-scale copy, AVG's 16-bit division (lanes),
    the pipelined plan's float32 staging (lanes) and the MPI transport's staged chunks of strided 16-bit rows
    (lanes, piece by piece)."""
    from pccl_torch import calls, workspace
    from pccl_torch.ops import ReduceOp, Reduction
    from pccl_torch.plan import resolve

    avg = Reduction(ReduceOp.AVG, ReduceOp.SUM, divide_by_world=True)
    premul = Reduction(ReduceOp.PREMUL_SUM, ReduceOp.SUM, pre_scale=0.5)
    x = torch.arange(1001, device=device).to(torch.bfloat16)
    found = []
    for name, host in (("hier:ring", False), ("rabenseifner", False), ("hier:pipelined", True)):
        levels, buf = _alone(device, host), x.clone()
        body = calls.all_reduce_body(levels, resolve("all_reduce", name), avg, buf.dtype, buf.numel() * 2, False)
        found.append((f"all_reduce {name}", functools.partial(body, buf, None),
                      calls.workspace_need(levels, resolve("all_reduce", name), body, buf.numel() * 2, buf.dtype),
                      functools.partial(torch.equal, buf, x)))
    levels, out, inp = _alone(device), torch.empty(1000, device=device), torch.randn(1000, device=device)
    plan = resolve("all_gather", "hier:bruck")
    body = calls.all_gather_body(levels, plan, 4000, False)
    found.append(("all_gather hier:bruck", functools.partial(body, out, inp),
                  calls.workspace_need(levels, plan, body, 4000, out.dtype), functools.partial(torch.equal, out, inp)))
    plan = resolve("reduce_scatter", "hier:recursive_halving")
    out = torch.empty(1001, dtype=torch.bfloat16, device=device)
    body = calls.reduce_scatter_body(levels, plan, premul, out.dtype, 2002, False)
    found.append(("reduce_scatter hier:recursive_halving", functools.partial(body, out, x),
                  calls.workspace_need(levels, plan, body, 2002, out.dtype),
                  lambda: torch.equal(out, (x.float() * 0.5).to(torch.bfloat16))))
    mpi = pytest.importorskip("pccl_torch.transport.mpi")
    transport = mpi.MPITransport(mpi.MPI.COMM_SELF)
    transport.staging.chunk_bytes = 64  # chunks of a few columns of every row: strided views, as at scale
    rows, back = x[:999].view(3, 333), torch.empty(3, 333, dtype=torch.bfloat16, device=device)
    found.append(("MPI staging of strided 16-bit rows as float32",
                  lambda: transport._staged(rows, back, (3, 3), torch.float32, lambda o, i: o.copy_(i)),
                  workspace.Need((), 256), lambda: torch.equal(back, rows)))
    return found


def _device_allocations(device: torch.device) -> int:
    return torch.cuda.memory_stats(device)["allocation.all.allocated"]


@needs_gpu
def test_gpu_host_driven_calls_allocate_nothing_on_the_worker(device) -> None:
    """Item 5: a worker running host-driven calls' parts (behind their gates) makes no allocation of the caching
    allocator: every temporary is in the workspace its issuing thread reserved. Fails before: ``Queue.issue`` took
    no ``need`` and the schedules' ``torch.empty`` / ``empty_like`` / ``clone`` / ``.to`` ran on the worker
    (``assert made == [0]``)."""
    queue = Queue("test", device=device)
    for label, run, need, check in _gpu_calls(device):
        made: list[int] = []

        def part(run=run, made=made) -> None:
            before = _device_allocations(device)
            run()
            made.append(_device_allocations(device) - before)

        future, end, gated = queue.issue(part, host_driven=True, need=need)
        concurrent.futures.wait([future])
        assert future.exception() is None, (label, future.exception())
        end.synchronize()
        assert made == [0], f"{label}: {made} allocations on the worker behind its gate"
        assert check(), label
    queue.shutdown()


@needs_gpu
def test_gpu_memory_pressure_with_a_closed_gate_never_hangs(device, hang_guard) -> None:
    """Item 5 (finding 6): the caller frees a buffer an earlier call marked on the order stream while a host-driven
    call's gate is closed, then allocates under a memory cap: the caching allocator's retry waits, holding its
    lock, for that free event behind the gate. The worker must finish the call without the allocator (its
    temporaries reserved at issue, nothing freed) and open the gate. Fails before (a hang, ended by the guard with
    every stack): the worker's ``torch.empty`` waited for the lock held by the retry that waited for its gate."""
    from pccl_torch import calls
    from pccl_torch.ops import ReduceOp, Reduction
    from pccl_torch.plan import resolve

    queue = Queue("test", device=device)
    levels, x = _alone(device), torch.arange(1 << 20, device=device).to(torch.bfloat16)  # 2 MiB
    plan = resolve("all_reduce", "hier:ring")
    body = calls.all_reduce_body(levels, plan, Reduction(ReduceOp.AVG, ReduceOp.SUM, divide_by_world=True),
                                 x.dtype, x.numel() * 2, False)
    need = calls.workspace_need(levels, plan, body, x.numel() * 2, x.dtype)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # no free cached block the allocation below could take instead
    y = torch.empty(64 << 20, dtype=torch.uint8, device=device)
    future, end, gated = queue.issue(lambda: y.fill_(1), host_driven=True, tensors=(y,))
    concurrent.futures.wait([future])
    end.synchronize()
    started = threading.Event()

    def part() -> None:
        started.set()
        time.sleep(0.5)  # the gate stays closed while the caller frees y and allocates under the cap
        body(x, None)

    future, end, gated = queue.issue(part, host_driven=True, tensors=(x,), need=need)
    assert gated and started.wait(10)
    del y  # its free event on the order stream, behind the closed gate
    total = torch.cuda.get_device_properties(device).total_memory
    try:
        cap = torch.cuda.memory_reserved(device) + (1 << 20)  # no room for 64 MiB more but y's, once freed
        torch.cuda.set_per_process_memory_fraction(cap / total, device)
        z = torch.empty(64 << 20, dtype=torch.uint8, device=device)  # the retry: waits for y's event, the gate
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    concurrent.futures.wait([future])
    assert future.exception() is None, future.exception()
    Work(future, "all_reduce", "hier:ring", end=end, gated=gated, output=x, queue=queue).wait()
    assert torch.equal(x, torch.arange(1 << 20, device=device).to(torch.bfloat16)) and z.numel() == 64 << 20
    queue.shutdown()
