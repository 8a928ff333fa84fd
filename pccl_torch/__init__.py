"""pccl-torch: hierarchical, algorithm-selecting collectives for PyTorch over mpi4py and torch.distributed.

    import pccl_torch
    comm = pccl_torch.init()                      # under mpiexec or torchrun; PCCL_LOCAL_SIZE=k emulates nodes
    pccl_torch.all_reduce(t)                      # algorithm chosen per call
    pccl_torch.all_gather_into_tensor(out, t, algorithm="hier:bruck")
    pccl_torch.all_to_all_single(out, t, out_splits, in_splits)  # MoE dispatch: two-level across nodes
    pccl_torch.shutdown()
"""

from pccl_torch.api import (
    algorithms,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    all_to_all_single,
    choose_algorithm,
    init,
    reduce_scatter_single,
    reduce_scatter_tensor,
)
from pccl_torch.communicator import (
    Communicator,
    NotInitializedError,
    default_communicator,
    init_process_group,
    is_initialized,
    shutdown,
)
from pccl_torch.counters import stats
from pccl_torch.ops import ReduceOp, premul_sum
from pccl_torch.topology import Topology, TopologyError
from pccl_torch.trace_dump import dump_trace
from pccl_torch.work import Work

__version__ = "0.1.0"


# `import pccl_torch` registers the torch.distributed backend "pccl", and the exit handler that keeps torch's gloo
# workers from aborting a finalizing interpreter (pccl_torch.gloo_exit).
from pccl_torch import gloo_exit as _gloo_exit  # noqa: E402
from pccl_torch.integrations import torch_backend as _torch_backend  # noqa: E402

_torch_backend.register()
_gloo_exit.register()
monitored_barrier = _torch_backend.monitored_barrier

__all__ = [
    "Communicator",
    "NotInitializedError",
    "ReduceOp",
    "Topology",
    "TopologyError",
    "Work",
    "algorithms",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_reduce",
    "all_to_all_single",
    "choose_algorithm",
    "default_communicator",
    "dump_trace",
    "init",
    "init_process_group",
    "is_initialized",
    "monitored_barrier",
    "premul_sum",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "shutdown",
    "stats",
]
