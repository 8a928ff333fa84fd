"""Test-session settings that must precede any import of triton or pccl_torch.

Without a GPU, Triton kernels run in the interpreter (``TRITON_INTERPRET=1`` must be set before triton is
imported). Everything but the kernel tests uses the torch kernels (``PCCL_KERNELS=torch``): the interpreter is
hundreds of times slower; the kernel tests opt in with ``use_backend("triton")``.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("PCCL_KERNELS", "torch")
