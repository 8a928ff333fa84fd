"""How the compiled hot path is built (``pccl_torch/hotpath/_builder.py``): once per environment even when many
processes ask at once, a failed compile kept and not repeated, a missing tool never kept, and each reason one line.

The builds here run a stand-in compile (a file written after a pause), not the C++ compiler: what is tested is
the cache and its lock. ``tests/multiprocess/test_install.py`` compiles for real in a fresh environment."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pccl_torch.hotpath import _builder
from pccl_torch.hotpath._builder import BuildError, CompileError, build_once

# A process that asks for the extension in WHERE, the stand-in compile appending its pid to WHERE/../compiles.
# It loads _builder.py by file name: importing pccl_torch would load (and maybe build) the real hot path.
ASKER = textwrap.dedent("""
    import importlib.util, os, sys, time
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("_builder", sys.argv[1])
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    where = Path(sys.argv[2])

    def compile_(output):
        with open(where.parent / "compiles", "a") as log:
            log.write(f"{os.getpid()}\\n")
        time.sleep(0.5)
        output.write_bytes(b"built by %d" % os.getpid())

    print(builder.build_once(where, lambda: compile_))
""")


def _fake(output: Path) -> None:
    output.write_bytes(b"built")


def test_many_processes_at_once_compile_once(tmp_path: Path) -> None:
    where = tmp_path / "env"
    script = tmp_path / "asker.py"
    script.write_text(ASKER)
    askers = [subprocess.Popen([sys.executable, str(script), _builder.__file__, str(where)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(8)]
    results = [asker.communicate(timeout=60) for asker in askers]
    assert all(asker.returncode == 0 for asker in askers), [err for _, err in results]
    compiles = (tmp_path / "compiles").read_text().split()
    assert len(compiles) == 1, f"compiled {len(compiles)} times: {compiles}"
    assert {out.strip() for out, _ in results} == {str(where / _builder.LIBRARY_NAME)}
    assert (where / _builder.LIBRARY_NAME).read_bytes() == f"built by {compiles[0]}".encode()
    assert sorted(p.name for p in where.iterdir()) == sorted([_builder.LIBRARY_NAME, "lock"])  # no partial file left
    assert sum("compiling the hot path" in err for _, err in results) == 1  # the builder's one line, no other


def test_a_built_extension_is_not_compiled_again(tmp_path: Path) -> None:
    first = build_once(tmp_path, lambda: _fake)
    assert build_once(tmp_path, lambda: pytest.fail("compiled again")) == first


def test_a_failed_compile_is_kept_until_retried(tmp_path: Path) -> None:
    def broken(output: Path) -> None:
        raise CompileError("compiling _hotpath.cpp failed:\nc++ ...\nerror: expected ';'")

    with pytest.raises(BuildError, match=r"^compiling _hotpath.cpp failed \(log: .*failed.log\)$"):
        build_once(tmp_path, lambda: broken)
    assert "error: expected ';'" in (tmp_path / "failed.log").read_text()
    with pytest.raises(BuildError, match="failed before .* python -m pccl_torch.hotpath.build retries"):
        build_once(tmp_path, lambda: pytest.fail("an import compiled again after a failure"))
    built = build_once(tmp_path, lambda: _fake, retry_failed=True)
    assert built.read_bytes() == b"built" and not (tmp_path / "failed.log").exists()


def test_a_missing_tool_is_not_kept(tmp_path: Path) -> None:
    def no_compiler():
        raise BuildError("no C++ compiler (c++ or g++ on PATH, or CXX)")

    with pytest.raises(BuildError, match="no C.. compiler"):
        build_once(tmp_path, no_compiler)
    assert not (tmp_path / "failed.log").exists()
    assert build_once(tmp_path, lambda: _fake).exists()  # installed since: built at the next import


def test_no_compiler_is_named(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(BuildError, match=r"^no C\+\+ compiler \(c\+\+ or g\+\+ on PATH, or CXX\)$"):
        _builder.compiler()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("CXX", "no-such-cxx -O3")  # a compiler asked for is never swapped for another
    with pytest.raises(BuildError, match=r"^no C\+\+ compiler: CXX=no-such-cxx not found$"):
        _builder.compiler()


def test_no_mpicc_is_named(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    with pytest.raises(BuildError, match=r"no mpicc beside the interpreter or on PATH \(pip install mpich\)"):
        _builder.mpi_flags()


def test_another_mpi_is_named() -> None:
    library = "Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11\nMPI API: 3.1.0"
    with pytest.raises(BuildError, match=r"^mpi4py runs Open MPI v5.0.11, the extension is built for MPICH$"):
        _builder.mpich_version(library)
    assert _builder.mpich_version("MPICH Version:      5.0.2\nMPICH Release date: ...") == "5.0.2"


def test_an_unwritable_cache_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(BuildError, match="cannot write the build cache"):
        build_once(tmp_path / "file" / "env", lambda: _fake)


def test_the_directory_follows_the_source_and_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    library = "MPICH Version:      5.0.2\n"
    here = _builder.directory(library)
    assert here.parent == tmp_path / "pccl-torch" / "hotpath"
    assert here.name.startswith(f"{sys.implementation.cache_tag}-torch") and "-mpich5.0.2-" in here.name
    assert _builder.directory(library) == here
    monkeypatch.setattr(sys, "prefix", "/another/venv")
    assert _builder.directory(library) != here
