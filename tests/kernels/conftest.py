"""Kernel tests run the Triton kernels (the interpreter without a GPU) against their torch references."""

from __future__ import annotations

import pytest
import torch

from pccl_torch.triton_kernels import HAS_TRITON, use_backend

# Compiled kernels on a GPU when there is one; the interpreter on CPU tensors otherwise.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Weird sizes (STYLE.md): empty, one, odd, not multiples of any block size; 2^20 + 3 runs on fewer cases
# because the interpreter takes ~60 ms per Mi elements per operand (32 Ki-element programs, 2 cores).
WEIRD_SIZES = (0, 1, 9, 41, 341, 4231)
HUGE = (1 << 20) + 3
CHUNK_COUNTS = (1, 2, 3, 5, 8)


@pytest.fixture
def triton_backend():
    if not HAS_TRITON:
        pytest.fail("triton is not installed: `make test` installs the [triton] extra")
    previous = torch.get_default_device()
    torch.set_default_device(DEVICE)  # every tensor a test creates lives where the kernels run
    try:
        with use_backend("triton"):
            yield
    finally:
        torch.set_default_device(previous)
