"""Fault trials under real ``mpiexec``: a killed rank, a rank that never calls, mismatched calls.

Each trial launches ``fault_driver.py`` on 4 ranks with ``mpiexec -disable-auto-cleanup`` (so a failure
does not make the launcher kill the survivors before they can report), then checks what every rank wrote:
the error type and text, how long it took, that the communicator then refused work at once, that shutdown
returned, and that no process of the trial is left. ``python -m tests.multiprocess.faults --trials 10``
runs the full series and prints a table; the pytest file runs a few.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.multiprocess.conftest import HERE, ROOT, mpiexec

RANKS = 4
TIMEOUT_S = 3.0
SLACK_S = 10.0  # the bound: every survivor reports within timeout + 10 s
LAUNCH_LIMIT_S = 180.0  # the whole trial, start-up included (a hang fails here)
VICTIM = RANKS - 1


@dataclass
class Trial:
    kind: str
    wall_s: float
    ranks: dict[int, dict] = field(default_factory=dict)
    leftover: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    torn_down: bool = False
    """kill only: MPICH/mpiexec killed some survivors before they could report (no hang either)."""

    @property
    def ok(self) -> bool:
        return not self.problems


def _leftovers(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "fault_driver.py" in line and "pgrep" not in line]


def _check_survivor(trial: Trial, rank: int, report: dict, expected: str, text: str) -> None:
    if report.get("type") != expected or text not in (report.get("error") or ""):
        trial.problems.append(f"rank {rank}: expected {expected} containing {text!r}, got {report}")
        return
    if report["elapsed_s"] > TIMEOUT_S + SLACK_S:
        trial.problems.append(f"rank {rank}: error after {report['elapsed_s']:.1f} s > {TIMEOUT_S + SLACK_S} s")
    if report.get("after") != "CommunicatorBrokenError" or report.get("after_s", 1) > 0.5:
        trial.problems.append(f"rank {rank}: the broken communicator did not refuse the next call at once")


def _check(trial: Trial) -> None:
    survivors = [r for r in range(RANKS) if r != VICTIM]
    if trial.kind in ("kill", "skip"):
        text = "mpiexec reported a failed process" if trial.kind == "kill" else "timed out after"
        for rank in survivors:
            if rank in trial.ranks:
                _check_survivor(trial, rank, trial.ranks[rank], "PcclTimeoutError", text)
            elif trial.kind == "kill":
                # MPICH (no fault tolerance) aborted the job when its progress engine saw the dead peer,
                # and mpiexec killed this rank before it could report: acceptable only because nothing hangs.
                trial.torn_down = True
            else:
                trial.problems.append(f"rank {rank} wrote no report")
    else:
        for rank in range(RANKS):
            report = trial.ranks.get(rank)
            if report is None:
                trial.problems.append(f"rank {rank} wrote no report")
                continue
            for case in report["trials"]:
                if case.get("type") != "PcclMismatchError" or f"ranks [{VICTIM}]" not in case["error"]:
                    trial.problems.append(f"rank {rank} case {case['case']}: {case}")
            if not report["sound_after"]:
                trial.problems.append(f"rank {rank}: the communicator was unusable after the mismatches")
    if trial.leftover:
        trial.problems.append(f"processes left running: {trial.leftover}")


def run_trial(kind: str, workdir: Path, local_size: int = 2) -> Trial:
    """One launch of ``kind`` on 4 ranks (2 emulated nodes x 2 by default); the checked outcome."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = ["--out", str(workdir), "--timeout", str(TIMEOUT_S)]
    if kind == "skip":
        args += ["--algorithm", "ring"]  # point-to-point: the error names the exact peer not heard from
    command = [mpiexec(), "-disable-auto-cleanup", "-n", str(RANKS), "-env", "PCCL_LOCAL_SIZE", str(local_size),
               sys.executable, str(HERE / "fault_driver.py"), kind, *args]
    start = time.monotonic()
    try:
        subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=LAUNCH_LIMIT_S)
    except subprocess.TimeoutExpired:
        pass  # reported below as leftover processes / missing reports
    trial = Trial(kind, time.monotonic() - start)
    for path in workdir.glob("rank*.json"):
        trial.ranks[int(path.stem.removeprefix("rank"))] = json.loads(path.read_text())
    trial.leftover = _leftovers(str(workdir))
    for line in trial.leftover:  # never leave a stray process behind, even when the trial failed
        subprocess.run(["kill", "-9", line.split()[0]], capture_output=True)
    _check(trial)
    return trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--kinds", default="kill,skip,mismatch")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pccl-faults-") as tmp:
        for kind in args.kinds.split(","):
            outcomes = [run_trial(kind, Path(tmp) / f"{kind}-{i}") for i in range(args.trials)]
            for i, t in enumerate(outcomes):
                print(f"{kind} #{i}: {'ok' if t.ok else 'FAILED'} wall {t.wall_s:.1f} s"
                      f"{' (torn down by mpiexec)' if t.torn_down else ''} {'; '.join(t.problems)}", flush=True)
            reported = sum(t.ok and not t.torn_down for t in outcomes)
            torn = sum(t.torn_down for t in outcomes)
            rows.append((kind, len(outcomes), sum(t.ok for t in outcomes), reported, torn,
                         max(t.wall_s for t in outcomes)))
    print("\nkind      trials  no hang+no leftover  survivors reported  torn down by mpiexec  max wall s")
    for kind, n, ok, reported, torn, wall in rows:
        print(f"{kind:9} {n:6}  {ok:19}  {reported:18}  {torn:20}  {wall:10.1f}")
    sys.exit(0 if all(r[1] == r[2] for r in rows) else 1)


if __name__ == "__main__":
    main()
