"""``pccl_torch.algorithms`` (``plan.algorithm_names``): a bad collective or device raises naming the valid ones,
no device lists every accepted name, a device the distinct names that run there; ``runnable_names`` is what
``algorithm=`` accepts on one device."""
from __future__ import annotations

import pytest

import pccl_torch
from pccl_torch.algorithms import COLLECTIVES
from pccl_torch.plan import intra_library, names_for, resolve, runnable_names, valid_names


@pytest.mark.parametrize("collective", ["allreduce", "foo", "", "All_Reduce"])
def test_unknown_collective_raises_naming_the_valid_ones(collective: str) -> None:
    with pytest.raises(ValueError, match=f"unknown collective {collective!r}; expected one of all_gather, "
                                         "reduce_scatter, all_reduce"):
        pccl_torch.algorithms(collective)


@pytest.mark.parametrize("collective", [3, None, ["all_reduce"]])
def test_a_collective_that_is_not_a_string_is_a_type_error(collective: object) -> None:
    with pytest.raises(TypeError, match="collective must be a string, got .*; expected one of all_gather"):
        pccl_torch.algorithms(collective)


def test_unknown_device_raises() -> None:
    with pytest.raises(ValueError, match="unknown device 'gpu'; expected None or one of 'cpu', 'cuda'"):
        pccl_torch.algorithms("all_reduce", "gpu")


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_without_a_device_every_accepted_name(collective: str) -> None:
    assert pccl_torch.algorithms(collective) == pccl_torch.algorithms(collective, None) == valid_names(collective)


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("device, foreign", [("cpu", "nccl"), ("cuda", "gloo")])
def test_runnable_names_leave_out_only_the_other_device_s_library(collective: str, device: str,
                                                                  foreign: str) -> None:
    runnable = runnable_names(collective, device)
    assert [n for n in valid_names(collective) if n not in runnable] == \
        [n for n in valid_names(collective) if intra_library(n) == foreign]
    assert set(names_for(collective, device)) <= set(runnable) == set(runnable) | set(pccl_torch.algorithms(
        collective, device))
    for name in runnable:
        assert resolve(collective, name).name == name
