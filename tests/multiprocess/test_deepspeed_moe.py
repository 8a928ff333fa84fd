"""DeepSpeed's own mixture-of-experts layer (``deepspeed.moe.layer.MoE``, expert parallel over 4 CPU ranks =
2 emulated nodes x 2, ZeRO-1) trains through the ``pccl`` backend as through gloo: a real client of pccl's
all-to-all."""

from __future__ import annotations

import math
import os

import pytest

from .conftest import ROOT, launch_ranks
from .test_deepspeed import _free_port

RANKS, LOCAL_SIZE, STEPS = 4, 2, 5
ENV = {"TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions")),
       "DS_ACCELERATOR": "cpu"}
LOSS_RTOL = 1e-5
"""The backends may add float32 gradients in different orders: measured up to 8e-8 relative over 6 steps."""


def _train(comm: str, tmp_path) -> list[dict]:
    run = launch_ranks("deepspeed_moe_driver.py", RANKS, "--comm_backend", comm, "--steps", str(STEPS),
                       "--zero-stage", "1", result_dir=tmp_path / comm, local_size=LOCAL_SIZE,
                       env={**ENV, "MASTER_PORT": str(_free_port())},  # not DeepSpeed's 29500: see the driver
                       timeout_s=300)
    for rank in run.ranks:  # one fixed batch a rank: every rank's loss falls every step
        losses = rank["losses"]
        assert len(losses) == STEPS and all(math.isfinite(v) for v in losses), rank
        assert all(b < a for a, b in zip(losses, losses[1:])), (comm, rank["rank"], losses)
    return run.ranks


@pytest.mark.multiprocess
def test_deepspeed_moe_layer_trains_through_pccl(tmp_path) -> None:
    gloo = _train("gloo", tmp_path)
    pccl = _train("pccl", tmp_path)
    for g, p in zip(gloo, pccl):
        assert p["default_group"] == "PcclProcessGroup", p
        assert p["losses"] == pytest.approx(g["losses"], rel=LOSS_RTOL), (p["rank"], p["losses"], g["losses"])
        assert p["bypassed"] == {}, p["bypassed"]  # nothing pccl routes went to gloo
        assert p["pccl_calls"].get("all_reduce", 0) > 0, p["pccl_calls"]
        # DeepSpeed's dispatch and combine, forward and backward: 4 all-to-alls a step, all through pccl
        assert not any(k.startswith(("alltoall", "all_to_all")) for k in p["delegated"]), p["delegated"]
        assert p["pccl_calls"].get("all_to_all", 0) >= 4 * STEPS, p["pccl_calls"]
