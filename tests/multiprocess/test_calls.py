"""The call-shape cache (``pccl_torch.calls``) under real ``mpiexec`` runs: 1..6 ranks, flat and emulated nodes."""

from __future__ import annotations

import pytest

from .conftest import launch_ranks

# (ranks, ranks per emulated node, PCCL_WAIT): MPI's bound blocking collectives run where waits block (by
# default only where every rank has a core: 1 and 2 ranks here), the polled transport elsewhere; forced blocking on
# more ranks than cores once, on two levels (6 ranks spinning in MPICH's waits on 2 cores: the slowest layout).
LAYOUTS = [(1, 1, "auto"), (2, 1, "auto"), (3, 1, "auto"), (4, 2, "auto"), (5, 1, "auto"), (6, 3, "blocking")]


@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks,local_size,wait", LAYOUTS, ids=[f"n{n}-L{l}-{w}" for n, l, w in LAYOUTS])
def test_cached_call_shapes_stay_correct_and_checked(ranks: int, local_size: int, wait: str, tmp_path) -> None:
    run = launch_ranks("calls_driver.py", ranks, result_dir=tmp_path / "ranks", local_size=local_size,
                       same=("passed",), env={"PCCL_WAIT": wait})
    for r, report in enumerate(run.ranks):
        assert not report["failures"], f"rank {r}:\n" + "\n".join(report["failures"][:10])
        assert report["world"] == ranks
    # 4 algorithms at most x 3 dtypes x 4 sizes x ops (2 int, 4 float) x 2 op kinds, plus 6 checks
    assert run[0]["passed"] >= 3 * 4 * (2 + 4 + 4) * 2 + 6, run[0]["passed"]
