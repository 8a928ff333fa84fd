"""``init(device=...)``: a device this machine cannot run is refused with a clear error before any collective."""

import pytest
import torch

import pccl_torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="sees no CUDA device here; use device='cpu'"):
        pccl_torch.init(device="cuda")
    assert not pccl_torch.is_initialized()
    pccl_torch.init()  # the same process can still start on CPU
    pccl_torch.shutdown()


def test_other_devices_are_refused() -> None:
    with pytest.raises(ValueError, match="runs on 'cpu' or 'cuda' tensors"):
        pccl_torch.init(device="meta")
    assert not pccl_torch.is_initialized()
