"""``_permute_kernel``, ``_gather_kernel`` and ``_rotate_kernel`` against their torch references."""

from __future__ import annotations

import pytest
import torch

from pccl_torch.triton_kernels import gather_chunks, permute_blocks, rotate_

from .conftest import CHUNK_COUNTS, HUGE, WEIRD_SIZES

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.float64)


def source(numel: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(numel, dtype=torch.int64).remainder(30011).to(dtype)


@pytest.mark.parametrize("c", WEIRD_SIZES)
@pytest.mark.parametrize("b", CHUNK_COUNTS)
@pytest.mark.parametrize("a", CHUNK_COUNTS)
def test_permute_matches_transpose(triton_backend, a, b, c) -> None:
    src = source(a * b * c, torch.float32)
    dst = torch.full_like(src, -1)
    permute_blocks(src, dst, a, b, c)
    assert torch.equal(dst, src.view(a, b, c).transpose(0, 1).reshape(-1))
    back = torch.empty_like(src)
    permute_blocks(dst, back, b, a, c)  # the unpack is the inverse permutation
    assert torch.equal(back, src)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_permute_every_dtype_and_a_huge_buffer(triton_backend, dtype) -> None:
    for a, b, c in ((3, 5, 41), (2, 1, HUGE // 2)):
        src = source(a * b * c, dtype)
        dst = torch.empty_like(src)
        permute_blocks(src, dst, a, b, c)
        assert torch.equal(dst, src.view(a, b, c).transpose(0, 1).reshape(-1))


@pytest.mark.parametrize("chunk", WEIRD_SIZES)
@pytest.mark.parametrize("chunks", CHUNK_COUNTS)
def test_gather_chunks_by_index(triton_backend, chunks, chunk) -> None:
    src = source(chunks * chunk, torch.bfloat16)
    index = torch.tensor([(7 * i + 3) % chunks for i in range(chunks + 2)], dtype=torch.int64)  # repeats
    dst = torch.empty(index.numel() * chunk, dtype=src.dtype)
    gather_chunks(src, dst, index, chunk)
    expected = src.view(chunks, chunk)[index].reshape(-1) if chunk else dst
    assert torch.equal(dst, expected)


@pytest.mark.parametrize("numel", WEIRD_SIZES + (HUGE,))
@pytest.mark.parametrize("shift", (0, 1, -5, 4230, 10**9 + 7))
def test_rotate_matches_roll(triton_backend, numel, shift) -> None:
    src = source(numel, torch.int64)
    dst = torch.empty_like(src)
    rotate_(src, dst, shift)
    assert torch.equal(dst, torch.roll(src, shift))


def test_errors_are_clear() -> None:
    x = torch.zeros(6)
    with pytest.raises(ValueError, match="expected 8 input elements"):
        permute_blocks(x, torch.zeros(8), 2, 2, 2)
    with pytest.raises(ValueError, match="in place"):
        permute_blocks(x, x, 2, 3, 1)
    with pytest.raises(TypeError, match="dtypes differ"):
        rotate_(x, torch.zeros(6, dtype=torch.int32), 1)
    with pytest.raises(ValueError, match="contiguous"):
        permute_blocks(torch.zeros(3, 2).t(), torch.zeros(6), 2, 3, 1)
    with pytest.raises(IndexError, match=r"in \[0, 3\)"):
        gather_chunks(x, torch.zeros(4), torch.tensor([0, 3]), 2)
    with pytest.raises(TypeError, match="int64"):
        gather_chunks(x, torch.zeros(4), torch.tensor([0, 1], dtype=torch.int32), 2)
