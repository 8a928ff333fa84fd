"""The example scripts' device choice (``--device``): the process-group backend each ``--comm`` gets on host and
CUDA tensors, and the errors a CPU-only machine gives for CUDA runs, before any process group exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "gpt"


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import harness as module
        yield module
    finally:
        sys.path.remove(str(EXAMPLES))


def test_process_group_backends(harness):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert [harness.process_group_backend(c, cpu) for c in ("pccl", "gloo")] == ["pccl", "gloo"]
    assert [harness.process_group_backend(c, cuda) for c in ("pccl", "gloo", "nccl")] == [
        "cpu:gloo,cuda:pccl", "gloo", "cpu:gloo,cuda:nccl"]
    with pytest.raises(SystemExit, match="--comm nccl needs --device cuda"):
        harness.process_group_backend("nccl", cpu)


def test_every_script_takes_device(harness):
    parser = harness.build_parser(None)
    assert parser.parse_args([]).device == "cpu" and parser.parse_args(["--device", "cuda"]).device == "cuda"
    assert harness.select_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("script", ["train_ddp.py", "train_fsdp.py", "train_moe.py"])
def test_cuda_without_a_gpu_says_so(script):
    done = subprocess.run([sys.executable, str(EXAMPLES / script), "--device", "cuda", "--steps", "1"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode != 0
    assert "--device cuda: no CUDA device here" in done.stderr


def test_deepspeed_refuses_a_contradicting_accelerator():
    # PCCL_HOTPATH=off: the refusal comes before any collective, and with HOME at the repository the first import
    # would otherwise compile the hot path into its .cache (~17 s of a fresh clone's suite) for nothing.
    env = {"PATH": "/usr/bin:/bin", "DS_ACCELERATOR": "cpu", "HOME": str(REPO), "PCCL_HOTPATH": "off"}
    done = subprocess.run([sys.executable, str(EXAMPLES / "train_deepspeed.py"), "--device", "cuda", "--steps", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert done.returncode != 0
    assert "--device cuda with DS_ACCELERATOR=cpu" in done.stderr
