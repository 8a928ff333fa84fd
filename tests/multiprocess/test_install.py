"""One install step: a fresh virtual environment with torch, ``pip install`` of the project the ordinary way (no
``make``, no build command), and the compiled hot path runs under ``mpiexec``; then the same from a wheel.

The environment is new (``python -m venv``; torch pinned to the CPU build that lies on this machine's disk, so pip
never pulls a CUDA build, and installed without byte-compiling its thousands of modules: what is under test is the
project's install, not torch's); the project's other dependencies come from pip as a user's would. The hot path's
build cache is the test's own, so the first import compiles it, with 4 ranks importing at once. The wheel, installed
over it, then runs from that cache without compiling: the cache is keyed by a digest of the installed
``_hotpath.cpp`` (among the rest), so this shows at once that a later run is served from the cache and that the
wheel ships the same source the compile used (a wheel without it, or with another, would leave the hot path off or
compile again). About a minute and a half on 2 cores: half a minute of it is torch's install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .conftest import ROOT

TORCH_SPEC = "torch==2.13.0"  # the Makefile's: the CPU build; never let pip choose a torch
# What the package build needs of the checkout (pyproject's package-dir), copied so the build writes nothing there.
SOURCES = ("pyproject.toml", "README.md", "pccl_torch", "triton_kernels", "integrations")
COMPILING = "compiling the hot path for this environment"

# Every rank: the package is the installed one, the hot path is available and runs the calls of a bound shape.
CHECK = textwrap.dedent("""
    import sys
    import torch
    import pccl_torch, pccl_torch.hotpath as hotpath

    comm = pccl_torch.init()
    t = torch.ones(256)
    for _ in range(5):
        pccl_torch.all_reduce(t)
    rank, size = comm.topology.rank, comm.topology.world_size
    assert pccl_torch.__file__.startswith(sys.prefix), pccl_torch.__file__
    assert hotpath.available, hotpath.why_not
    assert t.eq(size ** 5).all(), t[:4]
    hot = pccl_torch.stats()["hotpath"]["calls"]
    assert hot >= 4, hot  # the first call binds the shape, the later ones run in the extension
    print(f"rank {rank}: hot path available, {hot} of 5 all-reduces in it, {hotpath._ext.__file__}")
    pccl_torch.shutdown()
""")


def _run(command: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(command)} did not finish in {timeout_s} s\n{exc.stdout}\n{exc.stderr}")
    assert done.returncode == 0, (f"{' '.join(command)}: exit {done.returncode}\n{done.stdout[-3000:]}\n"
                                  f"{done.stderr[-5000:]}")
    return done


def _copy_sources(dest: Path) -> Path:
    dest.mkdir()
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.partial"))
        else:
            shutil.copy2(source, dest / name)
    return dest


def _check(venv: Path, ranks: int, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = _run([str(venv / "bin" / "mpiexec"), "-n", str(ranks), str(venv / "bin" / "python"), str(cwd / "check.py")],
                env, cwd, 300)
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
    assert [line.split(":")[0] for line in lines] == [f"rank {r}" for r in range(ranks)], done.stdout + done.stderr
    assert "hot path is off" not in done.stderr, done.stderr
    return done


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_pip_install_gives_the_hot_path(tmp_path: Path) -> None:
    venv, work = tmp_path / "venv", tmp_path / "work"
    source = _copy_sources(tmp_path / "source")
    work.mkdir()
    (work / "check.py").write_text(CHECK)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PCCL_", "PYTHON", "VIRTUAL_ENV", "MPI4PY_", "OMPI_", "PMI_", "HYDRA_"))}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PIP_DISABLE_PIP_VERSION_CHECK="1",
               PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    timings = {}

    start = time.monotonic()
    _run([sys.executable, "-m", "venv", str(venv)], env, work, 120)
    _run([*pip, "--no-compile", TORCH_SPEC], env, work, 600)  # no .pyc of torch's modules: written when imported
    timings["venv and torch"] = time.monotonic() - start

    start = time.monotonic()
    _run([*pip, str(source)], env, work, 600)  # the ordinary way: dependencies resolved by pip
    timings["pip install"] = time.monotonic() - start

    start = time.monotonic()
    first = _check(venv, 4, env, work)  # 4 ranks import at once: one compiles, the others wait and load it
    timings["first run (compiles)"] = time.monotonic() - start
    assert first.stderr.count(COMPILING) == 1, first.stderr

    start = time.monotonic()
    dist = tmp_path / "dist"
    _run([str(venv / "bin" / "python"), "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(source)],
         env, work, 600)
    wheel = next(dist.glob("pccl_torch-*.whl"))
    _run([*pip, "--no-deps", "--force-reinstall", str(wheel)], env, work, 600)
    from_wheel = _check(venv, 2, env, work)  # the same cache: the wheel's source has the digest built above
    timings["wheel: build, install, cached run"] = time.monotonic() - start
    assert COMPILING not in from_wheel.stderr, from_wheel.stderr
    print("timings (s): " + ", ".join(f"{what} {seconds:.0f}" for what, seconds in timings.items()))
