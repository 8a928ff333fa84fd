"""The compiled hot path (``pccl_torch.hotpath``) under real ``mpiexec`` runs: blocking and polled waits, flat and
emulated nodes, odd rank counts; and the Python path alone with ``PCCL_HOTPATH=off``."""

from __future__ import annotations

import pytest

from .conftest import launch_ranks

# (ranks, ranks per emulated node, PCCL_WAIT): blocking calls (persistent up to 4 KiB) and polled ones.
LAYOUTS = [(2, 1, "auto"), (3, 1, "auto"), (3, 1, "blocking"), (4, 2, "auto"), (5, 1, "bounded"), (6, 3, "blocking")]


@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks,local_size,wait", LAYOUTS, ids=[f"n{n}-L{l}-{w}" for n, l, w in LAYOUTS])
def test_hot_calls_match_the_python_path(ranks: int, local_size: int, wait: str, tmp_path) -> None:
    run = launch_ranks("hotpath_driver.py", ranks, result_dir=tmp_path / "ranks", local_size=local_size,
                       same=("passed", "hits"), env={"PCCL_WAIT": wait})
    for r, report in enumerate(run.ranks):
        assert not report["failures"], f"rank {r}:\n" + "\n".join(report["failures"][:10])
    assert run[0]["blocking"] == (wait == "blocking" or (wait == "auto" and ranks <= 2)), run[0]["blocking"]
    assert run[0]["hits"] >= 420, run[0]["hits"]  # the bound calls of the driver ran in the extension (455)
    assert run[0]["passed"] == 1 + 5 * 5 + 8, run[0]["passed"]


@pytest.mark.multiprocess
def test_python_path_alone(tmp_path) -> None:
    """With ``PCCL_HOTPATH=off`` the public calls are the Python functions and the call-shape cache's driver
    passes on them alone."""
    run = launch_ranks("calls_driver.py", 3, result_dir=tmp_path / "ranks", same=("passed",),
                       env={"PCCL_HOTPATH": "off", "PCCL_WAIT": "blocking"})
    for r, report in enumerate(run.ranks):
        assert not report["failures"], f"rank {r}:\n" + "\n".join(report["failures"][:10])
