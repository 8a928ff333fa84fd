"""Which implementation a kernel call uses: compiled Triton, the Triton interpreter, or torch.

- CUDA tensors: :data:`ROUTES`, a table measured on a GPU, says for each kernel, dtype class and size where
  compiled Triton runs; the torch reference runs everywhere else (:func:`route`). A kernel, dtype class or size
  the table does not name runs torch: Triton only where it was measured faster.
- CPU tensors run plain torch, or the Triton interpreter when ``TRITON_INTERPRET=1`` was set before
  Triton was imported (that is how the CUDA kernels are verified on machines without a GPU).
- ``PCCL_KERNELS=torch|triton|auto`` (default ``auto``) or the :func:`use_backend` context forces one
  (``triton`` runs every kernel on Triton whatever the table says: how the benchmark measures both paths).

The choice is a pure function of (kernel, dtype, bytes, device type) and the forced backend: ranks that make the
same call take the same path (and the two paths agree bit for bit anyway: the kernel tests require it).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch

try:
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAS_TRITON = True
except ImportError:  # the `triton` extra is not installed: torch everywhere
    HAS_TRITON = False

BACKEND_ENV = "PCCL_KERNELS"
_CHOICES = ("auto", "torch", "triton")
# Process-wide (not a context variable): collectives run kernels on worker threads too.
_override: str | None = None

# Elements per Triton program: a memory-bound block on GPUs; far larger in the interpreter, whose cost
# is per program (it runs each program as NumPy operations).
GPU_BLOCK = 2048
INTERPRETER_BLOCK = 1 << 15
MAX_PROGRAMS = 2**31 - 1


def interpreting() -> bool:
    """True when Triton kernels run in the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def current_backend() -> str:
    """The requested backend: the :func:`use_backend` override, else ``PCCL_KERNELS``, else auto."""
    choice = _override or os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"{BACKEND_ENV}={choice!r}; expected one of {', '.join(_CHOICES)}")
    return choice


@contextlib.contextmanager
def use_backend(choice: str) -> Iterator[None]:
    """Run kernel calls made until the block exits, in any thread, with ``choice``
    (``auto``, ``torch`` or ``triton``)."""
    global _override
    if choice not in _CHOICES:
        raise ValueError(f"unknown kernel backend {choice!r}; expected one of {', '.join(_CHOICES)}")
    previous, _override = _override, choice
    try:
        yield
    finally:
        _override = previous


KERNELS = ("reduce_2", "reduce_8", "permute", "rotate", "gather", "quantize", "dequantize", "dequantize_acc",
           "split_planes", "merge_planes")
"""The kernels the table routes, named as ``benchmarks/bench_kernels.py`` names its rows."""
DTYPE_CLASSES = ("full", "half", "any")
MIB = 1 << 20


def dtype_class(dtype: torch.dtype) -> str:
    """``"half"`` for float16 and bfloat16 (the torch references upcast them to float32, several launches a call),
    ``"full"`` for every other dtype (measured on float32)."""
    return "half" if dtype in (torch.float16, torch.bfloat16) else "full"


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """Compiled Triton runs ``kernel`` on CUDA tensors of the ``dtypes`` class whose size is in
    ``[start, stop)`` bytes."""

    kernel: str
    """One of :data:`KERNELS`."""
    dtypes: str
    """``"full"``, ``"half"`` (see :func:`dtype_class`) or ``"any"`` (both)."""
    start: int = 0
    """Smallest size (bytes of the call's buffer) that runs Triton."""
    stop: float = math.inf
    """First size past the range (exclusive)."""
    measured: str = ""
    """The measurement behind the row: run, dtype and the sizes where Triton was faster."""

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown kernel {self.kernel!r} in a route: expected one of {', '.join(KERNELS)}")
        if self.dtypes not in DTYPE_CLASSES:
            raise ValueError(f"unknown dtype class {self.dtypes!r}: expected one of {', '.join(DTYPE_CLASSES)}")
        if not 0 <= self.start < self.stop:
            raise ValueError(f"route {self.kernel}/{self.dtypes}: need 0 <= start < stop, got {self.start}, {self.stop}")


# Seeded from the 2026-12-04 H200 run (gpu-runs/2026-12-04: run1-bench_kernels.log, run3-wire-kernels.jsonl).
# Triton runs where it was faster than the torch reference at every measured size of the range (ties go to
# torch); a range ends half-way (geometric mean) between the last measured size where Triton won and the first
# where it lost. Kernels absent here (reduce_2 on full dtypes, permute, gather) run torch at every size.
# ``benchmarks/bench_kernels.py`` prints the rows a new run's measurements give ("proposed routes").
ROUTES: tuple[Route, ...] = (
    Route(kernel="reduce_2", dtypes="half", start=8 * MIB,
          measured="12-04 bf16: Triton faster at 16M-256M, torch at 64K-4M"),
    Route(kernel="reduce_8", dtypes="full", start=128 << 10, stop=8 * MIB,
          measured="12-04 fp32: Triton faster at 256K-4M (64K a tie), torch at 16M"),
    Route(kernel="reduce_8", dtypes="full", start=32 * MIB, measured="12-04 fp32: Triton faster at 64M-256M"),
    Route(kernel="reduce_8", dtypes="half", measured="12-04 bf16: Triton faster at 64K-256M"),
    Route(kernel="rotate", dtypes="full", stop=32 * MIB,
          measured="12-04 fp32: Triton faster at 64K-16M, torch at 64M-256M"),
    Route(kernel="rotate", dtypes="half", start=128 << 10, stop=32 * MIB,
          measured="12-04 bf16: Triton faster at 256K-16M, torch at 64K and 64M-256M"),
    Route(kernel="quantize", dtypes="any", measured="12-04 fp32 input: Triton faster at 1M-256M (int8)"),
    Route(kernel="dequantize", dtypes="any", measured="12-04 fp32 output: Triton faster at 1M-256M"),
    Route(kernel="dequantize_acc", dtypes="any", measured="12-04 fp32 SUM: Triton faster at 1M-256M"),
    Route(kernel="split_planes", dtypes="any", start=4 * MIB,
          measured="12-04 fp32: Triton faster at 16M-256M, torch at 1M"),
    Route(kernel="merge_planes", dtypes="any", measured="12-04 fp32: Triton faster at 1M-256M"),
)


def _ranges(routes: tuple[Route, ...]) -> dict[tuple[str, str], tuple[tuple[int, float], ...]]:
    """``(kernel, "full" | "half") -> ((start, stop), ...)``: the table as :func:`route` reads it."""
    table: dict[tuple[str, str], tuple[tuple[int, float], ...]] = {}
    for r in routes:
        for cls in (("full", "half") if r.dtypes == "any" else (r.dtypes,)):
            table[(r.kernel, cls)] = table.get((r.kernel, cls), ()) + ((r.start, r.stop),)
    return table


_RANGES = _ranges(ROUTES)


def route(kernel: str, dtype: torch.dtype, nbytes: int, device_type: str) -> str:
    """The path ``auto`` takes for a compiled call: ``"triton"`` or ``"torch"``, from :data:`ROUTES` on CUDA;
    torch on every other device (the Triton interpreter, a test mode, is not routed). Pure: the same arguments
    give the same answer on every rank."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}: expected one of {', '.join(KERNELS)}")
    if device_type != "cuda":
        return "torch"
    for start, stop in _RANGES.get((kernel, dtype_class(dtype)), ()):
        if start <= nbytes < stop:
            return "triton"
    return "torch"


def wants_triton(tensor: torch.Tensor, kernel: str | None = None, nbytes: int | None = None) -> bool:
    """Whether ``kernel`` on ``tensor`` (``nbytes`` of it; default all of it) should launch Triton (compiled or
    interpreted). Without a kernel: whether Triton can run on the tensor's device at all (the forced backend
    checked, no table)."""
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}: expected one of {', '.join(KERNELS)}")
    choice = current_backend()
    if choice == "torch":
        return False
    if not HAS_TRITON:
        if choice == "triton":
            raise RuntimeError("Triton kernels requested but triton is not installed: pip install 'pccl-torch[triton]'")
        return False
    if tensor.is_cuda:
        if choice == "triton" or kernel is None:
            return True
        size = tensor.numel() * tensor.element_size() if nbytes is None else nbytes
        return route(kernel, tensor.dtype, size, "cuda") == "triton"
    if tensor.device.type == "cpu" and interpreting():
        return True
    if choice == "triton":
        raise RuntimeError(
            f"Triton kernels cannot run on {tensor.device} tensors: set TRITON_INTERPRET=1 before importing "
            "pccl_torch to run them in the interpreter, or use PCCL_KERNELS=torch"
        )
    return False


_INTERPRETER_LOCK = threading.Lock()


@contextlib.contextmanager
def launching() -> Iterator[None]:
    """Hold around a kernel launch: the Triton interpreter patches triton.language globally while a
    kernel runs, so concurrent launches from several threads must be serialised (compiled launches
    need no lock)."""
    if interpreting():
        with _INTERPRETER_LOCK:
            yield
    else:
        yield


def block_size(tensor: torch.Tensor) -> int:
    return GPU_BLOCK if tensor.is_cuda else INTERPRETER_BLOCK


def grid_for(numel: int, block: int, what: str) -> tuple[int]:
    """One program per ``block`` elements; a clear error past the launch limit."""
    programs = -(-numel // block)
    if programs > MAX_PROGRAMS:
        raise ValueError(f"cannot launch {what}: {numel} elements exceed {MAX_PROGRAMS} programs of {block}")
    return (programs,)
