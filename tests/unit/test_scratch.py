"""The schedules' reused host scratch (pccl_torch/scratch.py): kept per role and thread, grown, capped."""

from __future__ import annotations

import threading

import pytest
import torch

from pccl_torch import scratch

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(scratch.SCRATCH_ENV, raising=False)
    scratch.release()
    yield
    scratch.release()


def test_a_role_gets_the_same_memory_on_every_call():
    first = scratch.empty("a", 1000, torch.float32, CPU)
    first.fill_(7)
    again = scratch.empty("a", 1000, torch.float32, CPU)
    assert again.data_ptr() == first.data_ptr()
    assert again.shape == (1000,) and again.dtype == torch.float32
    assert torch.all(again == 7)  # contents are the last call's: sites that need zeros write them


def test_roles_do_not_share_memory():
    a = scratch.empty("a", 256, torch.float64, CPU)
    b = scratch.empty("b", 256, torch.float64, CPU)
    a_end, b_end = a.data_ptr() + a.numel() * 8, b.data_ptr() + b.numel() * 8
    assert a_end <= b.data_ptr() or b_end <= a.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8])
def test_a_kept_buffer_serves_other_dtypes_and_smaller_sizes(dtype):
    big = scratch.empty("a", 4096, torch.float64, CPU)
    small = scratch.empty("a", 33, dtype, CPU)
    assert small.dtype == dtype and small.numel() == 33
    assert small.data_ptr() == big.data_ptr()
    assert scratch.kept_bytes() == 4096 * 8


def test_a_larger_request_grows_the_role():
    scratch.empty("a", 10, torch.float32, CPU)
    grown = scratch.empty("a", 1000, torch.float32, CPU)
    assert grown.numel() == 1000
    assert scratch.kept_bytes() == 4000


def test_requests_past_the_limit_get_fresh_tensors(monkeypatch):
    monkeypatch.setenv(scratch.SCRATCH_ENV, "1000")
    kept = scratch.empty("a", 200, torch.float32, CPU)  # 800 bytes: kept
    over = scratch.empty("b", 100, torch.float32, CPU)  # 800 + 400 > 1000: fresh
    assert scratch.kept_bytes() == 800
    assert scratch.empty("a", 200, torch.float32, CPU).data_ptr() == kept.data_ptr()
    assert over.numel() == 100


def test_zero_keeps_nothing(monkeypatch):
    monkeypatch.setenv(scratch.SCRATCH_ENV, "0")
    assert scratch.empty("a", 100, torch.float32, CPU).numel() == 100
    assert scratch.kept_bytes() == 0


def test_an_empty_request_is_served():
    assert scratch.empty("a", 0, torch.float32, CPU).numel() == 0


@pytest.mark.parametrize("raw", ["-1", "lots", "1.5"])
def test_a_bad_limit_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(scratch.SCRATCH_ENV, raw)
    with pytest.raises(ValueError, match=rf"PCCL_SCRATCH_BYTES={raw!r}.*bytes >= 0"):
        scratch.empty("a", 10, torch.float32, CPU)


def test_device_tensors_are_not_kept():
    tensor = scratch.empty("a", 10, torch.float32, torch.device("meta"))
    assert tensor.device.type == "meta"
    assert scratch.kept_bytes() == 0


def test_threads_keep_their_own_buffers():
    mine = scratch.empty("a", 100, torch.float32, CPU)
    theirs: list[int] = []
    thread = threading.Thread(target=lambda: theirs.append(scratch.empty("a", 100, torch.float32, CPU).data_ptr()))
    thread.start()
    thread.join()
    assert theirs and theirs[0] != mine.data_ptr()


def test_empty_like_takes_the_tensors_shape_dtype_and_role_memory():
    model = torch.zeros(3, 4, dtype=torch.bfloat16)
    like = scratch.empty_like("a", model)
    assert like.shape == (3, 4) and like.dtype == torch.bfloat16 and like.device == model.device
    assert like.data_ptr() == scratch.empty("a", 12, torch.bfloat16, CPU).data_ptr()
