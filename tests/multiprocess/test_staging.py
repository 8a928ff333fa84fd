"""Host staging of the MPI transport (the path CUDA tensors take without CUDA-aware MPI), run on host tensors
under real ``mpiexec`` launches: 2..6 ranks, flat and emulated nodes (``staging_driver.py``)."""

from __future__ import annotations

import pytest

from .conftest import launch_ranks

LAYOUTS = [(2, 1), (3, 1), (4, 2), (5, 1), (6, 3)]


@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks,local_size", LAYOUTS, ids=[f"n{n}-L{l}" for n, l in LAYOUTS])
def test_staged_chunks_are_exact(ranks: int, local_size: int, tmp_path) -> None:
    run = launch_ranks("staging_driver.py", ranks, result_dir=tmp_path / "ranks", local_size=local_size,
                       same=("passed",))
    for r, report in enumerate(run.ranks):
        assert not report["failures"], f"rank {r}:\n" + "\n".join(report["failures"][:10])
        assert report["world"] == ranks
    transports = 3  # the world, inter-node and intra-node levels (one of them may hold a single rank)
    algorithms = 2 + (local_size > 1) * 2
    assert run[0]["passed"] == (transports * 2 + algorithms) * 4 * 5, run[0]["passed"]
