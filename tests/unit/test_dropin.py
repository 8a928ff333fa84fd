"""Drop-in pieces that need no process group: the adapters as attributes of ``pccl_torch``, the backend string
``python -m pccl_torch.run`` forces, and torch's reduce ops as the pccl backend reads them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from pccl_torch.integrations.torch_backend import pccl_reduce_op
from pccl_torch.ops import ReduceOp, Reduction
from pccl_torch.run import pccl_backend


def test_the_adapters_are_attributes_after_import_pccl_torch_and_deepspeed_stays_unimported() -> None:
    code = ("import sys, pccl_torch\n"
            "i = pccl_torch.integrations\n"
            "assert callable(i.ddp.allreduce_hook) and callable(i.deepspeed.add_comm_arguments)\n"
            "assert callable(i.fsdp.use_pccl) and callable(i.torch_backend.bypassed)\n"
            "assert 'deepspeed' not in sys.modules, 'deepspeed imported eagerly'\n"
            "assert {'ddp', 'deepspeed', 'fsdp', 'torch_backend'} <= set(dir(i))\n"
            "try:\n    i.no_such_adapter\nexcept AttributeError as e:\n    print(e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "has no attribute 'no_such_adapter'" in result.stdout


@pytest.mark.parametrize("asked,forced", [
    (None, "pccl"), ("gloo", "pccl"), ("nccl", "pccl"), ("cpu:gloo,cuda:nccl", "pccl"), ("mpi", "pccl"),
    ("pccl", "pccl"), ("cpu:gloo,cuda:pccl", "pccl"), ("cpu:gloo,xpu:xccl", "cpu:pccl,xpu:xccl"),
])
def test_run_gives_pccl_every_device_it_runs_on(asked: str | None, forced: str) -> None:
    assert pccl_backend(asked) == forced


@pytest.mark.parametrize("op,dtype,expected", [
    (dist.ReduceOp.SUM, torch.int32, ReduceOp.SUM),
    (dist.ReduceOp(dist.ReduceOp.MAX), torch.float32, ReduceOp.MAX),
    (dist.ReduceOp.AVG, torch.bfloat16, ReduceOp.AVG),
    (dist.ReduceOp.PRODUCT, torch.int64, ReduceOp.PRODUCT),
])
def test_torch_ops_pccl_implements(op, dtype: torch.dtype, expected: ReduceOp) -> None:
    assert pccl_reduce_op(op, dtype) is expected


@pytest.mark.parametrize("factor", [0.5, torch.tensor(0.25)])
def test_premul_sum_reads_its_factor(factor) -> None:
    reduction = pccl_reduce_op(dist._make_nccl_premul_sum(factor), torch.float32)
    assert isinstance(reduction, Reduction) and reduction.op is ReduceOp.PREMUL_SUM
    assert reduction.pre_scale == float(factor)


@pytest.mark.parametrize("op,dtype,kind", [
    (dist.ReduceOp.BAND, torch.int32, "op BAND"), (dist.ReduceOp(dist.ReduceOp.BXOR), torch.uint8, "op BXOR"),
    (dist.ReduceOp.AVG, torch.int64, "op AVG on int64"),
    (dist._make_nccl_premul_sum(2.0), torch.int32, "op PREMUL_SUM on int32"),
])
def test_ops_pccl_does_not_implement_name_their_kind(op, dtype: torch.dtype, kind: str) -> None:
    with pytest.raises(ValueError) as raised:
        pccl_reduce_op(op, dtype)
    assert str(raised.value) == kind
