"""The algorithm family. Importing this package registers every schedule (see ``registry``)."""

from pccl_torch.algorithms import all_gather, all_reduce, all_to_all, native, reduce_scatter  # noqa: F401  (registration)
from pccl_torch.algorithms._layout import Blocks, Fold
from pccl_torch.algorithms.registry import COLLECTIVES, Algorithm, Collective, get, names, register

__all__ = ["Algorithm", "Blocks", "COLLECTIVES", "Collective", "Fold", "get", "names", "register"]
