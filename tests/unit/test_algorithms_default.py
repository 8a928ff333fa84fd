"""pccl_torch.algorithms() without a device: the default communicator's device once initialised (issue 33)."""
import pccl_torch
from pccl_torch.plan import runnable_names, valid_names


def test_algorithms_follow_the_default_communicator_s_device() -> None:
    assert pccl_torch.algorithms("all_reduce") == valid_names("all_reduce")  # before init(): every name
    pccl_torch.init()  # a world of one, CPU tensors
    try:
        names = pccl_torch.algorithms("all_reduce")
        assert names == runnable_names("all_reduce", "cpu") and not any("nccl" in n for n in names)
        assert "hier-mpi:ring" in names  # every accepted name, synonyms too
        assert pccl_torch.algorithms("all_reduce", None) == valid_names("all_reduce")
    finally:
        pccl_torch.shutdown()
