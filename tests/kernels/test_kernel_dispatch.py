"""The dispatch layer: which implementation runs (counted launches), and that the torch path gives the\nresults of references computed independently of the module."""

from __future__ import annotations

import pytest
import torch

from pccl_torch.ops import ReduceOp
from pccl_torch.triton_kernels import _backend, permute_blocks, reduce_, rotate_, use_backend

from .conftest import _count_launches


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
