"""Device kernels for pccl_torch's local work: block permutations (pack/unpack) and reductions.

Installed as ``pccl_torch.triton_kernels``. One file per concern (``pack.py``, ``reduce.py``), each with
its ``@triton.jit`` kernels, their plain-torch references and one dispatch function per kernel, which is
what every algorithm of pccl_torch calls: compiled Triton on CUDA tensors, torch on CPU tensors, the
Triton interpreter on CPU tensors when ``TRITON_INTERPRET=1`` (see ``_backend.py``).
"""

from ._backend import HAS_TRITON, current_backend, use_backend
from .pack import gather_chunks, pack_window, permute_blocks, rotate_, unpack_window
from .reduce import reduce_, reduce_n, scale_

__all__ = [
    "HAS_TRITON",
    "current_backend",
    "gather_chunks",
    "pack_window",
    "permute_blocks",
    "reduce_",
    "reduce_n",
    "rotate_",
    "scale_",
    "unpack_window",
    "use_backend",
]
