"""The GPU check's judges (``scripts/gpu_check_lib.py``) on synthetic rows: host staging's staged CUDA time over host
time, and every verdict of issue 52's CUDA contract (losses, host return, sync debug, streams and FIFO, networked
plans, FSDP2 step time, the CPU FIFO) with the summary that folds them in."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _lib():
    spec = importlib.util.spec_from_file_location("gpu_check_lib", ROOT / "scripts" / "gpu_check_lib.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(label: str, collective: str, size: int, time_us: float, algorithm: str = "mpi") -> dict:
    return {"label": label, "algorithm": algorithm, "collective": collective, "size_bytes": size,
            "time_us": time_us}


def test_staging_ratio_from_16_mib_with_goal(tmp_path: Path) -> None:
    lib = _lib()
    mib = 1 << 20
    (tmp_path / "pccl-bench-w2.json").write_text(json.dumps([
        _row("pccl", "all_reduce", 4 * mib, 900.0), _row("pccl", "all_reduce", 16 * mib, 1200.0),
        _row("pccl", "all_gather", 16 * mib, 2000.0), _row("nccl", "all_reduce", 16 * mib, 100.0),
        _row("pccl", "reduce_scatter", 16 * mib, 100.0, algorithm="vendor")]))
    (tmp_path / "pccl-bench-w2-host.json").write_text(json.dumps([
        _row("pccl", "all_reduce", 4 * mib, 100.0), _row("pccl", "all_reduce", 16 * mib, 1000.0),
        _row("pccl", "all_gather", 16 * mib, 1000.0), _row("pccl", "reduce_scatter", 16 * mib, 900.0)]))
    staging = lib._staging(tmp_path)
    assert staging["staged_over_host"] == {"pccl all_reduce": {"16MiB": 1.2}, "pccl all_gather": {"16MiB": 2.0}}
    assert staging["goal_missed"] == {"pccl all_gather": {"16MiB": 2.0}}


def test_staging_without_both_runs_says_so(tmp_path: Path) -> None:
    assert "error" in _lib()._staging(tmp_path)


# -- issue 52: the CUDA contract's judges, on synthetic rows ---------------------------------------------------
RAN = {"status": "pass", "reason": "exit 0", "rc": 0}


def _crow(label: str, phase: str, rank: int = 0, **fields) -> dict:
    base = {"label": label, "phase": phase, "rank": rank, "device": "cuda", "world": 2, "plan": "auto"}
    if label.startswith("torchrun-pccl") or label in ("mpi-contract", "plans-n4"):
        base.update(backend="pccl", group_type="PcclProcessGroup")
    elif label == "torchrun-nccl":
        base.update(backend="cpu:gloo,cuda:nccl", group_type="ProcessGroup")
    return {**base, **fields}


def _train(label: str, model: str, losses: list[float], step_s: list[float] | None = None, ranks: int = 2) -> list:
    return [_crow(label, "train", r, model=model, losses=[x + r for x in losses], step_s=step_s or [0.01] * len(losses))
            for r in range(ranks)]


def _launches(*labels: str) -> dict:
    return {label: dict(RAN) for label in labels}


def test_losses_equal_nccl_pass_and_a_different_step_fails() -> None:
    lib = _lib()
    losses = [5.5, 5.1, 4.8, 4.4]
    rows = []
    for label in ("torchrun-nccl", "torchrun-pccl", "torchrun-pccl-2nodes"):
        for model in ("ddp", "fsdp2"):
            rows += _train(label, model, losses)
    launches = _launches("torchrun-nccl", "torchrun-pccl", "torchrun-pccl-2nodes")
    verdict = lib.judge_losses(rows, launches)
    assert verdict["status"] == "pass", verdict
    assert len(verdict["details"]["parts"]) == 4
    bad = [dict(r, losses=[6.5, 6.1 + 1e-5, 5.9, 5.4]) if r["label"] == "torchrun-pccl" and r["model"] == "fsdp2"
           and r["rank"] == 1 else r for r in rows]  # rank 1's are losses + 1: step 2 within rtol, step 3 not
    verdict = lib.judge_losses(bad, launches)
    assert verdict["status"] == "fail" and verdict["reason"].startswith("1 of 4 failed")
    assert "torchrun-pccl fsdp2: rank 1 step 3: loss 5.9 vs NCCL's 5.8" in verdict["reason"]


def test_losses_of_a_run_that_was_not_pccl_fail() -> None:
    lib = _lib()
    nccl_run = [dict(r, backend="cpu:gloo,cuda:nccl", group_type="ProcessGroup")
                for r in _train("torchrun-pccl", "ddp", [1.0, 0.9])]
    rows = _train("torchrun-nccl", "ddp", [1.0, 0.9]) + nccl_run
    verdict = lib.judge_losses(rows, _launches("torchrun-nccl", "torchrun-pccl"))
    assert verdict["status"] == "fail" and "not pccl" in verdict["reason"]


def test_losses_missing_rows_skip_when_not_run_and_fail_naming_the_hang() -> None:
    lib = _lib()
    verdict = lib.judge_losses([], {})
    assert verdict["status"] == "skip" and "did not run" in verdict["reason"]
    rows = _train("torchrun-nccl", "ddp", [1.0]) + _train("torchrun-nccl", "fsdp2", [1.0])
    rows.append(_crow("torchrun-pccl", "begin", 0, what="train ddp"))
    rows.append(_crow("torchrun-pccl", "begin", 1, what="init"))
    launches = {"torchrun-pccl": {"status": "fail", "reason": "timed out after 150 s", "rc": 124},
                "torchrun-nccl": dict(RAN), "torchrun-pccl-2nodes": {"status": "skip", "reason": "no GPU"}}
    verdict = lib.judge_losses(rows, launches)
    assert verdict["status"] == "fail"
    assert "rank 0: train ddp, rank 1: init" in verdict["reason"] and "timed out" in verdict["reason"]


def _timing(label: str, collective: str, mode: str, host: float, total: float, rank: int = 0, **extra) -> dict:
    return _crow(label, "timing", rank, kind="16MiB", collective=collective, mode=mode, host_s=[host] * 5,
                total_s=[total] * 5, **extra)


def test_host_return_under_ten_percent_passes_and_a_blocking_host_fails_beside_ncclS() -> None:
    lib = _lib()
    rows = []
    for collective in ("all_gather", "reduce_scatter", "all_reduce"):
        for mode in ("sync", "async"):
            rows.append(_timing("torchrun-nccl", collective, mode, 0.00005, 0.01))
            for rank in (0, 1):
                rows.append(_timing("torchrun-pccl", collective, mode, 0.0004, 0.01, rank))
            rows.append(_crow("torchrun-pccl", "timing", kind="behind_sleep", collective=collective, mode=mode,
                             sleep_ms=50.0, host_s=[0.0003, 0.0002, 0.0002]))
    rows.append(_crow("torchrun-pccl", "streams", case="wait_other_stream", wait_host_s=[0.0001, 0.0002],
                     sleep_ms=50.0, trials=2, wrong=0))
    launches = _launches("torchrun-nccl", "torchrun-pccl", "torchrun-pccl-2nodes", "mpi-contract")
    launches["torchrun-pccl-2nodes"] = launches["mpi-contract"] = {"status": "skip", "reason": "budget"}
    verdict = lib.judge_host_return(rows, launches)
    assert verdict["status"] == "pass", verdict["reason"]
    blocked = [dict(r, host_s=[0.0099] * 5) if r["label"] == "torchrun-pccl" and r.get("mode") == "sync"
               and r.get("collective") == "all_reduce" and r.get("kind") == "16MiB" and r["rank"] == 1 else r
               for r in rows]
    verdict = lib.judge_host_return(blocked, launches)
    assert verdict["status"] == "fail"
    assert "auto all_reduce sync (16MiB): host/completion 0.990 (NCCL's 0.005)" in verdict["reason"]


def test_host_return_behind_a_kernel_and_a_blocking_wait_fail() -> None:
    lib = _lib()
    launches = _launches("torchrun-pccl")
    rows = [_crow("torchrun-pccl", "timing", kind="behind_sleep", collective="all_gather", mode="async",
                 sleep_ms=50.0, host_s=[0.051, 0.050, 0.052]),
            _crow("torchrun-pccl", "streams", case="wait_other_stream", wait_host_s=[0.0001, 0.049, 0.05], sleep_ms=50.0)]
    verdict = lib.judge_host_return(rows, launches)
    assert verdict["status"] == "fail"
    whats = {p["what"]: p["status"] for p in verdict["details"]["parts"]}
    assert whats["torchrun-pccl auto all_gather async (behind_sleep)"] == "fail"
    assert whats["torchrun-pccl auto wait() from another stream (rank 0)"] == "fail"


def test_host_return_on_cpu_tensors_is_not_judged() -> None:
    lib = _lib()
    rows = [dict(_timing("torchrun-pccl", "all_reduce", "sync", 0.01, 0.01), device="cpu")]
    verdict = lib.judge_host_return(rows, _launches("torchrun-pccl"))
    assert verdict["status"] == "skip" and "CPU tensors" in verdict["reason"]


def _sync(label: str, model: str, mode: str, calls=(), error=None, stack=()) -> dict:
    row = _crow(label, "sync", model=model, mode=mode, calls=list(calls))
    if error:
        row.update(error=error, error_stack=list(stack))
    return row


PCCL_CALL = {"message": "called a synchronizing CUDA operation", "thread": "pccl-worker_0", "in_pccl": True,
             "stack": ["scripts/gpu_cuda_contract.py:300 step", "/x/pccl_torch/work.py:40 wait",
                       "/x/torch/cuda/streams.py:90 synchronize"]}


def test_sync_debug_names_the_synchronising_call_and_says_whether_nccl_is_clean() -> None:
    lib = _lib()
    rows = [_sync("torchrun-nccl", m, mode) for m in ("ddp", "fsdp2") for mode in ("warn", "error")]
    rows += [_sync("torchrun-pccl", m, mode) for m in ("ddp", "fsdp2") for mode in ("warn", "error")]
    launches = _launches("torchrun-nccl", "torchrun-pccl")
    assert lib.judge_sync(rows, launches)["status"] == "pass"
    rows.append(_sync("torchrun-pccl-2nodes", "fsdp2", "warn", calls=[PCCL_CALL]))
    rows.append(_sync("torchrun-pccl-2nodes", "ddp", "error", error="RuntimeError: called a synchronizing CUDA "
                      "operation", stack=["a.py:1 f", "/x/integrations/torch_backend.py:12 allreduce", "c.py:3 g"]))
    verdict = lib.judge_sync(rows, dict(launches, **_launches("torchrun-pccl-2nodes")))
    assert verdict["status"] == "fail"
    assert "/x/pccl_torch/work.py:40 wait (thread pccl-worker_0); NCCL's same step is clean" in verdict["reason"]
    assert "at /x/integrations/torch_backend.py:12 allreduce" in verdict["reason"]


def test_sync_debug_where_the_nccl_step_synchronises_too_says_the_step_must_change() -> None:
    lib = _lib()
    torch_call = dict(PCCL_CALL, stack=["/x/torch/nn/modules/sparse.py:1 forward"], thread="MainThread")
    rows = [_sync("torchrun-nccl", "ddp", "warn", calls=[torch_call]),
            _sync("torchrun-pccl", "ddp", "warn", calls=[torch_call])]
    verdict = lib.judge_sync(rows, _launches("torchrun-nccl", "torchrun-pccl"))
    assert verdict["status"] == "fail" and "the step must change" in verdict["reason"]


def test_streams_and_fifo_bitwise_and_a_wrong_reference_blames_the_check() -> None:
    lib = _lib()
    cases = [("streams", "wait_other_stream"), ("streams", "snapshot_at_issue"), ("streams", "list_all_gather_side"),
             ("fifo", "one_group"), ("fifo", "two_groups")]
    rows = [_crow(label, phase, r, case=case, trials=3, checked=50, wrong=0)
            for label in ("torchrun-nccl", "torchrun-pccl") for phase, case in cases for r in (0, 1)]
    launches = _launches("torchrun-nccl", "torchrun-pccl")
    assert lib.judge_streams(rows, launches)["status"] == "pass"
    wrong = [dict(r, wrong=2, first_wrong="trial 0: 4 of 4 elements wrong") if r["label"] == "torchrun-pccl"
             and r["case"] == "snapshot_at_issue" and r["rank"] == 1 else r for r in rows]
    verdict = lib.judge_streams(wrong, launches)
    assert verdict["status"] == "fail"
    assert "torchrun-pccl auto streams snapshot_at_issue: 2 of 100 wrong; rank 1 trial 0" in verdict["reason"]
    ref_wrong = [dict(r, wrong=1) if r["label"] == "torchrun-nccl" and r["case"] == "two_groups" else r for r in rows]
    verdict = lib.judge_streams(ref_wrong, launches)
    assert verdict["status"] == "fail" and "the check is wrong, not pccl" in verdict["reason"]
    errors = rows + [_crow("mpi-contract", "fifo", 0, case="one_group", plan="hier:ring",
                          error="TimeoutError: all_reduce not complete\nmore")]
    verdict = lib.judge_streams(errors, dict(launches, **_launches("mpi-contract")))
    assert verdict["status"] == "fail" and "rank 0: TimeoutError: all_reduce not complete" in verdict["reason"]


def _plans(names: list[str], ranks: int = 4, failed: dict | None = None, drop: tuple = ()) -> list[dict]:
    rows = [_crow("plans-n4", "plans_expected", r, names=names) for r in range(ranks)]
    for name in names:
        collective, algorithm = name.split(":", 1)
        for r in range(ranks):
            if (name, r) in drop:
                continue
            bad = (failed or {}).get((name, r), 0)
            rows.append(_crow("plans-n4", "plans", r, collective=collective, name=algorithm, intra="nccl", cases=19,
                             passed=19 - bad, failed=bad, failures=["rank 1: all_reduce[hier:ring] x: wrong"] * bad))
    return rows


def _forced(plan: str, ran: dict) -> dict:
    return _crow("mpi-contract", "algorithms", plan=plan, algorithms=ran)


def test_networked_plans_every_name_on_every_rank_and_pccl_algo_honoured() -> None:
    lib = _lib()
    names = ["all_reduce:hier:ring", "all_gather:hier-nccl:bruck", "all_reduce:hier:pipelined"]
    ran = {"all_gather:hier:pipelined": 9, "reduce_scatter:hier:pipelined": 9, "all_reduce:hier:pipelined": 120}
    rows = _plans(names) + [_forced("hier:pipelined", ran)]
    launches = _launches("plans-n4", "mpi-contract")
    verdict = lib.judge_plans(rows, launches)
    assert verdict["status"] == "pass", verdict["reason"]
    assert len(verdict["details"]["parts"]) == 4
    verdict = lib.judge_plans(_plans(names, failed={("all_reduce:hier:pipelined", 1): 2}) +
                              [_forced("hier:pipelined", ran)], launches)
    assert verdict["status"] == "fail" and "2 of 76 rank-cases wrong" in verdict["reason"]
    rows = _plans(names, drop=(("all_gather:hier-nccl:bruck", 3),))
    rows.append(_crow("plans-n4", "begin", 3, what="plans all_gather:hier-nccl:bruck"))
    verdict = lib.judge_plans(rows + [_forced("hier:pipelined", ran)], launches)
    assert verdict["status"] == "fail" and "no result from ranks [3]" in verdict["reason"]
    assert "rank 3: plans all_gather:hier-nccl:bruck" in verdict["reason"]
    verdict = lib.judge_plans(_plans(names) + [_forced("hier:ring", {"all_reduce:vendor": 100})], launches)
    assert verdict["status"] == "fail" and "PCCL_ALGO=hier:ring" in verdict["reason"]


def test_fsdp2_step_time_median_of_the_slowest_rank_after_warmup() -> None:
    lib = _lib()
    nccl = [0.5, 0.4, 0.3] + [0.010] * 7  # the warm-up steps are slow and left out
    rows = _train("torchrun-nccl", "fsdp2", [1.0] * 10, step_s=nccl)
    pccl = _train("torchrun-pccl", "fsdp2", [1.0] * 10, step_s=[0.9, 0.9, 0.9] + [0.0105] * 7)
    pccl[1]["step_s"] = [0.9, 0.9, 0.9] + [0.0108] * 7  # rank 1 is the slowest
    launches = _launches("torchrun-nccl", "torchrun-pccl")
    verdict = lib.judge_step_time(rows + pccl, launches)
    assert verdict["status"] == "pass", verdict["reason"]
    assert verdict["details"]["figures"]["fsdp2"] == {"pccl_ms": 10.8, "nccl_ms": 10.0, "ratio": 1.08}
    pccl[0]["step_s"] = [0.0] * 3 + [0.0125] * 7
    verdict = lib.judge_step_time(rows + pccl, launches)
    assert verdict["status"] == "fail" and "1.25x" in verdict["reason"]
    short = _train("torchrun-pccl", "fsdp2", [1.0] * 4)
    assert lib.judge_step_time(rows + short, launches)["status"] == "fail"


def test_fifo_on_cpu_counts_every_rank() -> None:
    lib = _lib()
    rows = [_crow(label, "fifo", r, device="cpu", case=case, trials=50, checked=50, wrong=0)
            for label in ("fifo-cpu-n2", "fifo-cpu-n3") for r in range(2) for case in ("one_group", "two_groups")]
    launches = _launches("fifo-cpu-n2", "fifo-cpu-n3")
    assert lib.judge_fifo_cpu(rows, launches)["status"] == "pass"
    rows[-1] = dict(rows[-1], wrong=38)
    verdict = lib.judge_fifo_cpu(rows, launches)
    assert verdict["status"] == "fail" and "fifo-cpu-n3 two_groups: 38 of 100 wrong" in verdict["reason"]


def test_load_rows_reads_folders_and_skips_bad_lines(tmp_path: Path) -> None:
    lib = _lib()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "rank0.jsonl").write_text('{"label": "x", "phase": "init"}\nnot json\n[1]\n')
    (tmp_path / "rank1.jsonl").write_text('{"label": "y", "phase": "end"}\n')
    assert [r["label"] for r in lib.load_rows(tmp_path)] == ["x", "y"]
    assert lib.load_rows(tmp_path / "missing") == []


def test_summary_adds_the_contract_verdicts_and_fails_on_one(tmp_path: Path) -> None:
    lib = _lib()
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "rows" / "fifo-cpu-n2").mkdir(parents=True)
    out.mkdir()
    (work / "sections.tsv").write_text("env\tnormal\t0\t3\t-\tall usable\n"
                                       "torchrun-pccl\tcontract\t124\t150\t150\t\n"
                                       "fifo-cpu-n2\tcontract\t0\t5\t45\t\n"
                                       "fifo-cpu-n3\tskip\t-\t0\t-\tbudget\n")
    (work / "torchrun-pccl.out").write_text("row ...\nstuck\n")
    rows = [_crow("fifo-cpu-n2", "fifo", r, device="cpu", case="one_group", trials=50, checked=50, wrong=0)
            for r in range(2)]
    rows.append(_crow("torchrun-pccl", "begin", 0, what="streams snapshot_at_issue"))
    (work / "rows" / "fifo-cpu-n2" / "rank0.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert lib.summary(str(work), str(out)) == 0
    result = json.loads((out / "summary.json").read_text())
    verdicts = {s["name"]: s for s in result["sections"] if s.get("kind") == "verdict"}
    assert verdicts["c-fifo-cpu"]["status"] == "pass"
    assert verdicts["c4-streams-fifo"]["status"] == "fail"
    assert "last begun: rank 0: streams snapshot_at_issue" in verdicts["c4-streams-fifo"]["reason"]
    assert result["ok"] is False
    text = (out / "summary.txt").read_text()
    assert "fail  torchrun-pccl" in text and "timed out" in text and "c-fifo-cpu" in text


def test_contract_cli_rejudges_a_contract_jsonl(tmp_path: Path, capsys) -> None:
    lib = _lib()
    path = tmp_path / "contract.jsonl"
    rows = [_crow("fifo-cpu-n2", "fifo", 0, device="cpu", case="one_group", trials=50, checked=50, wrong=3)]
    path.write_text(json.dumps(rows[0]) + "\n")
    assert lib.main(["contract", str(path)]) == 1
    assert "fail  c-fifo-cpu" in capsys.readouterr().out


def _contract_script():
    spec = importlib.util.spec_from_file_location("gpu_cuda_contract", ROOT / "scripts" / "gpu_cuda_contract.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_contract_script_arguments_and_frames() -> None:
    script = _contract_script()
    args = script.parse(["--phases", "fifo,timing", "--device", "cpu"])
    assert args.phases == "fifo,timing" and args.fifo_trials == 50 and args.timing_mib == 16
    with pytest.raises(SystemExit):
        script.parse(["--phases", "fifo,bogus"])
    assert script.backend_string("nccl", None) == "cpu:gloo,cuda:nccl"
    assert script.backend_string("pccl", None) == "pccl"
    assert script.plan_env("hier:ring") == "all_gather:hier:ring,reduce_scatter:hier:ring,all_reduce:hier:ring"
    assert script.in_pccl(["/site/pccl_torch/work.py:3 wait"]) and not script.in_pccl(["/site/torch/x.py:1 f"])
