"""pccl's collectives in torch.profiler traces (``pccl_torch.profiling``) under real ``mpiexec`` runs: every route
(API hot path and Python path, async, hierarchical exact and compressed, the ``pccl`` backend) shows as a
``pccl:<collective>`` range with its arguments, inside torch's ``record_param_comms``, with the phases nested;
and with ``PCCL_HOTPATH=off`` the ranges recorded from Python. Async calls run on the communicator's worker thread
(``PCCL_ASYNC=thread``), where the extension carries the caller's profiler."""

from __future__ import annotations

import pytest

from .conftest import launch_ranks

CALLS = 10
"""The driver's profiled calls (without the extension its three async ones, on the worker thread, are not looked
for)."""


@pytest.mark.multiprocess
@pytest.mark.parametrize("python_path", [False, True], ids=["extension", "python-path"])
def test_every_call_is_a_range_with_its_arguments_and_phases(python_path: bool, tmp_path) -> None:
    run = launch_ranks("profiler_driver.py", 4, *(["--python-path"] if python_path else []),
                       result_dir=tmp_path / "ranks", local_size=2, same=("passed", "calls"),
                       env={"PCCL_ASYNC": "thread", "PCCL_PIPELINE_CHUNKS": "2",
                            **({"PCCL_HOTPATH": "off"} if python_path else {})})
    for r, report in enumerate(run.ranks):
        assert not report["failures"], f"rank {r}:\n" + "\n".join(report["failures"][:10])
    assert run[0]["worker"], "async calls ran inline"
    calls = CALLS - 3 if python_path else CALLS
    assert run[0]["calls"] == calls, run[0]
    assert run[0]["passed"] == calls + 1 + (0 if python_path else 1), run[0]
