"""The Hugging Face ``Trainer`` on pccl: an unchanged Trainer script (``trainer_driver.py``, a tiny GPT-2 built from
a config, CPU, DDP) under ``torchrun --nproc-per-node 2``, once as it is (gloo) and once through
``python -m pccl_torch.run``, which is the route that works on CPU ranks: ``TrainingArguments(ddp_backend="pccl")``
does not, since accelerate keeps only gloo or mpi for CPU (docs/usage.md). Every rank's result and the launch's
exit status are checked."""

from __future__ import annotations

import sys

import pytest

from .conftest import HERE, RankLaunch, collect_ranks, launcher_environment, run_checked
from .rank_result import RESULT_DIR_ENV

pytest.importorskip("transformers", reason="make install installs transformers with the [dev] extra")

DRIVER = str(HERE / "trainer_driver.py")
STEPS = 6


def _train(tmp_path, name: str, *wrapper: str) -> RankLaunch:
    """The driver under `torchrun --standalone --nproc-per-node 2 [wrapper...]`, offline (nothing downloaded)."""
    results = tmp_path / f"{name}-ranks"
    results.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *wrapper,
               DRIVER, "--output-dir", str(tmp_path / name), "--steps", str(STEPS)]
    env = {RESULT_DIR_ENV: str(results), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    process = run_checked(command, launcher_environment(env=env), 300)
    return collect_ranks(process, 2, results, same=("losses", "grad_norms"), what=f"torchrun {name} Trainer")


@pytest.mark.multiprocess
def test_an_unchanged_trainer_script_trains_on_pccl_with_the_losses_of_gloo(tmp_path) -> None:
    gloo = _train(tmp_path, "gloo")
    pccl = _train(tmp_path, "pccl", "-m", "pccl_torch.run")
    for rank, (g, q) in enumerate(zip(gloo.ranks, pccl.ranks)):
        assert g["group"] != "PcclProcessGroup" and g["backend"] == "gloo", g
        assert q["group"] == "PcclProcessGroup" and q["backend"] == "pccl" and q["world_size"] == 2, q
        # DDP's gradient all-reduces (at least one bucket a step) and the Trainer's own went through pccl
        assert q["calls"].get("all_reduce", 0) >= STEPS, (rank, q["calls"])
        assert q["bypassed"] == {}, (rank, q["bypassed"])
        assert len(q["losses"]) == STEPS, q["losses"]
        assert q["losses"] == pytest.approx(g["losses"], rel=1e-5, abs=1e-6), rank
        assert q["grad_norms"] == pytest.approx(g["grad_norms"], rel=1e-5, abs=1e-6), rank
