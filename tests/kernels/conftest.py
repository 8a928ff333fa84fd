"""Kernel tests run the Triton kernels (the interpreter without a GPU) against their torch references, and
check that the Triton path ran: a silent fallback to the torch reference would pass every comparison."""

from __future__ import annotations

import importlib
from collections import Counter

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

#: The modules whose kernels launch through ``_backend.launching()`` (each imports it by name).
KERNEL_MODULES = ("pack", "planes", "quantize", "reduce")
#: Parameters that size a test's tensors: a case where one is 0 has nothing to launch.
SIZE_PARAMS = ("numel", "n", "a", "b", "c", "width", "chunk", "chunks")


class Launches:
    """Triton kernel launches seen during one test, by module (``launching()`` is entered once per launch)."""

    def __init__(self) -> None:
        self.by_module: Counter[str] = Counter()
        self.none_expected: str | None = None

    @property
    def total(self) -> int:
        return sum(self.by_module.values())

    def expect_none(self, reason: str) -> None:
        """This test runs no kernel on the Triton path by design (``reason``)."""
        self.none_expected = reason


def _count_launches(monkeypatch: pytest.MonkeyPatch) -> Launches:
    launches = Launches()
    for name in KERNEL_MODULES:
        module = importlib.import_module(f"pccl_torch.triton_kernels.{name}")

        def counted(_original=module.launching, _name=name):
            launches.by_module[_name] += 1
            return _original()

        monkeypatch.setattr(module, "launching", counted)
    return launches


@pytest.fixture
def triton_backend(request, monkeypatch):
    """The Triton backend for the test's kernel calls; yields a :class:`Launches` counter and fails the test
    if no kernel was launched (unless a size parameter is 0, or the test called ``expect_none``)."""
    if not HAS_TRITON:
        pytest.fail("triton is not installed: `make test` installs the [triton] extra")
    launches = _count_launches(monkeypatch)
    previous = torch.get_default_device()
    torch.set_default_device(DEVICE)  # every tensor a test creates lives where the kernels run
    try:
        with use_backend("triton"):
            yield launches
    finally:
        torch.set_default_device(previous)
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    empty = any(params.get(name) == 0 for name in SIZE_PARAMS)
    if launches.total == 0 and not empty and launches.none_expected is None:
        pytest.fail("no Triton kernel was launched: the calls fell back to the torch reference "
                    f"(parameters {params})")
