"""c10d's conventions on a pccl group (issue 59), each in one real launch against a gloo group of the same ranks
(``c10d_driver.py``): the values of every Work's future, DDP with a ``.then``-chaining comm hook and with
PowerSGD, and ``monitored_barrier`` naming the rank that did not arrive."""

from __future__ import annotations

import pytest

from .conftest import RankLaunch, launch_ranks

CALL_FORMS = (
    "allreduce", "allreduce_coalesced", "allgather", "allgather_base", "allgather_into_tensor_coalesced",
    "reduce_scatter", "reduce_scatter_base", "reduce_scatter_tensor_coalesced", "alltoall_base", "alltoall",
    "broadcast", "barrier", "allreduce_uint8", "gather", "scatter", "reduce", "dist_all_reduce",
    "dist_all_gather_into_tensor", "dist_all_to_all_single", "dist_reduce_scatter_tensor",
)
"""Every ProcessGroup call form gloo defines (routed through pccl, delegated, or handed over for its dtype) and
the ``dist.*`` calls over them: the driver must check each one."""
FUTURE_CHECKS = {f"future: {name}" for name in CALL_FORMS} | {"DDP: allreduce_with_then_hook", "DDP: powerSGD_hook"}
BARRIER_CHECKS = {
    "pccl_torch.monitored_barrier: every rank arrives", "pccl_torch.monitored_barrier: the last rank missing",
    "pccl_torch.monitored_barrier: the last rank missing, wait_all_ranks",
    "dist.monitored_barrier under force_torch_backend: every rank arrives",
    "dist.monitored_barrier under force_torch_backend: the last rank missing",
}


def _passed(run: RankLaunch, checks: set[str]) -> None:
    for rank, result in enumerate(run.ranks):
        assert result["failures"] == [], f"rank {rank}:\n" + "\n".join(result["failures"])
        assert set(result["passed"]) == checks, f"rank {rank} ran {result['passed']}"


@pytest.mark.multiprocess
def test_futures_hold_gloos_values_and_ddp_hooks_train_as_on_gloo(tmp_path) -> None:
    """At 2 ranks: each call form's future holds gloo's value (lists of the output tensors), NCCL's where gloo's
    Work has none; DDP with torch's test base `.then` hook and with `powerSGD_hook` ends with gloo's parameters."""
    _passed(launch_ranks("c10d_driver.py", 2, "--futures", result_dir=tmp_path / "ranks", timeout_s=300),
            FUTURE_CHECKS)


@pytest.mark.multiprocess
def test_monitored_barrier_names_the_rank_that_did_not_arrive(tmp_path) -> None:
    """At 3 ranks, rank 2 absent: rank 0's error names rank 2, rank 1's names rank 0 (gloo's messages), through
    `pccl_torch.monitored_barrier` and through `dist.monitored_barrier` under `force_torch_backend`."""
    _passed(launch_ranks("c10d_driver.py", 3, "--monitored-barrier", result_dir=tmp_path / "ranks", timeout_s=120),
            BARRIER_CHECKS)
