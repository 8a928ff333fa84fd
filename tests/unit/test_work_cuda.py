"""Queued (async) calls on CUDA run on the stream that was current where they were issued (``pccl_torch.work``)."""

from __future__ import annotations

import pytest
import torch

from pccl_torch.work import Queue

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU check runs it)")


@needs_gpu
def test_queued_call_runs_on_the_issuing_threads_stream() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    executor = Queue("test", device=device)
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        ran_on = executor.submit(lambda: torch.cuda.current_stream(device)).result()
    assert ran_on == side
    assert executor.submit(lambda: torch.cuda.current_stream(device)).result() == torch.cuda.current_stream(device)
    executor.shutdown()


def test_host_executor_leaves_streams_alone() -> None:
    executor = Queue("test", device=torch.device("cpu"))
    assert executor.submit(lambda: 41 + 1).result() == 42
    executor.shutdown()
