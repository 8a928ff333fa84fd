"""Which implementation a kernel call uses: compiled Triton, the Triton interpreter, or torch.

- CUDA tensors run the compiled Triton kernel (when Triton is installed).
- CPU tensors run plain torch, or the Triton interpreter when ``TRITON_INTERPRET=1`` was set before
  Triton was imported (that is how the CUDA kernels are verified on machines without a GPU).
- ``PCCL_KERNELS=torch|triton|auto`` (default ``auto``) or the :func:`use_backend` context forces one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

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


def wants_triton(tensor: torch.Tensor) -> bool:
    """Whether a kernel on ``tensor`` should launch Triton (compiled or interpreted)."""
    choice = current_backend()
    if choice == "torch":
        return False
    if not HAS_TRITON:
        if choice == "triton":
            raise RuntimeError("Triton kernels requested but triton is not installed: pip install 'pccl-torch[triton]'")
        return False
    if tensor.is_cuda:
        return True
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
