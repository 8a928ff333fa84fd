"""NCCL's contract where a CPU run can decide it (``contract_driver.py``): one FIFO per group, whatever path serves
a call, and control exchanges that never touch a device library's level. The GPU side is scripts/gpu_check.sh."""

from __future__ import annotations

import pytest

from .conftest import launch_ranks, torchrun_ranks


@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks", [2, 3])
def test_one_fifo_per_group_under_torchrun(ranks: int, tmp_path) -> None:
    """``all_reduce(t, async_op=True); broadcast(t, 0)`` on the worker thread (``PCCL_ASYNC=thread``): the
    delegated broadcast runs after the queued all-reduce every time, on the default group and a second one."""
    run = torchrun_ranks("contract_driver.py", ranks, "--fifo", result_dir=tmp_path / "ranks",
                         env={"PCCL_ASYNC": "thread"})
    for r, entry in enumerate(run.ranks):
        assert entry["async"] == "thread", entry
        assert entry["checks"] > 0 and entry["wrong"] == 0, f"rank {r}: {entry['wrong']} wrong: {entry['failures']}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["torchrun", "mpiexec"])
def test_control_never_crosses_a_device_level(launcher: str, tmp_path) -> None:
    """With pccl's levels behaving as NCCL's (refusing the host tensors of control exchanges), ``init`` and
    checked collectives work: the selector profile, signatures and counts go over the host-capable control level."""
    options = dict(result_dir=tmp_path / "ranks", local_size=2)
    if launcher == "torchrun":
        run = torchrun_ranks("contract_driver.py", 4, "--device-levels", **options)
    else:
        run = launch_ranks("contract_driver.py", 4, "--device-levels", env={"PCCL_TRANSPORT": "torch"}, **options)
    for r, entry in enumerate(run.ranks):
        assert entry["failures"] == [] and entry["refused"] == [], f"rank {r}: {entry}"
        assert entry["emulated_levels"] >= 3 and entry["passed"] == 4, entry
        assert entry["host_syncs"] == {}, f"rank {r}: host-synchronising calls on the data path: {entry['host_syncs']}"
