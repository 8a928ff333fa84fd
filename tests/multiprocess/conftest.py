"""Helpers to launch real MPI jobs from pytest (each test declares its rank count and local size)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def mpiexec() -> str:
    """The mpiexec of the environment running the tests (the MPI wheel puts it in sys.prefix/bin)."""
    candidate = Path(sys.prefix) / "bin" / "mpiexec"
    found = str(candidate) if candidate.exists() else shutil.which("mpiexec")
    if not found:
        pytest.fail("no mpiexec found: install the project (pip install -e .) so the MPI wheel provides it")
    return found


def launch(script: str, ranks: int, *args: str, local_size: int | None = None,
           timeout_s: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (relative to tests/multiprocess; or ``"-m"`` with a module first in ``args``) under
    ``mpiexec -n ranks``; fail on timeout."""
    environment = dict(os.environ)
    environment.pop("PCCL_ALGO", None)
    environment["PYTHONWARNINGS"] = "ignore::FutureWarning"
    if local_size is not None:
        environment["PCCL_LOCAL_SIZE"] = str(local_size)
    environment.update(env or {})
    target = [script] if script == "-m" else [str(HERE / script)]  # "-m": args start with a module name
    command = [mpiexec(), "-n", str(ranks), sys.executable, *target, *args]
    try:
        return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(command)} did not finish in {timeout_s} s (hang?)\n"
                    f"stdout:\n{exc.stdout}\nstderr:\n{exc.stderr}")
