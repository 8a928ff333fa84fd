"""Device kernels for pccl_torch's local work: block permutations (pack/unpack) and reductions.

Installed as ``pccl_torch.triton_kernels``. Each file holds one concern; every public function is the
single dispatch point for its kernel, and every algorithm of pccl_torch calls these functions instead of
doing its own reduction or permutation loop.
"""

from .pack import permute_blocks, rotate_
from .reduce import reduce_, scale_

__all__ = ["permute_blocks", "rotate_", "reduce_", "scale_"]
