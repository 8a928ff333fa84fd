"""The mixture-of-experts example (examples/gpt/moe.py, train_moe.py): its layer's gradients against the same
layer whole in one process, and a few training steps with gloo and with pccl under mpiexec (2 emulated nodes
x 2) and torchrun, every rank's result collected after its teardown; on pccl, pccl ran every all-to-all."""

from __future__ import annotations

import math

import pytest

from .conftest import launch_ranks, torchrun_ranks

RANKS, LOCAL_SIZE, STEPS, N_LAYER = 4, 2, 4, 2
TRAIN = ("train", "--steps", str(STEPS), "--n-layer", str(N_LAYER), "--log-every", "0", "--eval-batches", "2")
A2A_PER_LAYER = 5
"""All-to-alls a layer and step: forward the counts, the tokens and the results; backward the two gradients."""
LOSS_RTOL = 1e-5
"""As test_gpt_examples: the backends may add the ranks' float32 gradients in different orders (measured here:
bitwise equal, gloo and pccl, mpiexec and torchrun); a wrong all-to-all or all-reduce moves the losses of steps
2-4 by far more."""
GRAD_ATOL = 1e-12
"""float64, one forward and backward: measured 0 (router 7e-18); a backward that scales the all-to-all's
gradient by 1.001 shows as 1e-5 to 4e-3."""


def _check_training(ranks: list[dict], what: str) -> list[float]:
    """Every rank saw the same finite, falling losses; returns them."""
    losses = ranks[0]["losses"]
    assert len(losses) == STEPS and all(math.isfinite(v) for v in losses), (what, losses)
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < losses[0] - 0.3, (what, losses)
    return losses


@pytest.mark.multiprocess
def test_moe_gradients_match_the_layer_in_one_process(tmp_path) -> None:
    run = launch_ranks("moe_driver.py", RANKS, "grads", "--backend", "pccl", result_dir=tmp_path / "grads",
                       local_size=LOCAL_SIZE, timeout_s=120)
    for rank in run.ranks:
        assert all(e <= GRAD_ATOL for e in rank["errors"].values()), rank
        assert rank["expert_grad_norm"] > 0, rank
        # the dispatch and the combine, each split unevenly over the ranks
        assert len(rank["splits"]) == 4 and any(len(set(s)) > 1 for s in rank["splits"]), rank["splits"]


def _train(launcher, comm: str, tmp_path, name: str) -> list[dict]:
    run = launcher("moe_driver.py", RANKS, *TRAIN, "--comm", comm, result_dir=tmp_path / name,
                   same=("losses", "val_loss"), local_size=LOCAL_SIZE, timeout_s=180)
    return run.ranks


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", [launch_ranks, torchrun_ranks], ids=["mpiexec", "torchrun"])
def test_moe_trains_the_same_with_pccl_as_with_gloo(launcher, tmp_path) -> None:
    gloo = _train(launcher, "gloo", tmp_path, "gloo")
    gloo_losses = _check_training(gloo, "gloo")
    # the gloo meter wraps torch.distributed.all_to_all_single: every all-to-all of the model was made through it
    assert gloo[0]["all_to_all_calls"] == [A2A_PER_LAYER * N_LAYER] * STEPS, gloo[0]["all_to_all_calls"]

    pccl = _train(launcher, "pccl", tmp_path, "pccl")
    pccl_losses = _check_training(pccl, "pccl")
    assert pccl_losses == pytest.approx(gloo_losses, rel=LOSS_RTOL), (pccl_losses, gloo_losses)
    assert pccl[0]["val_loss"] == pytest.approx(gloo[0]["val_loss"], rel=LOSS_RTOL)
    for rank in pccl:
        assert rank["bypassed"] == {}, rank["bypassed"]  # every routed call (all-reduce, all-to-all) ran in pccl
        # pccl ran every all-to-all of the model (its own counters, per step) and handed none to gloo
        assert rank["backend_serves_all_to_all"], "the pccl backend delegates all_to_all_single to gloo"
        assert rank["all_to_all_calls"] == [A2A_PER_LAYER * N_LAYER] * STEPS, rank["all_to_all_calls"]
        assert rank["pccl_all_to_all_calls"] >= A2A_PER_LAYER * N_LAYER * STEPS, rank
        assert not any(k.startswith(("alltoall", "all_to_all")) for k in rank["delegated"]), rank["delegated"]
        assert any(k.startswith("all_to_all:") for k in rank["algorithms"]), rank["algorithms"]
