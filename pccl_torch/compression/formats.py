"""Wire formats: how a block of floats is turned into the bytes that cross the network, and back.

| format | bytes per element (float32 input) | error | applies to |
|---|---|---|---|
| ``bf16`` | 2 | round to nearest even to 8 significant bits (rel. 2^-8) | float32, float64 |
| ``int8`` | 1 + 4 per 256 (a float32 absmax per block) | <= absmax / 254 per element | every float dtype |
| ``fp8`` | 1 + 4 per 256 | e4m3 of x / absmax * 448 (rel. 2^-4) | every float dtype |
| ``lossless`` | 4 - (what zstd saves on the top byte) | none: bit-exact | every float dtype |

Every format decodes deterministically: the same bytes give the same values on every rank, which is what
keeps compressed all-reduce results bitwise identical everywhere. Lossy formats turn a block holding inf or
NaN into NaN (int8, fp8: the whole block of 256; bf16: that element), never into finite numbers.
Integer tensors have no compressed format.

The lossless format splits every element's top byte (sign and exponent) from the rest
(``triton_kernels.planes``), compresses the top plane with zstd (level 1) and sends the rest as it is:
wire = [int64 compressed top length, or -1 when zstd did not shrink it][int64 dtype][top plane][rest][padding].
"""

from __future__ import annotations

import abc
import functools

import torch

from pccl_torch.ops import ReduceOp
from pccl_torch.triton_kernels import dequantize, merge_planes, quantize, reduce_, split_planes
from pccl_torch.triton_kernels.quantize import blocks_of

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
ALIGN = 8
"""Wire sizes are padded to a multiple of this, so that messages laid end to end in one receive buffer
keep every header and scale aligned for a typed view."""


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class WireFormat(abc.ABC):
    """One compressed encoding of a flat float tensor."""

    name: str
    lossless: bool = False
    dtypes: tuple[torch.dtype, ...] = FLOATS
    #: Bound on |decoded - x| per element, relative to the largest |x| of its block (0: bit-exact).
    max_error: float = 0.0

    def applies_to(self, dtype: torch.dtype) -> bool:
        return dtype in self.dtypes

    def check_dtype(self, dtype: torch.dtype) -> None:
        """``TypeError`` naming the format, the dtype and the dtypes it applies to."""
        if not self.applies_to(dtype):
            raise TypeError(f"compression {self.name!r} does not apply to {dtype} tensors; it applies to "
                            f"{', '.join(str(d) for d in self.dtypes)} (use compression=None for exact)")

    @abc.abstractmethod
    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int | None:
        """Encoded size of ``numel`` elements, or None when it depends on the values (lossless)."""

    @abc.abstractmethod
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The wire bytes (a flat uint8 tensor) of a flat contiguous tensor ``x``; ``x`` is not modified."""

    @property
    def fixed_size(self) -> bool:
        """Whether the encoded size depends on the element count only (every format but lossless)."""
        return self.wire_bytes(1, torch.float32) is not None

    def encode_into(self, x: torch.Tensor, wire: torch.Tensor) -> None:
        """Encode ``x`` into ``wire`` (uint8, exactly ``wire_bytes`` long: fixed-size formats), a slot of a
        buffer that is sent as a whole."""
        wire.copy_(self.encode(x))

    @abc.abstractmethod
    def decode(self, wire: torch.Tensor, out: torch.Tensor) -> None:
        """Write the values ``wire`` encodes into ``out`` (flat, of the encoded tensor's numel; of its dtype or
        a wider float one, such as the float32 accumulator of a reduction)."""

    def round_trip(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as the other ranks receive it: encoded, then decoded into a new tensor like ``x``."""
        out = torch.empty_like(x)
        self.decode(self.encode(x), out)
        return out

    def decode_accumulate(self, wire: torch.Tensor, acc: torch.Tensor, op: ReduceOp) -> None:
        """``acc = op(acc, decoded)`` in ``acc``'s dtype (the accumulator a compressed reduction keeps)."""
        decoded = torch.empty_like(acc)
        self.decode(wire, decoded)
        reduce_(acc, decoded, op)

    def __repr__(self) -> str:
        return f"<wire format {self.name}>"


class Bfloat16(WireFormat):
    """float32 / float64 rounded to bfloat16 (to nearest even) on the wire."""

    name = "bf16"
    dtypes = (torch.float32, torch.float64)
    max_error = 2.0 ** -8

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return 2 * numel

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).view(torch.uint8)

    def encode_into(self, x: torch.Tensor, wire: torch.Tensor) -> None:
        wire.view(torch.bfloat16).copy_(x)  # the same rounding as ``to``: to nearest even

    def decode(self, wire: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(wire.view(torch.bfloat16))


class BlockQuantized(WireFormat):
    """int8 or fp8 (e4m3) values with a float32 absmax per block of 256 (``triton_kernels.quantize``):
    wire = [absmax, float32 x blocks][values, 1 byte each][padding to ALIGN]."""

    def __init__(self, name: str, value_dtype: torch.dtype, max_error: float) -> None:
        self.name = name
        self.value_dtype = value_dtype
        self.max_error = max_error

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        return aligned(4 * blocks_of(numel) + numel)

    def _split(self, wire: torch.Tensor, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        head = 4 * blocks_of(numel)
        return wire[head:head + numel].view(self.value_dtype), wire[:head].view(torch.float32)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        wire = torch.empty(self.wire_bytes(x.numel(), x.dtype), dtype=torch.uint8, device=x.device)
        self.encode_into(x, wire)
        return wire

    def encode_into(self, x: torch.Tensor, wire: torch.Tensor) -> None:
        values, absmax = self._split(wire, x.numel())
        quantize(x, values, absmax)

    def decode(self, wire: torch.Tensor, out: torch.Tensor) -> None:
        values, absmax = self._split(wire, out.numel())
        dequantize(values, absmax, out)

    def decode_accumulate(self, wire: torch.Tensor, acc: torch.Tensor, op: ReduceOp) -> None:
        values, absmax = self._split(wire, acc.numel())
        dequantize(values, absmax, acc, accumulate=op)  # fused: one pass


_HEADER = 16  # int64: compressed top-plane length, or -1 when sent raw; int64: the dtype's index in FLOATS
_ZSTD_LEVEL = 1  # 16 MiB float32: ~13 ms for the top plane, which shrinks 2.7x on Gaussian values


@functools.cache
def _zstd():
    try:
        import zstandard
    except ImportError as exc:  # a dependency of pccl-torch; only a broken install lacks it
        raise RuntimeError("compression 'lossless' needs the zstandard package: pip install zstandard") from exc
    return zstandard


class Lossless(WireFormat):
    """Bit-exact: the top-byte plane through zstd, the other bytes as they are (host memory; CUDA tensors
    are split on the device and the planes staged)."""

    name = "lossless"
    lossless = True

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> None:
        return None

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        n, k = x.numel(), x.element_size()
        top = torch.empty(n, dtype=torch.uint8, device=x.device)
        rest = torch.empty(n * (k - 1), dtype=torch.uint8, device=x.device)
        split_planes(x, top, rest)
        top, rest = top.cpu(), rest.cpu()
        packed = _zstd().ZstdCompressor(level=_ZSTD_LEVEL).compress(top.numpy()) if n else b""
        raw = len(packed) >= n
        size = n if raw else len(packed)
        wire = torch.empty(aligned(_HEADER + size + rest.numel()), dtype=torch.uint8)
        wire[:_HEADER].view(torch.int64).copy_(torch.tensor([-1 if raw else size, FLOATS.index(x.dtype)]))
        if raw:
            wire[_HEADER:_HEADER + n].copy_(top)
        elif size:
            wire[_HEADER:_HEADER + size].copy_(torch.frombuffer(bytearray(packed), dtype=torch.uint8))
        wire[_HEADER + size:_HEADER + size + rest.numel()].copy_(rest)
        wire[_HEADER + size + rest.numel():] = 0  # padding: deterministic bytes on the wire
        return wire

    def decode(self, wire: torch.Tensor, out: torch.Tensor) -> None:
        wire = wire.cpu()
        size, dtype_index = wire[:_HEADER].view(torch.int64).tolist()  # wires start ALIGN-aligned
        encoded = FLOATS[dtype_index]
        if encoded != out.dtype:  # into an accumulator of another dtype: through one of the encoded dtype
            exact = torch.empty(out.numel(), dtype=encoded, device=out.device)
            self.decode(wire, exact)
            out.copy_(exact)
            return
        n, k = out.numel(), out.element_size()
        if size < 0:
            size = n
            top = wire[_HEADER:_HEADER + n]
        else:
            top = torch.empty(n, dtype=torch.uint8)
            if n:
                _decompress_into(wire[_HEADER:_HEADER + size], top)
        rest = wire[_HEADER + size:_HEADER + size + n * (k - 1)]
        if out.is_cuda:
            top, rest = top.to(out.device), rest.to(out.device)
        merge_planes(top, rest, out)


def _decompress_into(packed: torch.Tensor, top: torch.Tensor) -> None:
    """zstd-decompress ``packed`` straight into ``top`` (no intermediate bytes object)."""
    reader = _zstd().ZstdDecompressor().stream_reader(memoryview(packed.numpy()))
    view = memoryview(top.numpy())
    filled = 0
    while filled < len(view):
        got = reader.readinto(view[filled:])
        if not got:
            raise ValueError(f"lossless wire data ended after {filled} of {len(view)} bytes: corrupted message")
        filled += got


FORMATS: dict[str, WireFormat] = {
    f.name: f for f in (Bfloat16(), BlockQuantized("int8", torch.int8, 1 / 254),
                        BlockQuantized("fp8", torch.float8_e4m3fn, 2.0 ** -4), Lossless())
}
NAMES = tuple(FORMATS)


def get(name: str) -> WireFormat:
    """The format called ``name``; ``ValueError`` listing the valid names otherwise."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown compression {name!r}; expected None or one of {', '.join(NAMES)}") from None
