"""The dispatch layer: which implementation runs (counted launches), and that the torch path gives the\nresults of references computed independently of the module."""

from __future__ import annotations

import importlib

import pytest
import torch

from pccl_torch.ops import ReduceOp
from pccl_torch.triton_kernels import _backend, permute_blocks, reduce_, rotate_, use_backend

from .conftest import KERNEL_MODULES, _count_launches


def test_backend_choice(monkeypatch) -> None:
    cpu = torch.zeros(1)
    with use_backend("torch"):
        assert not _backend.wants_triton(cpu)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with use_backend("auto"):
        assert _backend.wants_triton(cpu) == _backend.HAS_TRITON
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with use_backend("auto"):
        assert not _backend.wants_triton(cpu)
    if _backend.HAS_TRITON:
        with use_backend("triton"), pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            _backend.wants_triton(cpu)


def test_bad_backend_names_are_rejected(monkeypatch) -> None:
    with pytest.raises(ValueError, match="expected one of auto, torch, triton"):
        with use_backend("cuda"):
            pass
    monkeypatch.setenv("PCCL_KERNELS", "fast")
    with pytest.raises(ValueError, match="PCCL_KERNELS='fast'"):
        _backend.current_backend()


def test_use_backend_applies_to_other_threads() -> None:
    import threading

    seen = []
    with use_backend("triton"):
        t = threading.Thread(target=lambda: seen.append(_backend.current_backend()))
        t.start()
        t.join()
    assert seen == ["triton"]


def test_launch_limit_error_is_clear() -> None:
    with pytest.raises(ValueError, match="cannot launch reduce"):
        _backend.grid_for(2**62, 2, "reduce")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_torch_path_matches_independent_references(dtype, monkeypatch) -> None:
    """The torch path against references computed here, not by the module under test: the sum of two
    values rounded once (float64 holds every sum of two float32/bf16 values exactly), transpose, roll. And
    no Triton kernel is launched on this path."""
    launches = _count_launches(monkeypatch)
    with use_backend("torch"):
        g = torch.Generator().manual_seed(7)
        a = (torch.randn(41, generator=g) * 4).to(dtype)
        b = (torch.randn(41, generator=g) * 4).to(dtype)
        acc = a.clone()
        reduce_(acc, b, ReduceOp.SUM)
        exact = (a.to(torch.float64) + b.to(torch.float64)) if dtype.is_floating_point else a + b
        assert torch.equal(acc, exact.to(dtype))
        assert not torch.equal(acc, a)  # b was not all zeros: the check can fail
        dst = torch.empty(30, dtype=dtype)
        permute_blocks(a[:30], dst, 2, 3, 5)
        expected = torch.stack([a[(i * 3 + j) * 5:(i * 3 + j + 1) * 5] for j in range(3) for i in range(2)])
        assert torch.equal(dst, expected.reshape(-1))
        rotate_(a, acc, 7)
        assert torch.equal(acc, torch.cat([a[-7:], a[:-7]]))
    assert launches.total == 0, launches.by_module


def test_triton_path_launches_kernels(triton_backend) -> None:
    """The same calls on the Triton backend launch one kernel each (the interpreter without a GPU)."""
    a, b = torch.arange(41, dtype=torch.float32), torch.ones(41)
    reduce_(a, b, ReduceOp.SUM)
    permute_blocks(a[:30].clone(), torch.empty(30), 2, 3, 5)
    rotate_(a.clone(), torch.empty(41), 7)
    assert torch.equal(a, torch.arange(41, dtype=torch.float32) + 1)
    assert triton_backend.by_module == {"reduce": 1, "pack": 2}, triton_backend.by_module


# -- the measured dispatch table (CUDA) ------------------------------------------------------------------------
K, M = 1 << 10, 1 << 20
#: The 2026-12-04 H200 run (gpu-runs/2026-12-04): (bytes, Triton us, torch reference us) by kernel and dtype.
#: bench_kernels (one call timed to completion, median of 20) for reduce/permute/rotate; wire_bench.py (CUDA
#: events over 20 calls) for the wire kernels. Each dtype stands for its class (float32: full, bfloat16: half).
MEASURED_2026_12_04 = {
    ("reduce_2", torch.float32): ((64 * K, 65.4, 22.2), (256 * K, 68.2, 22.3), (1 * M, 62.0, 22.6),
                                  (4 * M, 65.7, 22.2), (16 * M, 66.2, 22.8), (64 * M, 104.9, 65.4),
                                  (256 * M, 263.0, 211.2)),
    ("reduce_2", torch.bfloat16): ((64 * K, 62.7, 58.4), (256 * K, 78.9, 67.7), (1 * M, 167.4, 66.1),
                                   (4 * M, 62.7, 61.9), (16 * M, 61.4, 104.9), (64 * M, 99.9, 361.4),
                                   (256 * M, 238.9, 1344.7)),
    ("reduce_8", torch.float32): ((64 * K, 74.7, 74.7), (256 * K, 77.7, 79.8), (1 * M, 68.4, 80.5),
                                  (4 * M, 70.8, 78.9), (16 * M, 103.3, 95.7), (64 * M, 213.8, 374.0),
                                  (256 * M, 658.7, 1369.9)),
    ("reduce_8", torch.bfloat16): ((64 * K, 89.0, 209.7), (256 * K, 85.0, 220.8), (1 * M, 73.9, 208.6),
                                   (4 * M, 69.8, 196.4), (16 * M, 95.1, 429.5), (64 * M, 198.3, 1531.0),
                                   (256 * M, 602.3, 5863.5)),
    ("permute", torch.float32): ((64 * K, 70.1, 47.7), (256 * K, 73.0, 48.4), (1 * M, 67.9, 48.4),
                                 (4 * M, 71.1, 47.0), (16 * M, 94.2, 47.9), (64 * M, 232.9, 88.0),
                                 (256 * M, 742.4, 251.4)),
    ("permute", torch.bfloat16): ((64 * K, 79.6, 48.8), (256 * K, 74.9, 46.7), (1 * M, 61.7, 44.8),
                                  (4 * M, 67.7, 44.2), (16 * M, 121.9, 49.0), (64 * M, 353.4, 117.7),
                                  (256 * M, 1260.9, 363.2)),
    ("rotate", torch.float32): ((64 * K, 51.7, 52.7), (256 * K, 47.6, 52.2), (1 * M, 46.9, 50.3),
                                (4 * M, 44.7, 60.6), (16 * M, 43.8, 62.0), (64 * M, 75.1, 73.8),
                                (256 * M, 179.6, 169.1)),
    ("rotate", torch.bfloat16): ((64 * K, 58.2, 54.1), (256 * K, 53.4, 53.9), (1 * M, 44.4, 55.4),
                                 (4 * M, 44.0, 57.2), (16 * M, 47.3, 58.6), (64 * M, 88.3, 70.0),
                                 (256 * M, 231.3, 152.8)),
    ("quantize", torch.float32): ((1 * M, 31.1, 159.2), (16 * M, 19.2, 154.3), (64 * M, 24.0, 306.8),
                                  (256 * M, 80.9, 944.1)),
    ("dequantize", torch.float32): ((1 * M, 31.8, 51.9), (16 * M, 20.3, 58.7), (64 * M, 24.7, 170.9),
                                    (256 * M, 88.1, 605.4)),
    ("dequantize_acc", torch.float32): ((1 * M, 30.1, 67.7), (16 * M, 21.0, 72.7), (64 * M, 40.9, 225.3),
                                        (256 * M, 150.9, 797.9)),
    ("split_planes", torch.float32): ((1 * M, 37.0, 26.0), (16 * M, 23.2, 31.2), (64 * M, 62.9, 147.8),
                                      (256 * M, 237.2, 563.6)),
    ("merge_planes", torch.float32): ((1 * M, 24.0, 26.5), (16 * M, 24.4, 31.5), (64 * M, 55.1, 161.9),
                                      (256 * M, 207.0, 618.3)),
}
# The permute kernel measured above was replaced by the tiled one, not yet measured: the table runs torch
# there (and the old kernel's measurements still say torch).


class FakeCudaTensor:
    """What ``wants_triton`` reads of a CUDA tensor, for the CUDA branch on a machine without a GPU."""

    is_cuda = True
    device = torch.device("cuda")

    def __init__(self, numel: int, dtype: torch.dtype) -> None:
        self.dtype, self._numel = dtype, numel

    def numel(self) -> int:
        return self._numel

    def element_size(self) -> int:
        return torch.empty(0, dtype=self.dtype).element_size()


@pytest.mark.parametrize("kernel,dtype", list(MEASURED_2026_12_04), ids=lambda v: str(v))
def test_route_never_takes_the_path_measured_slower(kernel, dtype) -> None:
    """At every size of the 2026-12-04 run, ``auto`` on CUDA picks the path that was faster (ties: torch)."""
    for nbytes, triton_us, torch_us in MEASURED_2026_12_04[(kernel, dtype)]:
        faster = "triton" if triton_us < torch_us else "torch"
        assert _backend.route(kernel, dtype, nbytes, "cuda") == faster, (kernel, dtype, nbytes)
        with use_backend("auto"):
            assert not _backend.HAS_TRITON or _backend.wants_triton(FakeCudaTensor(nbytes // (4 if dtype == torch.float32 else 2), dtype),
                                         kernel) == (faster == "triton")


def test_route_is_a_pure_function_of_kernel_dtype_size_and_device() -> None:
    """Every rank making the same call takes the same path: the answer depends on nothing else (no state, no
    timing), and dtypes of one class share their answer."""
    sizes = [0, 1, 4 * K - 1, 128 * K, 8 * M - 1, 8 * M, 32 * M, 1 << 40]
    first = {(k, d, n): _backend.route(k, d, n, "cuda")
             for k in _backend.KERNELS for d in (torch.float32, torch.bfloat16, torch.int64) for n in sizes}
    for (k, d, n), path in first.items():
        assert _backend.route(k, d, n, "cuda") == path
        assert _backend.route(k, d, n, "cpu") == "torch"
    for k in _backend.KERNELS:
        for n in sizes:
            assert _backend.route(k, torch.float16, n, "cuda") == first[(k, torch.bfloat16, n)]
            assert _backend.route(k, torch.float64, n, "cuda") == first[(k, torch.int64, n)]
    assert first[("reduce_2", torch.float32, 32 * M)] == "torch"  # a sample of the seeds
    assert first[("quantize", torch.bfloat16, 1)] == "triton"


@pytest.mark.skipif(not _backend.HAS_TRITON, reason="needs triton")
def test_forced_backend_overrides_the_table(monkeypatch) -> None:
    """PCCL_KERNELS=triton runs Triton where the table says torch, =torch runs torch where it says Triton:
    how the benchmark measures both paths."""
    slow_on_triton = FakeCudaTensor(M, torch.float32)  # reduce_2 float32: torch at every size
    fast_on_triton = FakeCudaTensor(M, torch.bfloat16)  # reduce_8 bfloat16: Triton at every size
    for env, expected in (("auto", (False, True)), ("triton", (True, True)), ("torch", (False, False))):
        monkeypatch.setenv("PCCL_KERNELS", env)
        assert (_backend.wants_triton(slow_on_triton, "reduce_2"),
                _backend.wants_triton(fast_on_triton, "reduce_8")) == expected, env
    monkeypatch.setenv("PCCL_KERNELS", "auto")
    assert _backend.wants_triton(slow_on_triton)  # no kernel named: whether Triton can run there at all


def test_routes_and_names_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown kernel 'reduce'"):
        _backend.route("reduce", torch.float32, 1, "cuda")
    with pytest.raises(ValueError, match="unknown kernel 'permut'"):
        _backend.wants_triton(torch.zeros(1), "permut")
    with pytest.raises(ValueError, match="unknown dtype class"):
        _backend.Route(kernel="rotate", dtypes="fp32")
    with pytest.raises(ValueError, match="start < stop"):
        _backend.Route(kernel="rotate", dtypes="full", start=8, stop=8)
    assert all(r.measured for r in _backend.ROUTES), "every row says which measurement put it there"


def test_every_kernel_call_names_a_routed_kernel(monkeypatch) -> None:
    """The names the kernel modules pass are the table's (a typo would route to torch silently on CUDA)."""
    seen = []
    real = _backend.wants_triton

    def spy(tensor, kernel=None, nbytes=None):
        seen.append(kernel)
        return real(tensor, kernel, nbytes)

    for name in KERNEL_MODULES:
        monkeypatch.setattr(importlib.import_module(f"pccl_torch.triton_kernels.{name}"), "wants_triton", spy)
    from pccl_torch.triton_kernels import (dequantize, gather_chunks, merge_planes, pack_window, quantize as encode,
                                           reduce_n, split_planes, unpack_window)
    from pccl_torch.triton_kernels.quantize import blocks_of

    with use_backend("torch"):
        x = torch.arange(12, dtype=torch.float32)
        reduce_(x.clone(), x, ReduceOp.SUM)
        reduce_n(x.clone(), [x, x, x], ReduceOp.SUM)
        permute_blocks(x, torch.empty(12), 2, 3, 2)
        pack_window(x, torch.empty(6), 2, 3, 2, 1, 1)
        unpack_window(torch.empty(6), x.clone(), 2, 3, 2, 1, 1)
        rotate_(x, torch.empty(12), 5)
        gather_chunks(x, torch.empty(4), torch.tensor([1, 0]), 2)
        q, am = torch.empty(12, dtype=torch.int8), torch.empty(blocks_of(12))
        encode(x, q, am)
        dequantize(q, am, torch.empty(12))
        dequantize(q, am, x.clone(), accumulate=ReduceOp.SUM)
        top, rest = torch.empty(12, dtype=torch.uint8), torch.empty(36, dtype=torch.uint8)
        split_planes(x, top, rest)
        merge_planes(top, rest, torch.empty(12))
    assert set(seen) == set(_backend.KERNELS), set(_backend.KERNELS) ^ set(seen)
