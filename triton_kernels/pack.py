"""Block permutations of flat buffers: the pack/unpack steps of the collectives.

- ``permute_blocks``: view ``src`` as ``[A, B, C]`` (A x B chunks of C elements) and write the
  ``[B, A, C]`` transpose. The hierarchical reduce-scatter packs global order ``[node, local, chunk]``
  into ``[local, node, chunk]``; the hierarchical all-gather unpacks the inverse.
- ``pack_window`` / ``unpack_window``: the same transpose for one column window ``start:start + W`` of
  the blocks (read from a window of ``src``, or written into a window of ``dst``): one chunk of the
  pipelined hierarchical schedules. One kernel serves all three (strides and window offsets as arguments).
- ``gather_chunks``: ``dst`` chunk ``i`` = ``src`` chunk ``index[i]`` (chunks of C elements).
- ``rotate_``: ``dst[(i + shift) % N] = src[i]``, Bruck's final rotation back to rank order.

All write into a separate, contiguous output; the input is never modified. The permute kernel moves 2-D
tiles of whole chunk rows, contiguous on both sides; in the gather and rotate kernels program ``i`` owns output
elements ``[i * BLOCK, (i + 1) * BLOCK)`` and computes where each one comes from, so loads may be scattered but
stores are contiguous.
"""

from __future__ import annotations

import torch

from pccl_torch.triton_kernels._backend import HAS_TRITON, block_size, grid_for, launching, wants_triton

#: Bytes a permute tile moves on a GPU (4 Ki float32, 8 Ki bfloat16 elements): a copy needs more bytes in flight
#: per program than the 2 Ki elements of the other kernels, and a tile's size should not shrink with the dtype.
PERMUTE_TILE_BYTES = 16 << 10

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _permute_kernel(
        src_ptr,  # *T: source; element (a, b, w) at a * src_a + b * src_b + src_off + w
        dst_ptr,  # *T: destination; element (a, b, w) at a * dst_a + b * dst_b + dst_off + w
        A, W,  # chunk grid rows of the source and window width (elements)
        rows,  # A * B: the rows (b, a) of the [B, A, W] transpose
        col_tiles,  # tiles of BLOCK_W columns per row: cdiv(W, BLOCK_W)
        src_a, src_b, src_off,  # source strides (elements) of a and b, and the window's start
        dst_a, dst_b, dst_off,  # destination strides of a and b, and the window's start
        ROWS: tl.constexpr,  # rows per tile (a power of two; > 1 only when W is short)
        BLOCK_W: tl.constexpr,  # columns per tile (a power of two)
    ):
        # A tile is ROWS x BLOCK_W elements: rows r = b * A + a of the transpose, columns w of their chunk. Each
        # row is a run of W consecutive elements in both buffers, so loads and stores are both contiguous (and
        # vectorised when the strides are multiples of 16). Program p takes row group p // col_tiles and column
        # tile p % col_tiles: one scalar division per program, and a division per row, never per element.
        pid = tl.program_id(0).to(tl.int64)
        r = (pid // col_tiles) * ROWS + tl.arange(0, ROWS)
        w = (pid % col_tiles) * BLOCK_W + tl.arange(0, BLOCK_W)
        a = r % A
        b = r // A
        src_row = a * src_a + b * src_b + src_off
        dst_row = a * dst_a + b * dst_b + dst_off
        mask = (r < rows)[:, None] & (w < W)[None, :]
        values = tl.load(src_ptr + (src_row[:, None] + w[None, :]), mask=mask)
        tl.store(dst_ptr + (dst_row[:, None] + w[None, :]), values, mask=mask)

    @triton.jit
    def _gather_kernel(
        src_ptr,  # *T: source chunks, contiguous
        dst_ptr,  # *T: destination, len(index) chunks of C elements
        index_ptr,  # *int64: source chunk of each destination chunk
        C,  # chunk length (elements)
        n_elements,  # len(index) * C
        BLOCK: tl.constexpr,  # output elements per program
    ):
        # Output element o = i * C + c comes from source element index[i] * C + c.
        o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = o < n_elements
        chunk = tl.load(index_ptr + o // C, mask=mask, other=0)
        values = tl.load(src_ptr + chunk * C + o % C, mask=mask)
        tl.store(dst_ptr + o, values, mask=mask)

    @triton.jit
    def _rotate_kernel(
        src_ptr,  # *T: source, n_elements, contiguous
        dst_ptr,  # *T: destination, n_elements, contiguous
        shift,  # 0 <= shift < n_elements: dst[(i + shift) % n] = src[i]
        n_elements,
        BLOCK: tl.constexpr,  # output elements per program
    ):
        # Output element o comes from source element (o - shift) mod n = (o + n - shift) % n.
        o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = o < n_elements
        values = tl.load(src_ptr + (o + n_elements - shift) % n_elements, mask=mask)
        tl.store(dst_ptr + o, values, mask=mask)


def _check(src: torch.Tensor, dst: torch.Tensor, numel: int, what: str) -> None:
    if src.dtype != dst.dtype:
        raise TypeError(f"cannot {what}: dtypes differ ({src.dtype} vs {dst.dtype})")
    if src.device != dst.device:
        raise ValueError(f"cannot {what}: devices differ ({src.device} vs {dst.device})")
    if not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError(f"cannot {what}: input and output must be contiguous")
    if dst.numel() != numel:
        raise ValueError(f"cannot {what}: expected {numel} output elements, got {dst.numel()}")
    if src.numel() and src.data_ptr() == dst.data_ptr():
        raise ValueError(f"cannot {what} in place: input and output must be different buffers")


def permute_reference(src: torch.Tensor, dst: torch.Tensor, a: int, b: int, c: int) -> torch.Tensor:
    """Plain-torch twin of ``_permute_kernel`` over whole blocks."""
    return dst.view(b, a, c).copy_(src.view(a, b, c).transpose(0, 1)).view(-1) if dst.numel() else dst


def permute_blocks(src: torch.Tensor, dst: torch.Tensor, a: int, b: int, c: int) -> torch.Tensor:
    """Write ``src`` viewed as ``[a, b, c]`` into ``dst`` as ``[b, a, c]``. Returns ``dst``."""
    _check_grid(a, b, c, 0, c)
    _check(src, dst, a * b * c, "permute blocks")
    if src.numel() != a * b * c:
        raise ValueError(f"cannot permute blocks: expected {a * b * c} input elements, got {src.numel()}")
    if dst.numel() == 0:
        return dst
    if not wants_triton(dst, "permute"):
        return permute_reference(src, dst, a, b, c)
    _launch_permute(src, dst, a, a * b, c, (b * c, c, 0), (c, a * c, 0))
    return dst


def pack_window(src: torch.Tensor, dst: torch.Tensor, a: int, b: int, c: int, start: int,
                width: int) -> torch.Tensor:
    """``dst`` as ``[b, a, width]`` = columns ``start:start + width`` of ``src`` as ``[a, b, c]``, transposed.

    One chunk of a pipelined hierarchical reduce-scatter: the global-order input ``[node, local, n]``
    packed to ``[local, node, width]`` for one column window. Returns ``dst``."""
    _check_grid(a, b, c, start, width)
    _check(src, dst, a * b * width, "pack a window")
    if src.numel() != a * b * c:
        raise ValueError(f"cannot pack a window: expected {a * b * c} input elements, got {src.numel()}")
    if dst.numel() == 0:
        return dst
    if not wants_triton(dst, "permute"):
        dst.view(b, a, width).copy_(src.view(a, b, c)[:, :, start:start + width].transpose(0, 1))
        return dst
    _launch_permute(src, dst, a, a * b, width, (b * c, c, start), (width, a * width, 0))
    return dst


def unpack_window(src: torch.Tensor, dst: torch.Tensor, a: int, b: int, c: int, start: int,
                  width: int) -> torch.Tensor:
    """Columns ``start:start + width`` of ``dst`` as ``[b, a, c]`` = ``src`` as ``[a, b, width]``, transposed.

    One chunk of a pipelined hierarchical all-gather: ``[local, node, width]`` as received, written into
    the global-order output ``[node, local, n]``. The rest of ``dst`` is left as it is. Returns ``dst``."""
    _check_grid(a, b, c, start, width)
    _check(src, dst, a * b * c, "unpack a window")
    if src.numel() != a * b * width:
        raise ValueError(f"cannot unpack a window: expected {a * b * width} input elements, got {src.numel()}")
    if src.numel() == 0:
        return dst
    if not wants_triton(dst, "permute", src.numel() * src.element_size()):
        dst.view(b, a, c)[:, :, start:start + width].copy_(src.view(a, b, width).transpose(0, 1))
        return dst
    _launch_permute(src, dst, a, a * b, width, (b * width, width, 0), (c, a * c, start))
    return dst


def _check_grid(a: int, b: int, c: int, start: int, width: int) -> None:
    if min(a, b, c, start, width) < 0:
        raise ValueError(f"cannot permute: block counts and window must be >= 0, got a={a}, b={b}, c={c}, "
                         f"start={start}, width={width}")
    if start + width > c:
        raise ValueError(f"cannot permute: window {start}:{start + width} exceeds the block length {c}")


def permute_block(tensor: torch.Tensor) -> int:
    """Elements a permute tile moves: :data:`PERMUTE_TILE_BYTES` on GPUs, the interpreter's block on CPU."""
    return PERMUTE_TILE_BYTES // tensor.element_size() if tensor.is_cuda else block_size(tensor)


def permute_tile(width: int, block: int) -> tuple[int, int]:
    """``(ROWS, BLOCK_W)`` of a permute tile of ``block`` elements (a power of two): a row is as wide as the window
    rounded up to a power of two (16 at least, ``block`` at most), and a tile stacks the rows that fit."""
    block_w = min(max(1 << (max(width, 1) - 1).bit_length(), 16), block)
    return block // block_w, block_w


def _launch_permute(src: torch.Tensor, dst: torch.Tensor, a: int, rows: int, width: int,
                    src_strides: tuple[int, int, int], dst_strides: tuple[int, int, int]) -> None:
    """Launch ``_permute_kernel`` over the ``rows`` (= a * b) rows of ``width`` moved elements."""
    tile_rows, block_w = permute_tile(width, permute_block(dst))
    col_tiles = -(-width // block_w)
    tiles = -(-rows // tile_rows) * col_tiles
    with launching():
        _permute_kernel[grid_for(tiles * tile_rows * block_w, tile_rows * block_w, "permute")](
            src, dst, a, width, rows, col_tiles, *src_strides, *dst_strides, ROWS=tile_rows, BLOCK_W=block_w)


def gather_reference(src: torch.Tensor, dst: torch.Tensor, index: torch.Tensor, chunk: int) -> torch.Tensor:
    """Plain-torch twin of ``_gather_kernel``."""
    if dst.numel():
        torch.index_select(src.view(-1, chunk), 0, index, out=dst.view(-1, chunk))
    return dst


def gather_chunks(src: torch.Tensor, dst: torch.Tensor, index: torch.Tensor, chunk: int) -> torch.Tensor:
    """``dst`` chunk ``i`` = ``src`` chunk ``index[i]``, chunks of ``chunk`` elements. Returns ``dst``."""
    if chunk < 0:
        raise ValueError(f"cannot gather chunks: chunk length must be >= 0, got {chunk}")
    if index.dtype != torch.int64 or index.dim() != 1 or index.device != src.device:
        raise TypeError(f"cannot gather chunks: index must be a 1-D int64 tensor on {src.device}, "
                        f"got {index.dtype} {tuple(index.shape)} on {index.device}")
    _check(src, dst, index.numel() * chunk, "gather chunks")
    chunks = src.numel() // chunk if chunk else 0
    if chunk and src.numel() % chunk:
        raise ValueError(f"cannot gather chunks: {src.numel()} input elements are not whole chunks of {chunk}")
    if dst.numel() == 0:
        return dst
    if int(index.min()) < 0 or int(index.max()) >= chunks:
        raise IndexError(f"cannot gather chunks: index values must be in [0, {chunks}), "
                         f"got [{int(index.min())}, {int(index.max())}]")
    if not wants_triton(dst, "gather"):
        return gather_reference(src, dst, index, chunk)
    block = block_size(dst)
    with launching():
        _gather_kernel[grid_for(dst.numel(), block, "gather")](src, dst, index.contiguous(), chunk, dst.numel(),
                                                               BLOCK=block)
    return dst


def rotate_reference(src: torch.Tensor, dst: torch.Tensor, shift: int) -> torch.Tensor:
    """Plain-torch twin of ``_rotate_kernel`` (two contiguous copies)."""
    total = src.numel()
    cut = (total - shift % total) % total  # src[cut:] lands at the front of dst
    dst[: total - cut].copy_(src[cut:])
    dst[total - cut:].copy_(src[:cut])
    return dst


def rotate_(src: torch.Tensor, dst: torch.Tensor, shift: int) -> torch.Tensor:
    """Element ``i`` of ``src`` goes to element ``(i + shift) % N`` of ``dst``. Returns ``dst``."""
    _check(src, dst, src.numel(), "rotate")
    total = src.numel()
    if total == 0:
        return dst
    if not wants_triton(dst, "rotate"):
        return rotate_reference(src, dst, shift)
    block = block_size(dst)
    with launching():
        _rotate_kernel[grid_for(total, block, "rotate")](src, dst, shift % total, total, BLOCK=block)
    return dst
