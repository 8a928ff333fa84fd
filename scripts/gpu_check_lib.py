"""Helpers of ``scripts/gpu_check.sh`` (run with the checked Python; standard library plus pccl_torch only).

    python scripts/gpu_check_lib.py probe ENV_JSON          what this machine has (torch, CUDA, triton, MPI)
    python scripts/gpu_check_lib.py names                   algorithm lists for the CUDA driver launches
    python scripts/gpu_check_lib.py summary WORK OUT        summary.json and summary.txt from the sections

The shell script records one line per section in ``WORK/sections.tsv`` (name, kind, exit status, seconds,
limit, note); ``summary`` turns each into pass / fail / skip / xfail with a reason, reading the section's
artifacts in WORK (junit XML, bench JSON, driver JSON) and folding their figures into ``summary.json``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import xml.etree.ElementTree as ET
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


def _status(name: str, kind: str, rc: str, seconds: float, limit: str, note: str, work: Path) -> dict:
    entry: dict[str, object] = {"name": name, "kind": kind, "seconds": round(seconds, 1), "limit_s": limit}
    log = work / f"{name}.out"
    if kind == "skip":
        entry.update(status="skip", reason=note)
        return entry
    code = int(rc)
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
        status, reason = "pass", note or "exit 0"
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
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
