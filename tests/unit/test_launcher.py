"""Launches without mpiexec (pccl_torch.launcher): which transport, the topology from a store, and the errors a
launch pccl cannot serve gets. This pytest process is a real MPI singleton (a world of one)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch.distributed as dist

from pccl_torch import launcher
from pccl_torch.launcher import LaunchError, topology_from_store, transport_for

CLEAN = ("PCCL_TRANSPORT", "PCCL_LOCAL_SIZE", *launcher.LAUNCH_VARIABLES)


@pytest.fixture(autouse=True)
def _no_launcher_variables(monkeypatch) -> None:
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)


def test_a_singleton_in_a_larger_torch_world_runs_over_torch_groups() -> None:
    assert transport_for(0, 1) == "mpi"  # a world of one: MPI's world is torch's
    assert transport_for(2, 4) == "torch"


def test_pccl_transport_forces_and_is_validated(monkeypatch) -> None:
    monkeypatch.setenv("PCCL_TRANSPORT", "torch")
    assert transport_for(0, 1) == "torch"
    monkeypatch.setenv("PCCL_TRANSPORT", "shm")
    with pytest.raises(ValueError, match=r"PCCL_TRANSPORT='shm' is not a valid transport; expected one of auto, mpi"):
        transport_for(0, 1)


def test_mpi_forced_without_an_mpi_launch_names_the_launcher_variables(monkeypatch) -> None:
    monkeypatch.setenv("PCCL_TRANSPORT", "mpi")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(LaunchError) as raised:
        transport_for(1, 4)
    message = str(raised.value)
    assert "PCCL_TRANSPORT=mpi needs an MPI launch" in message
    assert "Launcher variables found: RANK=1 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2" in message


def test_missing_rendezvous_variables_are_named(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(LaunchError, match=r"MASTER_ADDR, MASTER_PORT are not set \(launcher variables found: "
                                          r"RANK=0 WORLD_SIZE=2\)"):
        launcher.require_env_rendezvous()


def test_init_under_an_incomplete_launch_fails_before_any_communication() -> None:
    """A real process: RANK and WORLD_SIZE without the rendezvous address: init() says what is missing."""
    code = "import pccl_torch\ntry:\n    pccl_torch.init()\nexcept Exception as e:\n    print(type(e).__name__, e)"
    env = {"RANK": "0", "WORLD_SIZE": "2", "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "LaunchError" in result.stdout and "MASTER_ADDR, MASTER_PORT are not set" in result.stdout, result


def _publish(store: dist.Store, rank: int, node: str, kernel: str = "k") -> None:
    store.set(f"pccl/place/{rank}", json.dumps({"node": node, "kernel": kernel, "local": None}))


def test_topology_from_torchrun_node_ranks(monkeypatch) -> None:
    """Ranks of node GROUP_RANK=1 among two nodes of two: this rank (3) is local rank 1 of node 1."""
    store = dist.HashStore()
    for rank, node in enumerate(["GROUP_RANK=0", "GROUP_RANK=0", "GROUP_RANK=1"]):
        _publish(store, rank, node, kernel=f"machine{node[-1]}")
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setattr(launcher, "kernel_id", lambda: "machine1")
    topology = topology_from_store(store, 3, 4)
    assert (topology.num_nodes, topology.local_size, topology.node, topology.local_rank) == (2, 2, 1, 1)
    assert topology.hosts == 2 and topology.networked and topology.cpu_ranks == 2


def test_topology_override_and_unequal_nodes(monkeypatch) -> None:
    store = dist.HashStore()
    for rank in range(3):
        _publish(store, rank, "host=a")
    monkeypatch.setattr(launcher.socket, "gethostname", lambda: "a")
    monkeypatch.setenv("PCCL_LOCAL_SIZE", "2")
    emulated = topology_from_store(store, 3, 4)
    assert (emulated.num_nodes, emulated.local_size, emulated.hosts) == (2, 2, 1)
    uneven = dist.HashStore()
    for rank, host in enumerate(["host=a", "host=a", "host=a"]):
        _publish(uneven, rank, host)
    monkeypatch.delenv("PCCL_LOCAL_SIZE")
    monkeypatch.setattr(launcher.socket, "gethostname", lambda: "b")
    flat = topology_from_store(uneven, 3, 4)  # three ranks on a, one on b: not equal nodes, so flat
    assert (flat.num_nodes, flat.local_size, flat.hosts) == (4, 1, 2)


@pytest.mark.parametrize("kernels, interpret, expected", [
    ("bogus", "1", "ValueError PCCL_KERNELS='bogus'; expected one of auto, torch, triton"),
    ("triton", "0", "RuntimeError Triton kernels cannot run on cpu tensors"),
])
def test_a_bad_kernel_setting_fails_init_not_a_collective(kernels: str, interpret: str, expected: str) -> None:
    """A real process: PCCL_KERNELS that cannot serve the communicator's device fails ``init()``, where a
    collective would otherwise fail mid-job and break the communicator."""
    code = ("import pccl_torch\ntry:\n    pccl_torch.init()\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
            "print('initialized', pccl_torch.is_initialized())")
    env = {"PCCL_KERNELS": kernels, "TRITON_INTERPRET": interpret, "PATH": "/usr/bin:/bin",
           "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert expected in result.stdout and "initialized False" in result.stdout, result
