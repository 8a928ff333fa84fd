"""How the compiled hot path is built, once per environment: at the first ``import pccl_torch``, or ahead of time
with ``python -m pccl_torch.hotpath.build`` (``make install`` runs it). Both go through :func:`ensure`.

``pip install`` (plain, editable, a wheel or an sdist) ships ``_hotpath.cpp`` only: the extension is compiled
against the torch and the MPICH this environment runs, which a package build cannot know (pip builds in an
isolated environment with neither). As ``torch.utils.cpp_extension.load`` and DeepSpeed's op builders do, the
first use compiles it into a build cache and later imports load it from there:

- the cache is ``$XDG_CACHE_HOME/pccl-torch/hotpath/`` (``~/.cache/...``), one directory per environment, named
  after the interpreter, torch and MPICH versions and a digest of everything the build depends on (the source,
  the flags, torch, the MPI library, the environment's prefix): a changed source or another venv builds anew;
- one process builds, the others wait on the directory's lock (``flock``, released by the kernel if the builder
  dies) and then load what it built: 8 ranks importing at once compile once. The compiler writes a file of its
  own, renamed into place, so a reader never sees half a library (and where the file system has no locks, the
  racing builds still each install a whole one);
- a compiler error is kept (``failed.log`` beside) so that every later import does not pay the compile again:
  ``python -m pccl_torch.hotpath.build`` retries. Missing tools (no C++ compiler, no Python headers, no MPICH
  ``mpicc``) are checked at every import, which costs nothing.

About 15 s on one core. Where it cannot be built, ``import pccl_torch`` logs one warning naming why and pccl runs
its Python path (``pccl_torch.hotpath.why_not``). This module imports nothing of pccl_torch (the package's
``__init__`` loads through it), and torch and MPI only inside the calls that need them.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("pccl_torch.hotpath")

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "_hotpath.cpp"
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
LIBRARY_NAME = f"_hotpath{EXT_SUFFIX}"
"""The built extension's file name (what ``PyInit__hotpath`` and the import machinery expect)."""
FAILED_NAME = "failed.log"
FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-w")
COMPILE_TIMEOUT_S = 900


class BuildError(RuntimeError):
    """Why the hot path cannot be built here (one line)."""


class CompileError(BuildError):
    """The compiler ran and failed (its command and error follow the first line)."""


def cache_root() -> Path:
    """The build cache of every environment (``$XDG_CACHE_HOME/pccl-torch/hotpath``), beside pccl's other caches."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pccl-torch" / "hotpath"


def mpich_version(library: str) -> str:
    """The MPICH version of ``MPI.Get_library_version()``'s text; :class:`BuildError` for another MPI (the
    extension compiles in MPICH's handles: importing it would load MPICH's libmpi beside the other one)."""
    first = library.split("\n", 1)[0].split(",", 1)[0].strip()
    if not library.startswith("MPICH"):
        raise BuildError(f"mpi4py runs {first}, the extension is built for MPICH")
    return library.split("Version:", 1)[-1].split()[0] if "Version:" in library else ""


def directory(library: str) -> Path:
    """This environment's build directory for the MPI library ``library`` (``MPI.Get_library_version()``)."""
    import torch

    version = mpich_version(library)
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), repr(FLAGS).encode(), torch.__version__.encode(), torch.__file__.encode(),
                 str(torch._C._GLIBCXX_USE_CXX11_ABI).encode(), library.encode(), sys.prefix.encode(),
                 sys.version.encode(), EXT_SUFFIX.encode()):
        digest.update(hashlib.sha256(part).digest())
    name = f"{sys.implementation.cache_tag}-torch{torch.__version__}-mpich{version}-{digest.hexdigest()[:12]}"
    return cache_root() / name


def compiler() -> list[str]:
    """The C++ compiler: ``$CXX`` (as torch's extension builder reads it), else ``c++`` or ``g++`` on PATH."""
    chosen = shlex.split(os.environ.get("CXX", ""))
    if chosen:
        if shutil.which(chosen[0]) is None:
            raise BuildError(f"no C++ compiler: CXX={chosen[0]} not found")
        return chosen
    found = shutil.which("c++") or shutil.which("g++")
    if found is None:
        raise BuildError("no C++ compiler (c++ or g++ on PATH, or CXX)")
    return [found]


def mpi_flags() -> list[str]:
    """Compile and link flags of the MPI beside this interpreter (``mpicc -show``, MPICH's wrapper; the ``mpich``
    wheel puts it in the environment's ``bin``)."""
    candidates = [Path(sys.prefix) / "bin" / "mpicc", Path(sys.executable).parent / "mpicc"]
    mpicc = next((str(path) for path in candidates if path.exists()), None) or shutil.which("mpicc")
    if mpicc is None:
        raise BuildError("no mpicc beside the interpreter or on PATH (pip install mpich)")
    try:
        shown = subprocess.run([mpicc, "-show"], capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"{mpicc} -show failed: {exc}") from None
    return [flag for flag in shown[1:] if flag.startswith(("-I", "-L", "-l", "-Wl,"))]


def command() -> list[str]:
    """The compiler command line, less its ``-o`` output: torch's headers and libraries (where
    ``torch.utils.cpp_extension.include_paths()`` and ``library_paths()`` point, found here without importing that
    module, which imports setuptools), the interpreter's headers and the MPI's flags."""
    import torch

    python_include = Path(sysconfig.get_paths()["include"])
    if not (python_include / "Python.h").exists():
        raise BuildError(f"no Python headers ({python_include}/Python.h; the python3-dev package)")
    torch_root = Path(torch.__file__).resolve().parent
    includes = [python_include, torch_root / "include", torch_root / "include" / "torch" / "csrc" / "api" / "include"]
    torch_lib = torch_root / "lib"
    return [*compiler(), *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *(f"-I{path}" for path in includes), str(SOURCE), *mpi_flags(), f"-L{torch_lib}",
            f"-Wl,-rpath,{torch_lib}", "-lc10", "-ltorch_python"]


def compiler_run(*, verbose: bool = False) -> Callable[[Path], None]:
    """What compiles the extension into a given file: checks the tools first (:class:`BuildError` names what is
    missing), and raises :class:`CompileError` with the compiler's error when compiling fails."""
    cmd = command()
    return lambda output: _compile([*cmd, "-o", str(output)], verbose=verbose)


def _compile(cmd: list[str], *, verbose: bool) -> None:
    if verbose:
        print(shlex.join(cmd), file=sys.stderr)
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CompileError(f"compiling {SOURCE.name} took over {COMPILE_TIMEOUT_S} s") from None
    if result.returncode != 0:
        raise CompileError(f"compiling {SOURCE.name} failed:\n{shlex.join(cmd)}\n{result.stderr.strip()}")


def build_once(where: Path, prepare: Callable[[], Callable[[Path], None]], *, retry_failed: bool = False) -> Path:
    """``where``'s extension, built first unless there: by one process of all that ask at once (the others wait on
    ``where/lock``, then find it), with ``prepare()(path)`` (``prepare`` raises :class:`BuildError` where a tool is
    missing, which is checked again at every call; the compile, :class:`CompileError` when it fails, which is
    recorded in ``where/failed.log`` and reported, not retried, unless ``retry_failed``)."""
    built = where / LIBRARY_NAME
    if built.exists():
        return built
    try:
        where.mkdir(parents=True, exist_ok=True)
        lock = open(where / "lock", "a")  # noqa: SIM115 - held until the build is in place
    except OSError as exc:
        raise BuildError(f"cannot write the build cache {where}: {exc.strerror}") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:  # a file system without locks: racing builds each rename a whole library into place
            pass
        if built.exists():  # built by the process that held the lock before
            return built
        failed = where / FAILED_NAME
        if failed.exists() and not retry_failed:
            raise BuildError(f"compiling {SOURCE.name} failed before (log: {failed}); "
                             "python -m pccl_torch.hotpath.build retries")
        compile_ = prepare()
        partial = where / f"{LIBRARY_NAME}.{os.getpid()}.partial"
        log.warning("pccl: compiling the hot path for this environment, once (about 15 s): %s", where)
        try:
            compile_(partial)
        except CompileError as exc:
            partial.unlink(missing_ok=True)
            failed.write_text(f"{exc}\n")
            raise BuildError(f"compiling {SOURCE.name} failed (log: {failed})") from exc
        failed.unlink(missing_ok=True)
        partial.replace(built)  # atomic: a reader sees no library or the whole one
    return built


def ensure(library: str, *, retry_failed: bool = False, rebuild: bool = False, verbose: bool = False) -> Path:
    """The extension for this environment and MPI library ``library`` (``MPI.Get_library_version()``), compiled
    into the build cache unless it is there (``rebuild``: compiled again); :class:`BuildError` says why not."""
    where = directory(library)
    if rebuild:
        (where / LIBRARY_NAME).unlink(missing_ok=True)
    return build_once(where, lambda: compiler_run(verbose=verbose), retry_failed=retry_failed)
