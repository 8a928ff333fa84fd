"""The selector across real ranks: rank 0's profile is broadcast, so ranks with different profiles still
make the same choice; a bad profile fails on every rank with the same clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pccl_torch.selection.learned.dataset import Case, cases_from_model
from pccl_torch.selection.learned.runtime import Selector
from pccl_torch.selection.learned.train import train
from pccl_torch.sim.machine import load as load_machine
from pccl_torch.topology import Topology

from .conftest import HERE, ROOT, collect_ranks, mpiexec
from .rank_result import RESULT_DIR_ENV
from .selector_agreement import CALLS

SCRIPT = str(HERE / "selector_agreement.py")


def _two_ranks(profile_0: str, profile_1: str, results: Path) -> tuple[dict, list[dict]]:
    """Rank 0's summary line and both ranks' own results (exit status 0 checked, both results present)."""
    command = [mpiexec(), "-n", "1", "-env", "PCCL_PROFILE", profile_0, "-env", "PCCL_LOCAL_SIZE", "1",
               sys.executable, SCRIPT, ":", "-n", "1", "-env", "PCCL_PROFILE", profile_1, "-env",
               "PCCL_LOCAL_SIZE", "1", sys.executable, SCRIPT]
    results.mkdir()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, RESULT_DIR_ENV: str(results)})
    ranks = collect_ranks(result, 2, results, what="selector_agreement.py").ranks
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(lines[-1]), ranks


@pytest.mark.multiprocess
def test_ranks_with_different_profiles_make_rank_0s_choices(tmp_path) -> None:
    machine = load_machine("perlmutter")
    cases = [Case(c.collective, c.nbytes, c.ranks, c.local_size, c.dtype_size, c.link_ratio, c.times, "measured")
             for c in cases_from_model(machine, [(2, 1), (4, 2)], [1 << k for k in range(10, 25)])]
    profile, _, _ = train(cases, machine_profile=machine.to_dict(), candidates=["tree"])
    mine = tmp_path / "rank0.json"
    profile.save(mine)
    shipped = ROOT / "configs" / "selector" / "default.json"
    report, ranks = _two_ranks(str(mine), str(shipped), tmp_path / "ranks")
    assert report["agreed"]
    expected = Selector(profile)
    topo = Topology(0, 2, 1)
    assert report["choices"] == [expected.choose(c, n, topo, 4) for c, n in CALLS]
    assert [r.get("choices") for r in ranks] == [report["choices"]] * 2  # each rank's own record


@pytest.mark.multiprocess
def test_a_bad_profile_fails_on_every_rank(tmp_path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "pccl-selector"')
    report, ranks = _two_ranks(str(broken), str(ROOT / "configs" / "selector" / "default.json"), tmp_path / "ranks")
    assert len(report["errors"]) == 2
    assert all("ProfileError" in e and "not a pccl selector profile" in e for e in report["errors"])
    assert all("ProfileError" in r.get("error", "") for r in ranks), ranks
