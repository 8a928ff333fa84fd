"""A short soak in CI (the full 5,000-call run: ``python -m tests.multiprocess.soak``, see its docstring)."""

from __future__ import annotations

import json

import pytest

from .conftest import launch

pytestmark = pytest.mark.multiprocess

CALLS = 400
RSS_GROWTH_LIMIT_MIB = 64.0  # generous: allocator noise, not a leak per call (400 calls x 256 KiB = 100 MiB)


def test_random_collectives_all_verified_and_memory_bounded() -> None:
    result = launch("-m", 4, "tests.multiprocess.soak", "--calls", str(CALLS), local_size=2, timeout_s=900)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.returncode == 0 and lines, result.stdout[-2000:] + result.stderr[-4000:]
    summary = json.loads(lines[-1])
    assert summary["calls"] == CALLS and summary["wrong"] == 0
    assert max(summary["rss_growth_mib_per_rank"]) < RSS_GROWTH_LIMIT_MIB, summary
