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

# Shared-memory segments a killed rank leaves behind: DeepSpeed's CPU backend (66 MB a rank; its name prefix is
# integrations.deepspeed.SHM_PREFIX, not imported here: see above) and the MPI libraries' (MPICH's 4 MB a node; Open
# MPI's of the fault trials; pccl_torch.testbed.launch.MPI_SEGMENTS, imported only at the end): the fault tests kill
# ranks.
_DEEPSPEED_SEGMENTS = ("deepspeed_allreduce_buffer_*",)


def pytest_sessionfinish(session, exitstatus) -> None:
    """Unlink the segments left in /dev/shm that no live process maps or holds open (the kernel keeps them until
    then): this session's killed ranks' and any earlier run's. Another job's, running beside this session, is in
    use and stays."""
    from pccl_torch.testbed.launch import MPI_SEGMENTS, release_segments

    release_segments((*_DEEPSPEED_SEGMENTS, *MPI_SEGMENTS))
