"""Online tuning's pieces that need no ranks: the mode, the cache file, and which cache entries are taken."""

from __future__ import annotations

import json

import pytest

from pccl_torch.selection import tuning
from pccl_torch.selection.tuning import CACHE_FORMAT, Tuner, cached_choices, mode_from_env, valid_names

LAYOUT = {"ranks": 4, "nodes": 2, "local_size": 2, "hosts": 2, "transport": "mpi", "device": "cpu"}


def test_mode_defaults_to_off_and_is_validated(monkeypatch) -> None:
    monkeypatch.delenv("PCCL_TUNE", raising=False)
    assert mode_from_env() == "off"
    monkeypatch.setenv("PCCL_TUNE", "Online")
    assert mode_from_env() == "online"
    assert mode_from_env("off") == "off"  # init(tune=...) wins over the variable
    with pytest.raises(ValueError, match=r"init\(tune=...\): 'always' is not a valid tuning mode; expected one of "
                                         r"off, online"):
        mode_from_env("always")
    monkeypatch.setenv("PCCL_TUNE", "sometimes")
    with pytest.raises(ValueError, match=r"PCCL_TUNE: 'sometimes' is not a valid tuning mode"):
        mode_from_env()


def test_cache_holds_one_entry_per_layout(tmp_path) -> None:
    path = tmp_path / "tuned.json"
    other = {**LAYOUT, "transport": "torch:gloo"}
    path.write_text(json.dumps({"format": CACHE_FORMAT, "entries": [
        {"layout": other, "choices": {"all_reduce:1024:float32": "ring"}},
        {"layout": LAYOUT, "choices": {"all_reduce:1024:float32": "hier:mpi"}}]}))
    assert cached_choices(path, LAYOUT) == {"all_reduce:1024:float32": "hier:mpi"}
    assert cached_choices(path, {**LAYOUT, "ranks": 8}) == {}
    tuner = Tuner(LAYOUT, path)
    tuner.locked = {"all_gather:4096:float32": "hier:pipelined"}
    tuner._save()  # replaces this layout's entry, keeps the other one
    entries = json.loads(path.read_text())["entries"]
    assert entries == [{"layout": other, "choices": {"all_reduce:1024:float32": "ring"}},
                       {"layout": LAYOUT, "choices": {"all_gather:4096:float32": "hier:pipelined"}}]


def test_foreign_files_are_ignored_with_a_warning(tmp_path, caplog) -> None:
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"format": "pccl-selector-profile", "entries": []}))
    assert cached_choices(path, LAYOUT) == {}
    assert "not a pccl tuning cache" in caplog.text
    path.write_text("[1, 2")
    assert cached_choices(path, LAYOUT) == {}
    assert "ignoring the unreadable cache" in caplog.text
    assert cached_choices(tmp_path / "absent.json", LAYOUT) == {}


def test_a_foreign_file_at_the_cache_path_is_never_overwritten(tmp_path, caplog) -> None:
    path = tmp_path / "profile.json"
    foreign = json.dumps({"format": "pccl-selector-profile", "tree": [1, 2, 3]})
    path.write_text(foreign)
    tuner = Tuner(LAYOUT, path)
    tuner.locked = {"all_reduce:1024:float32": "ring"}
    tuner._save()
    tuner._save()
    assert path.read_text() == foreign
    assert caplog.text.count("the file exists and is not a pccl tuning cache") == 1


def test_entries_that_cannot_run_here_are_rejected(caplog) -> None:
    tuner = Tuner(LAYOUT)
    tuner.adopt({"all_reduce:1024:float32": "hier:pipelined", "all_gather:1024:float32": "rabenseifner",
                 "reduce_scatter:1024:float32": 7, "broadcast:1024:float32": "ring",
                 "all_reduce:2048:float32": "hier-nccl:ring"}, "cache.json", valid_names("cpu"))
    assert tuner.locked == {"all_reduce:1024:float32": "hier:pipelined"}
    assert tuner.report["all_reduce:1024:float32"] == {"tried": {}, "chosen": "hier:pipelined", "source": "cache"}
    for key in ("all_gather:1024:float32", "reduce_scatter:1024:float32", "broadcast:1024:float32",
                "all_reduce:2048:float32"):
        assert f"ignoring cache entry {key}" in caplog.text


def test_exploration_runs_each_candidate_in_turn_with_a_probe() -> None:
    from pccl_torch.plan import resolve

    plans = [resolve("all_reduce", name) for name in ("mpi", "hier:mpi")]
    trial = tuning.Exploration(plans, tuning.TRIALS, warmup=1)
    issued = [trial.next_plan() for _ in range(len(plans) * (1 + tuning.TRIALS))]
    assert [p.name for p in issued] == ["mpi", "hier:mpi"] * (1 + tuning.TRIALS)
    warm, timed = issued[:len(plans)], issued[len(plans):]
    assert warm == plans and all(p.probe is None for p in warm)  # one untimed round first
    for seconds, plan in enumerate(timed):
        plan.probe(float(seconds))
    assert trial.samples == [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]] and not trial.exploring
    assert timed[0] == plans[0]  # the probe does not change what the plan is


def test_pccl_tune_explain_shows_the_model_and_the_tuned_choice(tmp_path, monkeypatch, capsys) -> None:
    from pccl_torch.selection.learned import cli

    cache = tmp_path / "tuned.json"
    cache.write_text(json.dumps({"format": CACHE_FORMAT, "entries": [
        {"layout": LAYOUT, "choices": {"all_reduce:1048576:float32": "hier:ring"}}]}))
    monkeypatch.setenv("PCCL_TUNE_CACHE", str(cache))
    assert cli.main(["--explain", "-c", "all_reduce", "--bytes", "1M", "--ranks", "4", "--local-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "predicted (us)" in out and "\nchoice: " in out
    assert "all_reduce:1048576:float32 -> hier:ring" in out and "mpi on cpu, 2 host(s)" in out
