"""Device kernels for pccl_torch's local work: block permutations (pack/unpack), reductions and the
compressed wire formats (block quantization, byte planes).

Installed as ``pccl_torch.triton_kernels``. One file per concern (``pack.py``, ``reduce.py``, ``quantize.py``, ``planes.py``), each with
its ``@triton.jit`` kernels, their plain-torch references and one dispatch function per kernel, which is
what every algorithm of pccl_torch calls: compiled Triton on CUDA tensors, torch on CPU tensors, the
Triton interpreter on CPU tensors when ``TRITON_INTERPRET=1`` (see ``_backend.py``).
"""

from ._backend import HAS_TRITON, current_backend, use_backend
from .pack import gather_chunks, pack_window, permute_blocks, rotate_, unpack_window
from .planes import merge_planes, split_planes
from .quantize import QBLOCK, dequantize, quantize
from .reduce import reduce_, reduce_n, scale_

__all__ = [
    "HAS_TRITON",
    "QBLOCK",
    "current_backend",
    "dequantize",
    "gather_chunks",
    "merge_planes",
    "pack_window",
    "permute_blocks",
    "quantize",
    "reduce_",
    "reduce_n",
    "rotate_",
    "scale_",
    "split_planes",
    "unpack_window",
    "use_backend",
]
