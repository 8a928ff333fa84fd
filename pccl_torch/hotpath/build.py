"""Build the compiled hot path: ``python -m pccl_torch.hotpath.build`` (``make install`` runs it).

Compiles ``_hotpath.cpp`` against torch's headers (``torch.utils.cpp_extension`` names them) and the MPI that
mpi4py loads (MPICH's ``mpicc -show`` gives its flags; the ``mpich`` wheel ships it beside the interpreter), into
``_hotpath<ext>`` next to the source. About 15 s on one core. Without a C++ compiler or MPICH's ``mpicc`` it
says why and exits 1; pccl then runs its Python path (``pccl_torch.hotpath.why_not``).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "_hotpath.cpp"


def target() -> Path:
    """Where the built extension goes (what ``import pccl_torch.hotpath._hotpath`` finds)."""
    return HERE / f"_hotpath{sysconfig.get_config_var('EXT_SUFFIX')}"


def mpi_flags() -> list[str]:
    """Compile and link flags of the MPI beside this interpreter (``mpicc -show``, MPICH's wrapper)."""
    mpicc = Path(sys.executable).parent / "mpicc"
    if not mpicc.exists():
        found = shutil.which("mpicc")
        if found is None:
            raise RuntimeError("no mpicc beside the interpreter or on PATH (pip install mpich)")
        mpicc = Path(found)
    shown = subprocess.run([str(mpicc), "-show"], capture_output=True, text=True, check=True).stdout.split()
    return [flag for flag in shown[1:] if flag.startswith(("-I", "-L", "-l", "-Wl,"))]


def command(output: Path) -> list[str]:
    """The compiler command line that builds ``output``."""
    import torch
    from torch.utils import cpp_extension

    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (c++ or g++) on PATH")
    includes = [f"-I{path}" for path in [sysconfig.get_paths()["include"], *cpp_extension.include_paths()]]
    torch_libs = [arg for path in cpp_extension.library_paths() for arg in (f"-L{path}", f"-Wl,-rpath,{path}")]
    return [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", *includes, str(SOURCE), *mpi_flags(), *torch_libs,
            "-lc10", "-ltorch_python", "-o", str(output)]


def build(output: Path | None = None, *, verbose: bool = False) -> Path:
    """Compile the extension (only when the source is newer than ``output``); returns its path."""
    output = output or target()
    if output.exists() and output.stat().st_mtime >= SOURCE.stat().st_mtime:
        return output
    cmd = command(output)
    if verbose:
        print(shlex.join(cmd))
    partial = output.with_suffix(".partial")
    cmd[-1] = str(partial)
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"compiling {SOURCE.name} failed:\n{result.stderr.strip()}")
    partial.replace(output)  # atomic: ranks importing it meanwhile see the old file or the new one
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verbose", action="store_true", help="print the compiler command")
    args = parser.parse_args()
    try:
        built = build(verbose=args.verbose)
    except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
        print(f"pccl hot path not built: {exc}", file=sys.stderr)
        sys.exit(1)
    print(f"pccl hot path: {built}")


if __name__ == "__main__":
    main()
