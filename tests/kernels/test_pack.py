"""``_permute_kernel`` (tiled), ``_gather_kernel`` and ``_rotate_kernel`` against their torch references."""

from __future__ import annotations

import pytest
import torch

from pccl_torch.triton_kernels import gather_chunks, pack, pack_window, permute_blocks, rotate_, unpack_window, use_backend
from pccl_torch.triton_kernels.pack import permute_reference

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


# -- the tiled permute kernel: tile geometry exercised with small tiles --------------------------------------------
RANK_COUNTS = (1, 3, 5, 6)
ALL_DTYPES = DTYPES + (torch.int8, torch.uint8, torch.int16)


def special(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Random bytes viewed as ``dtype``: for floats NaN payloads, -0.0, inf and subnormals among them (a move must
    keep every bit). Drawn on the CPU, then moved to the default device: the same values on every device."""
    size = torch.empty(0, dtype=dtype, device="cpu").element_size()
    g = torch.Generator(device="cpu").manual_seed(numel)
    raw = torch.randint(0, 256, (numel * size,), dtype=torch.uint8, generator=g, device="cpu")
    return raw.view(dtype).to(torch.get_default_device())


def assert_bitwise(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.equal(got.view(torch.uint8), expected.contiguous().view(torch.uint8))


@pytest.fixture(params=(16, 64))
def small_tiles(request, monkeypatch) -> int:
    """Permute tiles of 16 or 64 elements: many tiles, rows stacked in a tile (short chunks) and chunks split over
    tiles (long ones), with the edges masked."""
    monkeypatch.setattr(pack, "permute_block", lambda tensor: request.param)
    return request.param


@pytest.mark.parametrize("c", (0, 1, 7, 16, 17, 100))
@pytest.mark.parametrize("b", RANK_COUNTS)
@pytest.mark.parametrize("a", RANK_COUNTS)
def test_tiled_permute_equals_reference(triton_backend, small_tiles, a, b, c) -> None:
    src = special(a * b * c, torch.float32)
    dst = torch.full_like(src, 3.0)
    permute_blocks(src, dst, a, b, c)
    with use_backend("torch"):
        expected = permute_reference(src, torch.empty_like(src), a, b, c)
    assert_bitwise(dst, expected)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_tiled_permute_every_dtype_bitwise(triton_backend, small_tiles, dtype) -> None:
    for a, b, c in ((3, 5, 41), (6, 1, 3), (1, 6, 64), (5, 3, 1)):
        src = special(a * b * c, dtype)
        dst = torch.zeros_like(src)
        permute_blocks(src, dst, a, b, c)
        assert_bitwise(dst, src.view(a, b, c).transpose(0, 1).reshape(-1))


@pytest.mark.parametrize("a,b,c,start,width", [(3, 5, 41, 7, 20), (6, 1, 100, 99, 1), (5, 6, 17, 0, 17)])
def test_tiled_windows_equal_slicing(triton_backend, small_tiles, a, b, c, start, width) -> None:
    src = special(a * b * c, torch.bfloat16)
    packed = torch.zeros(a * b * width, dtype=src.dtype)
    pack_window(src, packed, a, b, c, start, width)
    assert_bitwise(packed, src.view(a, b, c)[:, :, start:start + width].transpose(0, 1).reshape(-1))
    dst = torch.zeros(a * b * c, dtype=src.dtype)
    unpack_window(packed, dst, b, a, c, start, width)
    expected = torch.zeros(a, b, c, dtype=src.dtype)
    expected[:, :, start:start + width] = src.view(a, b, c)[:, :, start:start + width]
    assert_bitwise(dst, expected.reshape(-1))


def test_permute_tile_shapes() -> None:
    """Short chunks stack rows into a tile; long ones take whole-width tiles; a tile never exceeds its block."""
    assert pack.permute_tile(1, 4096) == (256, 16)
    assert pack.permute_tile(17, 4096) == (128, 32)
    assert pack.permute_tile(4096, 4096) == (1, 4096)
    assert pack.permute_tile(10**9, 4096) == (1, 4096)
    assert pack.permute_tile(5, 16) == (1, 16)
