"""Helpers of ``scripts/gpu_check.sh`` (run with the checked Python; standard library plus pccl_torch only).

    python scripts/gpu_check_lib.py probe ENV_JSON          what this machine has (torch, CUDA, triton, MPI)
    python scripts/gpu_check_lib.py names                   algorithm lists for the CUDA driver launches
    python scripts/gpu_check_lib.py summary WORK OUT        summary.json and summary.txt from the sections
    python scripts/gpu_check_lib.py contract CONTRACT_JSONL  judge the CUDA-contract rows again (from $OUT)

The shell script records one line per section in ``WORK/sections.tsv`` (name, kind, exit status, seconds,
limit, note); ``summary`` turns each into pass / fail / skip / xfail with a reason, reading the section's
artifacts in WORK (junit XML, bench JSON, driver JSON) and folding their figures into ``summary.json``.

The CUDA contract of issue 52 (``gpu_cuda_contract.py``, ``gpu_plans_check.py``) writes JSON rows under
``WORK/rows/<launch>/rank<r>.jsonl``; its launches are sections of kind ``contract`` (pass when they ran to the
end), and the judges below turn their rows into the ``c*`` verdicts: each a list of parts, pass / fail / skip.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

MIB = 1 << 20
#: bench_kernels.py goal: the dispatch path (Triton on CUDA) at >= 16 MiB reaches this share of copy_.
BENCH_GOAL = 0.8
BENCH_GOAL_KERNELS = ("reduce_2", "reduce_8", "permute")  # "permute" is the pack/unpack kernel
#: What NCCL says when two ranks of one communicator share a GPU (ncclInvalidUsage, "Duplicate GPU detected").
NCCL_REFUSAL = ("Duplicate GPU", "invalid usage", "ncclInvalidUsage")
DTYPE_RE = re.compile(r"torch\.(bfloat16|float16|float32|float64|int8|int16|int32|int64|uint8)")


# -- probe ------------------------------------------------------------------------------------------------
def probe(path: str) -> int:
    """Write what this Python sees to ``path`` (JSON); never raises for a missing piece."""
    info: dict[str, object] = {"python": sys.version.split()[0], "executable": sys.executable, "prefix": sys.prefix}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
            info["capability"] = list(torch.cuda.get_device_capability(0))
        import torch.distributed as dist

        info["nccl_available"] = dist.is_available() and dist.is_nccl_available()
        if info["nccl_available"]:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:  # noqa: BLE001 - recorded
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001
        info["triton_error"] = f"{type(exc).__name__}: {exc}"
    try:
        import mpi4py

        info["mpi4py"] = mpi4py.__version__
        from mpi4py import MPI

        info["mpi_library"] = MPI.Get_library_version().splitlines()[0].strip()
    except Exception as exc:  # noqa: BLE001
        info["mpi_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    for module in ("xdist", "pytest_timeout"):
        try:
            __import__(module)
            info[module] = True
        except ImportError:
            info[module] = False
    Path(path).write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))
    return 0


# -- names ------------------------------------------------------------------------------------------------
def names() -> int:
    """Shell assignments: the CUDA algorithm names by the intra-node library they need.

    NCCL refuses two ranks of one communicator on one GPU, so with several ranks sharing the GPU only the
    names that never build an NCCL communicator of several ranks can pass: the flat family and ``mpi`` (world
    MPI), and ``hier-mpi:*`` (MPI inside the node). ``vendor`` runs NCCL over all ranks; ``hier:<x>`` on
    CUDA runs NCCL inside each node (``Communicator.intra`` picks ``intra_torch`` for CUDA)."""
    import pccl_torch as pc
    from pccl_torch.algorithms import COLLECTIVES
    from pccl_torch.plan import resolve

    safe: list[str] = []
    nccl_world: list[str] = []
    nccl_intra: list[str] = []
    for collective in COLLECTIVES:
        for name in pc.algorithms(collective, "cuda"):
            plan = resolve(collective, name)
            if plan.transport == "vendor" and not plan.hierarchical:
                bucket = nccl_world
            elif plan.hierarchical and not plan.pipelined and plan.intra in (None, "nccl"):
                bucket = nccl_intra
            else:
                bucket = safe
            if name not in bucket:
                bucket.append(name)
    print(f"SAFE_NAMES={','.join(safe)}")
    print(f"NCCL_INTRA_NAMES={','.join(nccl_intra)}")
    print(f"NCCL_ALL_NAMES={','.join(nccl_world + nccl_intra)}")
    return 0


# -- summary ----------------------------------------------------------------------------------------------
def _load(path: Path) -> object | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip()[:200] for line in text[-lines:])


def _kernels(work: Path) -> dict:
    xml = work / "kernels.xml"
    if not xml.exists():
        return {"error": "no junit XML (pytest did not get to write it)"}
    per_dtype: dict[str, dict[str, int]] = {}
    per_file: dict[str, dict[str, int]] = {}
    failures = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        name, cls = case.get("name", ""), case.get("classname", "")
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                if tag != "skipped" and len(failures) < 15:
                    failures.append(f"{cls}::{name}: {(node.get('message') or '')[:300]}")
                break
        match = DTYPE_RE.search(name)
        for table, key in ((per_dtype, match.group(1) if match else "no dtype"), (per_file, cls.rsplit(".", 1)[-1])):
            row = table.setdefault(key, {"passed": 0, "failed": 0, "error": 0, "skipped": 0})
            row[outcome] += 1
    return {"per_dtype": per_dtype, "per_file": per_file, "failures": failures}


def _bench(work: Path, dtype: str) -> dict:
    rows = _load(work / f"bench-{dtype}.json")
    if not isinstance(rows, list):
        return {"error": "no bench JSON"}
    big = [r for r in rows if r.get("bytes", 0) >= 16 * MIB]
    ratios: dict[str, dict[str, float]] = {}
    for r in big:
        impl = "dispatch" if r["impl"] not in ("torch-ref",) and r["kernel"] != "copy_" else r["impl"]
        ratios.setdefault(f"{r['kernel']}:{impl}", {})[str(r["bytes"] // MIB) + "MiB"] = round(r["vs_copy"], 3)
    copy_gbps = {str(r["bytes"] // MIB) + "MiB": round(r["gbps"], 1) for r in big if r["kernel"] == "copy_"}
    dispatch = rows[0].get("dispatch") if rows else None
    worst = {k: min(ratios.get(f"{k}:dispatch", {}).values(), default=None) for k in BENCH_GOAL_KERNELS}
    missed = {k: v for k, v in worst.items() if v is None or v < BENCH_GOAL}
    return {"dispatch": dispatch, "copy_gbps": copy_gbps, "vs_copy_at_16MiB_plus": ratios,
            "worst_vs_copy": worst, "goal": BENCH_GOAL, "goal_missed": missed}


def _driver(work: Path, name: str) -> dict:
    data = _load(work / f"{name}.json")
    if not isinstance(data, dict):
        return {"error": "no driver JSON"}
    failures = data.get("failures", [])
    return {"passed": data.get("passed"), "failed": data.get("failed"), "seconds": data.get("seconds"),
            "ranks": data.get("ranks"), "local_size": data.get("local_size"), "device": data.get("device"),
            "mpi": data.get("mpi"), "first_failures": [f.splitlines()[0][:400] for f in failures[:8]],
            "all_failure_text": "\n".join(failures)}


STAGING_GOAL = 1.3
"""Issue 32: a staged CUDA collective takes at most this many times its host-tensor time from 16 MiB."""


def _staging(work: Path) -> dict:
    """pccl's time on CUDA tensors (host staging, ``pccl-bench-w2``) over its time on host tensors
    (``pccl-bench-w2-host``), per label, collective and size from 16 MiB, where both ran the same algorithm."""
    staged, host = _load(work / "pccl-bench-w2.json"), _load(work / "pccl-bench-w2-host.json")
    if not isinstance(staged, list) or not isinstance(host, list):
        return {"error": "pccl-bench-w2 or -w2-host JSON missing"}
    on_host = {(r["label"], r.get("algorithm"), r["collective"], r["size_bytes"]): r["time_us"]
               for r in host if r.get("time_us")}
    ratios: dict[str, dict[str, float]] = {}
    for r in staged:  # the same algorithm on both (auto may choose NCCL on CUDA and MPI on the host)
        key = (r["label"], r.get("algorithm"), r["collective"], r["size_bytes"])
        if r["label"].startswith("pccl") and r["size_bytes"] >= 16 * MIB and on_host.get(key) and r.get("time_us"):
            ratios.setdefault(f"{r['label']} {r['collective']}", {})[f"{r['size_bytes'] // MIB}MiB"] = round(
                r["time_us"] / on_host[key], 2)
    missed = {k: v for k, v in ratios.items() if max(v.values()) > STAGING_GOAL}
    return {"staged_over_host": ratios, "goal": STAGING_GOAL, "goal_missed": missed}


# -- issue 52: the CUDA contract (rows of gpu_cuda_contract.py and gpu_plans_check.py) -------------------------
REFERENCE = "torchrun-nccl"
"""The launch of torch's NCCL that every pccl launch is compared with (and that validates the checks)."""
TORCHRUN_PCCL = ("torchrun-pccl", "torchrun-pccl-2nodes")
"""torchrun launches on the pccl backend: one node of 2 (``dist.init_process_group("pccl")``), and 2 emulated nodes of
1 (``python -m pccl_torch.run``, the hierarchy forced: NCCL levels and the control plane of a networked layout)."""
MPI_CONTRACT = "mpi-contract"
"""mpiexec, 2 emulated nodes x 2: a pccl group per forced networked plan (NCCL inside, staged MPI between)."""
PLANS_LAUNCH = "plans-n4"
FIFO_CPU_LAUNCHES = ("fifo-cpu-n2", "fifo-cpu-n3")
CONTRACT_LAUNCHES = (REFERENCE, *TORCHRUN_PCCL, MPI_CONTRACT, PLANS_LAUNCH, *FIFO_CPU_LAUNCHES)
HOST_RETURN_GOAL = 0.10
"""The host's time to return from a 16 MiB CUDA collective (issue, plus ``wait()`` when async) over the time to the
GPU's completion: at most this (NCCL's is far below)."""
BEHIND_SLEEP_GOAL = 0.10
"""A call issued behind a slow kernel (or a ``wait()`` on a collective queued behind one): its host time over the
kernel's, at most this. A host that waits for the stream or the collective takes the whole kernel."""
STEP_TIME_GOAL = 1.1
"""FSDP2's median step time with pccl over NCCL's, at most this."""
STEP_WARMUP = 3
"""Steps left out of the median step time."""
LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-6
"""pccl's losses against NCCL's, step by step on every rank (same GPU, same kernels: only the reduction's order
may differ, exact at 2 ranks)."""
PCCL_FRAME_MARKS = ("pccl_torch", "integrations/", "triton_kernels")


def load_rows(source: Path) -> list[dict]:
    """Every JSON row of ``source`` (a ``.jsonl`` file, or a folder searched for them); bad lines are skipped."""
    files = [source] if source.is_file() else sorted(source.rglob("*.jsonl")) if source.is_dir() else []
    rows = []
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _of(rows: list[dict], label: str, phase: str, **match: object) -> list[dict]:
    return [r for r in rows if r.get("label") == label and r.get("phase") == phase
            and all(r.get(k) == v for k, v in match.items())]


def _last_begun(rows: list[dict], label: str) -> str:
    """What each rank of ``label`` began last (where a hang or a crash happened)."""
    last: dict[int, str] = {}
    for r in rows:
        if r.get("label") == label and r.get("phase") == "begin":
            last[r.get("rank", -1)] = r.get("what", "?")
    return ", ".join(f"rank {k}: {v}" for k, v in sorted(last.items())) or "nothing"


def _absent(label: str, what: str, rows: list[dict], launches: dict[str, dict]) -> dict:
    """The part for a launch without ``what`` rows: skip where it did not run, fail where it ran."""
    launch = launches.get(label)
    if launch is None:
        return {"what": f"{label} {what}", "status": "skip", "reason": f"{label} did not run"}
    if launch.get("status") == "skip":
        return {"what": f"{label} {what}", "status": "skip", "reason": f"{label} skipped: {launch.get('reason', '')}"}
    return {"what": f"{label} {what}", "status": "fail",
            "reason": f"{label} wrote no {what} rows (last begun: {_last_begun(rows, label)}; launch: "
                      f"{launch.get('status')}, {str(launch.get('reason', ''))[:300]})"}


def _each_launch(labels: tuple[str, ...], phases: tuple[str, ...], rows: list[dict], launches: dict[str, dict],
                 parts: list[dict]) -> Iterator[tuple[str, list[dict]]]:
    """``(label, its rows of phases)`` for each launch that wrote some; an :func:`_absent` part for each other."""
    for label in labels:
        found = [r for phase in phases for r in _of(rows, label, phase)]
        if found:
            yield label, found
        else:
            parts.append(_absent(label, "/".join(phases), rows, launches))


def _part(what: str, ok: bool, reason: str, **figures: object) -> dict:
    return {"what": what, "status": "pass" if ok else "fail", "reason": reason, **figures}


def _verdict(name: str, parts: list[dict], goal: str) -> dict:
    """One summary entry from its parts: fail if any failed, skip if none ran, else pass."""
    failed = [p for p in parts if p["status"] == "fail"]
    ran = [p for p in parts if p["status"] != "skip"]
    if failed:
        status = "fail"
        listed = "; ".join(f"{p['what']}: {p['reason']}" for p in failed[:4])
        reason = f"{len(failed)} of {len(parts)} failed: {listed}"
    elif not ran:
        status, reason = "skip", "; ".join(sorted({p["reason"] for p in parts})) or "nothing to judge"
    else:
        status, reason = "pass", f"{len(ran)} passed ({goal})"
    return {"name": name, "kind": "verdict", "status": status, "reason": reason, "details": {"goal": goal,
                                                                                            "parts": parts}}


def _median(values: list[float]) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def _where(frames: list[str]) -> str:
    """The innermost pccl frame of a stack (else its innermost frame)."""
    ours = [f for f in frames if any(mark in f for mark in PCCL_FRAME_MARKS)]
    return (ours or frames or ["no stack"])[-1]


def _is_pccl(row: dict) -> bool:
    return "pccl" in str(row.get("backend", "")).lower() or "pccl" in str(row.get("group_type", "")).lower()


def judge_losses(rows: list[dict], launches: dict[str, dict]) -> dict:
    """Section 1: DDP and FSDP2 under torchrun on the pccl backend give NCCL's losses, step by step on every rank."""
    parts = []
    for label in TORCHRUN_PCCL:
        for model in ("ddp", "fsdp2"):
            what = f"{label} {model}"
            cand, ref = _of(rows, label, "train", model=model), _of(rows, REFERENCE, "train", model=model)
            if not cand:
                parts.append(_absent(label, f"train {model}", rows, launches))
                continue
            if not ref:
                absent = _absent(REFERENCE, f"train {model}", rows, launches)
                parts.append(dict(absent, what=what, reason="no NCCL reference: " + absent["reason"]))
                continue
            problems = [f"rank {r.get('rank')}: {r['error']}" for r in cand + ref if r.get("error")]
            problems += [f"rank {r.get('rank')} ran on {r.get('backend')} ({r.get('group_type')}), not pccl"
                         for r in cand if not _is_pccl(r)]
            want = {r.get("rank"): r.get("losses") or [] for r in ref}
            worst = 0.0
            for r in cand:
                got, exp = r.get("losses") or [], want.get(r.get("rank"))
                if exp is None or len(got) != len(exp) or not got:
                    problems.append(f"rank {r.get('rank')}: {len(got)} losses, NCCL's run has {len(exp or [])}")
                    continue
                for step, (a, b) in enumerate(zip(got, exp)):
                    ok = math.isfinite(a) and math.isfinite(b) and abs(a - b) <= LOSS_ATOL + LOSS_RTOL * abs(b)
                    worst = max(worst, abs(a - b) / max(abs(b), 1e-12) if math.isfinite(a) else math.inf)
                    if not ok:
                        problems.append(f"rank {r.get('rank')} step {step + 1}: loss {a} vs NCCL's {b}")
                        break
            parts.append(_part(what, not problems, "; ".join(problems[:3]) or f"max relative difference {worst:.2g}",
                               max_rel_diff=worst))
    return _verdict("c1-torchrun-losses", parts, f"losses equal NCCL's within rtol {LOSS_RTOL}")


def _host_ratio(rows: list[dict]) -> float | None:
    """The worst rank's median host time over its median time to the GPU's completion."""
    ratios = []
    for r in rows:
        host, total = _median(r.get("host_s") or []), _median(r.get("total_s") or [])
        if host is not None and total:
            ratios.append(host / total)
    return max(ratios) if ratios else None


def judge_host_return(rows: list[dict], launches: dict[str, dict]) -> dict:
    """Section 2: a 16 MiB CUDA all-gather / reduce-scatter / all-reduce, sync and async, returns to the host in at
    most 10% of its time to the GPU's completion; a call behind a slow kernel, and a ``wait()`` from another stream
    on a collective queued behind one, return in at most 10% of the kernel's time."""
    ref = {(r.get("collective"), r.get("mode")): r for r in _of(rows, REFERENCE, "timing", kind="16MiB")}
    nccl = {key: _host_ratio([r for r in _of(rows, REFERENCE, "timing", kind="16MiB")
                              if (r.get("collective"), r.get("mode")) == key]) for key in ref}
    parts = []
    for label, timing in _each_launch((*TORCHRUN_PCCL, MPI_CONTRACT), ("timing",), rows, launches, parts):
        groups: dict[tuple, list[dict]] = {}
        for r in timing:
            groups.setdefault((r.get("plan"), r.get("kind"), r.get("collective"), r.get("mode")), []).append(r)
        for (plan, kind, collective, mode), group in sorted(groups.items(), key=str):
            what = f"{label} {plan} {collective} {mode} ({kind})"
            errors = [f"rank {r.get('rank')}: {r['error']}" for r in group if r.get("error")]
            if errors:
                parts.append(_part(what, False, errors[0]))
                continue
            if any(r.get("device") != "cuda" for r in group):
                parts.append({"what": what, "status": "skip", "reason": "CPU tensors: the host does the work"})
                continue
            if kind == "behind_sleep":
                sleep_s = float(group[0].get("sleep_ms", 0)) / 1e3
                share = max((_median(r.get("host_s") or []) or 0.0) for r in group) / sleep_s if sleep_s else None
                ok = share is not None and share <= BEHIND_SLEEP_GOAL
                parts.append(_part(what, ok, f"host {share:.2f} x the {sleep_s * 1e3:.0f} ms kernel ahead of it"
                                   if share is not None else "no times", share=share))
                continue
            ratio = _host_ratio(group)
            theirs = nccl.get((collective, mode))
            beside = f"NCCL's {theirs:.3f}" if theirs is not None else "no NCCL figure"
            parts.append(_part(what, ratio is not None and ratio <= HOST_RETURN_GOAL,
                               f"host/completion {ratio:.3f} ({beside})" if ratio is not None else "no times",
                               ratio=ratio, nccl_ratio=theirs))
        for r in _of(rows, label, "streams", case="wait_other_stream"):
            waits, sleep_s = r.get("wait_host_s") or [], float(r.get("sleep_ms", 0)) / 1e3
            if not waits or not sleep_s:
                continue
            share = (_median(waits) or 0.0) / sleep_s
            parts.append(_part(f"{label} {r.get('plan')} wait() from another stream (rank {r.get('rank')})",
                               share <= BEHIND_SLEEP_GOAL,
                               f"wait() held the host {share:.2f} x the {sleep_s * 1e3:.0f} ms kernel ahead of the "
                               "collective", share=share))
    return _verdict("c2-host-return", parts, f"host time <= {HOST_RETURN_GOAL:.0%} of the collective's, "
                                             f"<= {BEHIND_SLEEP_GOAL:.0%} of a kernel ahead of it")


def _sync_problem(row: dict) -> str | None:
    if row.get("error"):
        return f"raised {row['error'].splitlines()[0][:200]} at {_where(row.get('error_stack') or [])}"
    calls = row.get("calls") or []
    if calls:
        first = calls[0]
        return (f"{len(calls)} synchronising call(s); first: {first.get('message', '')[:80]} at "
                f"{_where(first.get('stack') or [])} (thread {first.get('thread')})")
    return None


def judge_sync(rows: list[dict], launches: dict[str, dict]) -> dict:
    """Section 3: ``set_sync_debug_mode`` over DDP and FSDP2 steps on the pccl backend: no synchronising call
    ("warn" lists them, "error" raises at the first). NCCL's same steps say whether the step itself is clean."""
    parts = []
    for label, sync in _each_launch(TORCHRUN_PCCL, ("sync",), rows, launches, parts):
        for r in sync:
            what = f"{label} {r.get('model', '')} {r.get('mode')} (rank {r.get('rank')})"
            if r.get("skipped"):
                parts.append({"what": what, "status": "skip", "reason": r["skipped"]})
                continue
            problem = _sync_problem(r)
            if problem is None:
                parts.append(_part(what, True, "no synchronising call"))
                continue
            ref = [_sync_problem(x) for x in _of(rows, REFERENCE, "sync", model=r.get("model"), mode=r.get("mode"))]
            if any(ref):
                problem += f"; NCCL's same step synchronises too ({next(p for p in ref if p)}): the step must change"
            elif ref:
                problem += "; NCCL's same step is clean"
            parts.append(_part(what, False, problem))
    return _verdict("c3-sync-debug", parts, "no synchronising call in a DDP or FSDP2 step on pccl")


def judge_streams(rows: list[dict], launches: dict[str, dict]) -> dict:
    """Section 4: the stream cases and the per-group FIFO, bitwise, every rank. NCCL's launch runs them too: a
    case NCCL fails is a wrong check, and fails as such."""
    parts = []
    for label, found in _each_launch((REFERENCE, *TORCHRUN_PCCL, MPI_CONTRACT), ("streams", "fifo"), rows, launches,
                                     parts):
        groups: dict[tuple, list[dict]] = {}
        for r in found:
            groups.setdefault((r.get("plan"), r.get("phase"), r.get("case")), []).append(r)
        for (plan, phase, case), group in sorted(groups.items(), key=str):
            what = f"{label} {plan} {phase} {case}"
            if all(r.get("skipped") for r in group):
                parts.append({"what": what, "status": "skip", "reason": group[0]["skipped"]})
                continue
            errors = [f"rank {r.get('rank')}: {r['error'].splitlines()[0][:300]}" for r in group if r.get("error")]
            wrong = sum(int(r.get("wrong") or 0) for r in group)
            checked = sum(int(r.get("checked", r.get("trials")) or 0) for r in group)
            firsts = [f"rank {r.get('rank')} {r['first_wrong']}" for r in group if r.get("first_wrong")]
            ok = not errors and wrong == 0 and checked > 0
            reason = "; ".join(errors[:2]) or (f"{wrong} of {checked} wrong; {firsts[0] if firsts else ''}" if wrong
                                               else f"0 of {checked} wrong")
            if not ok and label == REFERENCE:
                reason = f"NCCL (the reference) fails it: the check is wrong, not pccl: {reason}"
            parts.append(_part(what, ok, reason, wrong=wrong, checked=checked))
    return _verdict("c4-streams-fifo", parts, "every stream case and FIFO call bitwise right on every rank")


def judge_plans(rows: list[dict], launches: dict[str, dict]) -> dict:
    """Section 5: every networked plan forced (``hier:*``, ``hier-nccl:*``, ``hier:pipelined``; NCCL inside the node,
    staged MPI between) right on every case and rank; and ``PCCL_ALGO`` reaching the groups of the mpiexec
    contract launch (what their communicators ran)."""
    parts = []
    expected_rows = _of(rows, PLANS_LAUNCH, "plans_expected")
    done = _of(rows, PLANS_LAUNCH, "plans")
    if not expected_rows:
        parts.append(_absent(PLANS_LAUNCH, "plans", rows, launches))
    else:
        ranks = sorted({r.get("rank") for r in expected_rows})
        for name in expected_rows[0].get("names", []):
            collective, algorithm = name.split(":", 1)
            per_rank = [r for r in done if r.get("collective") == collective and r.get("name") == algorithm]
            missing = sorted(set(ranks) - {r.get("rank") for r in per_rank})
            failed = sum(int(r.get("failed") or 0) for r in per_rank)
            cases = sum(int(r.get("cases") or 0) for r in per_rank)
            first = next((r["failures"][0] for r in per_rank if r.get("failures")), "")
            intra = next((r.get("intra") for r in per_rank), None)
            if missing:
                reason = f"no result from ranks {missing} (last begun: {_last_begun(rows, PLANS_LAUNCH)})"
            elif failed:
                reason = f"{failed} of {cases} rank-cases wrong; first: {first.splitlines()[0][:300] if first else ''}"
            else:
                reason = f"{cases} rank-cases right (intra {intra})"
            parts.append(_part(f"{PLANS_LAUNCH} {name}", not missing and not failed, reason, intra=intra))
    forced = [r for r in _of(rows, MPI_CONTRACT, "algorithms") if r.get("plan") not in (None, "auto")]
    if not forced:
        parts.append(_absent(MPI_CONTRACT, "forced-plan algorithms", rows, launches))
    for r in forced:
        ran = r.get("algorithms") or {}
        plan = r["plan"]
        missing = [c for c in ("all_gather", "reduce_scatter", "all_reduce") if not ran.get(f"{c}:{plan}")]
        parts.append(_part(f"{MPI_CONTRACT} PCCL_ALGO={plan} (rank {r.get('rank')})", not missing,
                           f"the group ran {json.dumps(ran)[:300]}" + (f"; no {missing} calls of {plan}" if missing
                                                                        else "")))
    return _verdict("c5-networked-plans", parts, "every forced networked plan right, PCCL_ALGO honoured")


def _step_median(rows: list[dict]) -> float | None:
    """The median over the steps after :data:`STEP_WARMUP` of each step's slowest rank."""
    per_rank = [r.get("step_s") or [] for r in rows]
    steps = min((len(s) for s in per_rank), default=0)
    slowest = [max(s[i] for s in per_rank) for i in range(STEP_WARMUP, steps)]
    return statistics.median(slowest) if len(slowest) >= 3 else None


def judge_step_time(rows: list[dict], launches: dict[str, dict], label: str = "torchrun-pccl") -> dict:
    """Section 6: FSDP2's step with pccl (one node of 2 ranks on the GPU) at most 1.1x NCCL's same step (median of
    the steps after warm-up, slowest rank). DDP's ratio is reported beside it, not judged."""
    parts = []
    figures = {}
    for model in ("fsdp2", "ddp"):
        cand, ref = _of(rows, label, "train", model=model), _of(rows, REFERENCE, "train", model=model)
        if not cand or not ref:
            if model == "fsdp2":
                parts.append(_absent(label if not cand else REFERENCE, f"train {model}", rows, launches))
            continue
        mine, theirs = _step_median(cand), _step_median(ref)
        ratio = mine / theirs if mine and theirs else None
        figures[model] = {"pccl_ms": mine and round(1e3 * mine, 2), "nccl_ms": theirs and round(1e3 * theirs, 2),
                          "ratio": ratio and round(ratio, 3)}
        if model == "fsdp2":
            reason = (f"{1e3 * mine:.1f} ms vs NCCL's {1e3 * theirs:.1f} ms: {ratio:.2f}x" if ratio
                      else f"fewer than {STEP_WARMUP + 3} steps timed")
            parts.append(_part(f"{label} fsdp2 step", ratio is not None and ratio <= STEP_TIME_GOAL, reason, **figures))
    verdict = _verdict("c6-fsdp2-step-time", parts, f"pccl's FSDP2 step <= {STEP_TIME_GOAL}x NCCL's")
    verdict["details"]["figures"] = figures
    return verdict


def judge_fifo_cpu(rows: list[dict], launches: dict[str, dict]) -> dict:
    """The per-group FIFO on CPU tensors (torchrun, ``PCCL_ASYNC=thread``, 2 and 3 ranks): 0 wrong."""
    parts = []
    for label, found in _each_launch(FIFO_CPU_LAUNCHES, ("fifo",), rows, launches, parts):
        for case in sorted({r.get("case") for r in found}):
            group = [r for r in found if r.get("case") == case]
            errors = [f"rank {r.get('rank')}: {r['error'].splitlines()[0][:300]}" for r in group if r.get("error")]
            wrong = sum(int(r.get("wrong") or 0) for r in group)
            checked = sum(int(r.get("checked") or 0) for r in group)
            parts.append(_part(f"{label} {case}", not errors and not wrong and checked > 0,
                               "; ".join(errors[:2]) or f"{wrong} of {checked} wrong", wrong=wrong, checked=checked))
    return _verdict("c-fifo-cpu", parts, "all_reduce(async) then broadcast, 0 wrong")


JUDGES = (judge_losses, judge_host_return, judge_sync, judge_streams, judge_plans, judge_step_time, judge_fifo_cpu)


def contract_verdicts(rows: list[dict], launches: dict[str, dict]) -> list[dict]:
    """Every judge's entry; one that breaks on odd rows fails with the reason instead of losing the summary."""
    verdicts = []
    for judge in JUDGES:
        try:
            verdicts.append(judge(rows, launches))
        except Exception as exc:  # noqa: BLE001 - reported as this verdict's failure
            verdicts.append({"name": judge.__name__, "kind": "verdict", "status": "fail",
                             "reason": f"judge failed: {type(exc).__name__}: {exc}"})
    return verdicts


def contract(path: str) -> int:
    """Judge a ``contract.jsonl`` (from $OUT) again, every launch with rows taken as run; exit 1 on a failure."""
    rows = load_rows(Path(path))
    launches = {label: {"status": "pass", "reason": ""} for label in {r.get("label") for r in rows}}
    verdicts = contract_verdicts(rows, launches)
    for v in verdicts:
        print(f"{v['status']:<5} {v['name']:<22} {v['reason'][:600]}")
    return 1 if any(v["status"] == "fail" for v in verdicts) else 0


def _status(name: str, kind: str, rc: str, seconds: float, limit: str, note: str, work: Path) -> dict:
    entry: dict[str, object] = {"name": name, "kind": kind, "seconds": round(seconds, 1), "limit_s": limit}
    log = work / f"{name}.out"
    if kind == "skip":
        entry.update(status="skip", reason=note)
        return entry
    code = int(rc)
    entry["rc"] = code
    timed_out = code in (124, 137)
    details: dict = {}
    if name == "kernels":
        details = _kernels(work)
    elif name.startswith("bench-"):
        details = _bench(work, name.removeprefix("bench-"))
    elif name.startswith("api-") or name == "staging-cuda":
        details = _driver(work, name)
    elif name.startswith("backend"):
        data = _load(work / f"{name}.json")
        details = data if isinstance(data, dict) else {"error": "no backend JSON"}
    elif name.startswith("pccl-bench"):
        data = _load(work / f"{name}.json")
        details = {"rows": data} if data is not None else {"error": "no pccl-bench JSON"}
        if name == "pccl-bench-w2-host":
            details["staging"] = _staging(work)
    failure_text = details.pop("all_failure_text", "") if isinstance(details, dict) else ""
    entry["details"] = details
    if timed_out:
        status, reason = "fail", f"timed out after {limit} s; log tail: {_tail(log)}"
    elif kind == "xfail-nccl":
        if code == 0 and details.get("failed") == 0:
            status, reason = "pass", "NCCL accepted two ranks of one communicator on one GPU (not expected)"
        elif any(s in failure_text or s in _tail(log, 40) for s in NCCL_REFUSAL):
            first = next((line for line in failure_text.splitlines() if any(s in line for s in NCCL_REFUSAL)), "")
            status, reason = "xfail", f"expected: NCCL refuses two ranks on one GPU ({first.strip()[:300]})"
        else:
            status, reason = "fail", f"failed, but not with NCCL's duplicate-GPU refusal (exit {code}): {_tail(log)}"
    elif name.startswith("bench-") and code == 0 and not details.get("error"):
        missed = details.get("goal_missed", {})
        status = "fail" if missed else "pass"
        reason = (f"goal missed (dispatch/copy_ < {BENCH_GOAL} at >= 16 MiB): {missed}" if missed
                  else f"dispatch >= {BENCH_GOAL} x copy_ at >= 16 MiB for {', '.join(BENCH_GOAL_KERNELS)}")
    elif name.startswith("backend") and isinstance(details, dict) and "checks" in details:
        bad = {k: v.get("reason", "") for k, v in details["checks"].items() if v.get("status") == "fail"}
        status = "fail" if bad or code != 0 else "pass"
        reason = (f"failed checks: {json.dumps(bad)[:600]}" if bad else
                  (f"exit {code}: {_tail(log)}" if code else "every check passed (or failed as expected)"))
    elif code == 0:
        status, reason = "pass", note or ("exit 0; its rows are judged by the c* verdicts" if kind == "contract"
                                          else "exit 0")
    else:
        status = "fail"
        if note:
            reason = f"exit {code}: {note}"
        elif (name.startswith("api-") or name == "staging-cuda") and details.get("first_failures"):
            reason = f"exit {code}; {details.get('failed')} failed; first: {details['first_failures'][0][:300]}"
        elif name == "kernels" and details.get("failures"):
            reason = f"exit {code}; first: {details['failures'][0]}"
        else:
            reason = f"exit {code}: {_tail(log)}"
    if kind == "experimental" and status == "fail":
        reason = "experimental (not counted): " + reason
    entry.update(status=status, reason=reason)
    return entry


def _verdict_lines(verdict: dict) -> list[str]:
    """A verdict's parts in summary.txt: every failure, and the figures a reader wants beside the goal."""
    details = verdict.get("details") or {}
    lines = []
    for part in details.get("parts", []):
        figure = part.get("ratio", part.get("share"))
        if part["status"] == "fail" or figure is not None:
            lines.append(f"      {part['status']:<5} {part['what']}: {str(part.get('reason', ''))[:300]}")
    if details.get("figures"):
        lines.append(f"      step times: {json.dumps(details['figures'])}")
    return lines


def summary(work_dir: str, out_dir: str) -> int:
    work, out = Path(work_dir), Path(out_dir)
    sections = []
    tsv = work / "sections.tsv"
    for line in (tsv.read_text().splitlines() if tsv.exists() else []):
        parts = line.split("\t")
        if len(parts) < 6:
            continue
        name, kind, rc, seconds, limit, note = parts[:6]
        try:
            sections.append(_status(name, kind, rc, float(seconds), limit, note, work))
        except Exception as exc:  # noqa: BLE001 - one bad artifact must not lose the summary
            sections.append({"name": name, "kind": kind, "status": "fail",
                             "reason": f"summary could not read this section: {type(exc).__name__}: {exc}"})
    launches = {s["name"]: s for s in sections}
    if any(name in launches for name in CONTRACT_LAUNCHES):
        sections += contract_verdicts(load_rows(work / "rows"), launches)
    counted = [s for s in sections if s.get("kind") != "experimental"]
    counts = {k: sum(1 for s in sections if s["status"] == k) for k in ("pass", "fail", "skip", "xfail")}
    result = {
        "script": "scripts/gpu_check.sh",
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.time() - float(os.environ.get("GPU_CHECK_START", time.time())), 1),
        "commit": os.environ.get("GPU_CHECK_COMMIT", ""),
        "env": _load(work / "env.json"),
        "counts": counts,
        "ok": not any(s["status"] == "fail" for s in counted),
        "sections": sections,
    }
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    lines = [f"gpu_check: {counts} ok={result['ok']} ({result['seconds']} s, commit {result['commit'][:12]})"]
    env = result["env"] or {}
    lines.append("env: " + ", ".join(f"{k}={env.get(k)}" for k in ("gpu", "torch", "triton", "nccl", "mpi4py",
                                                                      "mpi_library") if k in env))
    for s in sections:
        lines.append(f"{s['status']:<5} {s['name']:<26} {s.get('seconds', '-'):>6}s  {s.get('reason', '')[:400]}")
        d = s.get("details") or {}
        if s["name"] == "kernels" and "per_dtype" in d:
            lines.append("      per dtype: " + "; ".join(f"{k} {v['passed']}/{sum(v.values())}"
                                                        for k, v in sorted(d["per_dtype"].items())))
        if s["name"].startswith("bench-") and "worst_vs_copy" in d:
            lines.append(f"      worst vs copy_ at >= 16 MiB: {d['worst_vs_copy']}; copy_ GB/s {d.get('copy_gbps')}")
        if (s["name"].startswith("api-") or s["name"] == "staging-cuda") and "passed" in d:
            lines.append(f"      {d.get('passed')} passed, {d.get('failed')} failed, {d.get('seconds')} s, {d.get('mpi')}")
        if s["name"] == "pccl-bench-w2-host" and "staging" in d:
            st = d["staging"]
            lines.append(f"      staged CUDA / host time from 16 MiB (goal <= {STAGING_GOAL}): "
                         f"{st.get('staged_over_host', st.get('error'))}; missed: {st.get('goal_missed')}")
        if s.get("kind") == "verdict":
            lines.extend(_verdict_lines(s))
        if s["name"].startswith("backend") and "checks" in d:
            for check, v in d["checks"].items():
                lines.append(f"      {v.get('status'):<5} {check}: {str(v.get('reason', ''))[:200]} "
                             f"{json.dumps(v.get('losses')) if v.get('losses') else ''}")
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "probe":
        return probe(argv[1])
    if argv[:1] == ["names"]:
        return names()
    if len(argv) >= 3 and argv[0] == "summary":
        return summary(argv[1], argv[2])
    if len(argv) >= 2 and argv[0] == "contract":
        return contract(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
