"""The dispatch layer: which implementation runs, and that the torch path equals the references."""

from __future__ import annotations

import pytest
import torch

from pccl_torch.ops import ReduceOp
from pccl_torch.triton_kernels import _backend, permute_blocks, reduce_, rotate_, use_backend
from pccl_torch.triton_kernels.reduce import reduce_reference


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
def test_torch_path_matches_references(dtype) -> None:
    with use_backend("torch"):
        a = (torch.randn(41) * 4).to(dtype)
        b = (torch.randn(41) * 4).to(dtype)
        acc = a.clone()
        reduce_(acc, b, ReduceOp.SUM)
        assert torch.equal(acc, reduce_reference(torch.empty_like(a), [a, b], ReduceOp.SUM))
        dst = torch.empty(30, dtype=dtype)
        permute_blocks(a[:30], dst, 2, 3, 5)
        assert torch.equal(dst, a[:30].view(2, 3, 5).transpose(0, 1).reshape(-1))
        rotate_(a, acc, 7)
        assert torch.equal(acc, torch.roll(a, 7))
