"""Test-session settings that must precede any import of triton or pccl_torch.

Without a GPU, Triton kernels run in the interpreter (``TRITON_INTERPRET=1`` must be set before triton is
imported). Everything but the kernel tests uses the torch kernels (``PCCL_KERNELS=torch``): the interpreter is
hundreds of times slower; the kernel tests opt in with ``use_backend("triton")``.
"""

import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("PCCL_KERNELS", "torch")

# Shared-memory segments a killed rank leaves behind: DeepSpeed's CPU backend (66 MB a rank; its name prefix is
# integrations.deepspeed.SHM_PREFIX, not imported here: see above) and MPICH's (4 MB a node; the fault tests kill ranks).
_SHM_GLOBS = ("deepspeed_allreduce_buffer_*", "mpich_shm_*")
_shm_before: set[str] = set()


def _segments() -> list[Path]:
    return [path for pattern in _SHM_GLOBS for path in Path("/dev/shm").glob(pattern)]


def pytest_sessionstart(session) -> None:
    _shm_before.update(path.name for path in _segments())


def pytest_sessionfinish(session, exitstatus) -> None:
    """Unlink the segments this session's runs left in /dev/shm: the kernel keeps them until then."""
    for path in _segments():
        if path.name not in _shm_before:
            path.unlink(missing_ok=True)
