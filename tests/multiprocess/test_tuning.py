"""Online tuning (PCCL_TUNE=online) under mpiexec: identical choices on every rank under a skewed clock and load,
right results throughout, the cache reused by the next run, bad cache entries rejected, and tuning off unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pccl_torch.selection.tuning import SMALL_BYTES, SMALL_TRIALS, SWITCH_MARGIN, TRIALS, WARMUP

from .conftest import launch_ranks

LAYOUT = {"ranks": 4, "nodes": 2, "local_size": 2, "hosts": 1, "transport": "mpi", "device": "cpu"}


def _run(cache: Path, *args: str) -> tuple[list[dict], str]:
    """One launch: exit status 0, every rank's result (written after its shutdown), no wrong element, and the
    same algorithm at every call and the same locked-in choices on every rank."""
    run = launch_ranks("tuning_driver.py", 4, *args, result_dir=cache.parent / f"ranks-{len(list(cache.parent.glob('ranks-*')))}",
                       local_size=2, env={"PCCL_TUNE_CACHE": str(cache)}, timeout_s=600, same=("ran", "tuning", "default"))
    assert [r["wrong"] for r in run.ranks] == [0, 0, 0, 0]
    return run.ranks, run.process.stderr


@pytest.mark.multiprocess
def test_online_tuning_agrees_under_skew_and_the_cache_serves_the_next_run(tmp_path) -> None:
    cache = tmp_path / "tuned.json"
    ranks, _ = _run(cache, "--tune", "online", "--skew-rank", "1")
    tuning, ran = ranks[0]["tuning"], ranks[0]["ran"]
    assert len(tuning) == 4
    for key, entry in tuning.items():
        tried = entry["tried"]
        shape = key.rsplit(":", 1)[0]
        calls, model = ran[shape], ranks[0]["default"][shape]
        assert entry["source"] == "online" and len(tried) >= 2
        fastest = min(tried, key=tried.__getitem__)
        # the fastest, where it beats the model's choice by the margin; else the model's choice
        assert entry["chosen"] == (fastest if tried[fastest] < SWITCH_MARGIN * tried[model] else model)
        assert calls[0] == model  # the model's pick first: a shape called once costs nothing
        explored = len(tried) * (WARMUP + (SMALL_TRIALS if int(shape.split(":")[1]) < SMALL_BYTES else TRIALS))
        assert set(calls[:explored]) == set(tried) and set(calls[explored:]) == {entry["chosen"]}
    saved = json.loads(cache.read_text())["entries"]
    assert saved == [{"layout": LAYOUT, "choices": {k: v["chosen"] for k, v in tuning.items()}}]

    again, _ = _run(cache, "--tune", "online")
    for key, entry in again[0]["tuning"].items():
        assert entry == {"tried": {}, "chosen": tuning[key]["chosen"], "source": "cache"}
        assert set(again[0]["ran"][key.rsplit(":", 1)[0]]) == {tuning[key]["chosen"]}  # nothing explored


@pytest.mark.multiprocess
def test_bad_cache_entries_are_rejected_and_never_run(tmp_path) -> None:
    cache = tmp_path / "tuned.json"
    cache.write_text(json.dumps({"format": "pccl-tuned-choices", "entries": [{"layout": LAYOUT, "choices": {
        "all_reduce:65536:float32": "hier:nonsense", "all_gather:1048576:float32": "rabenseifner",
        "broadcast:1048576:float32": "ring"}}]}))
    ranks, stderr = _run(cache, "--tune", "online")
    assert "ignoring cache entry all_reduce:65536:float32 -> 'hier:nonsense'" in stderr
    assert "ignoring cache entry all_gather:1048576:float32 -> 'rabenseifner'" in stderr  # an all-reduce schedule
    assert "ignoring cache entry broadcast:1048576:float32" in stderr
    for key in ("all_reduce:65536:float32", "all_gather:1048576:float32"):
        assert ranks[0]["tuning"][key]["source"] == "online"  # tuned afresh instead
    assert not any(n in ("hier:nonsense", "rabenseifner") for calls in ranks[0]["ran"].values() for n in calls)
    cache.write_text("{not json")
    _, stderr = _run(cache, "--tune", "online")
    assert "ignoring the unreadable cache" in stderr


@pytest.mark.multiprocess
def test_tuning_off_keeps_the_models_choice(tmp_path) -> None:
    ranks, _ = _run(tmp_path / "unused.json", "--tune", "off")
    assert ranks[0]["tuning"] == {}
    for shape, calls in ranks[0]["ran"].items():
        assert set(calls) == {ranks[0]["default"][shape]}
    assert not (tmp_path / "unused.json").exists()
