"""pack_window / unpack_window (one column window of the block transpose) against plain torch slicing,
on the torch path and the Triton interpreter, over dtypes, weird shapes and windows."""

from __future__ import annotations

import pytest
import torch

from pccl_torch.triton_kernels import pack_window, permute_blocks, unpack_window, use_backend


@pytest.fixture(params=["torch", "triton"])
def backend(request):
    """Each case on the torch reference path and on the Triton kernel (compiled on a GPU, else interpreted)."""
    if request.param == "torch":
        with use_backend("torch"):
            yield
    else:
        yield request.getfixturevalue("triton_backend")

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8]
# (a, b, c, start, width): whole blocks, a middle window, the last column, empty windows and grids.
GRIDS = [(2, 2, 9, 0, 9), (2, 3, 41, 5, 17), (3, 2, 341, 340, 1), (1, 5, 37, 0, 0), (0, 2, 4, 1, 2),
         (5, 1, 4231, 1000, 3231), (2, 2, 1, 0, 1)]


def _source(numel: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(numel).to(dtype) if not dtype.is_floating_point else torch.randn(numel).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("a,b,c,start,width", GRIDS)
def test_pack_window_matches_slicing(backend, dtype: torch.dtype, a: int, b: int, c: int, start: int,
                                     width: int) -> None:
    src = _source(a * b * c, dtype)
    before = src.clone()
    dst = torch.full((a * b * width,), 7, dtype=dtype)
    pack_window(src, dst, a, b, c, start, width)
    expected = src.view(a, b, c)[:, :, start:start + width].transpose(0, 1).reshape(-1)
    assert torch.equal(dst, expected)
    assert torch.equal(src, before)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("a,b,c,start,width", GRIDS)
def test_unpack_window_writes_only_its_window(backend, dtype: torch.dtype, a: int, b: int, c: int,
                                              start: int, width: int) -> None:
    src = _source(a * b * width, dtype)
    dst = torch.full((a * b * c,), 7, dtype=dtype)
    unpack_window(src, dst, a, b, c, start, width)
    expected = torch.full((b, a, c), 7, dtype=dtype)
    expected[:, :, start:start + width] = src.view(a, b, width).transpose(0, 1)
    assert torch.equal(dst, expected.reshape(-1))


def test_windows_round_trip_and_full_window_is_the_permutation(backend) -> None:
    a, b, c = 3, 2, 101
    src = torch.randn(a * b * c)
    whole, full_window, pieces = torch.empty_like(src), torch.empty_like(src), torch.zeros_like(src)
    permute_blocks(src, whole, a, b, c)
    pack_window(src, full_window, a, b, c, 0, c)
    assert torch.equal(full_window, whole)
    for start in range(0, c, 30):  # pack then unpack window by window: the source again
        width = min(30, c - start)
        chunk = torch.empty(a * b * width)
        pack_window(src, chunk, a, b, c, start, width)
        unpack_window(chunk, pieces, b, a, c, start, width)
    assert torch.equal(pieces, src)


def test_window_out_of_range_is_a_clear_error() -> None:
    src, dst = torch.zeros(2 * 2 * 8), torch.zeros(2 * 2 * 4)
    with pytest.raises(ValueError, match="exceeds the block length 8"):
        pack_window(src, dst, 2, 2, 8, 6, 4)
    with pytest.raises(ValueError, match="must be >= 0"):
        unpack_window(dst, src, 2, 2, 8, -1, 4)
