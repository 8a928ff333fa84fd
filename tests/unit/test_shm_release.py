"""What killed ranks leave in ``/dev/shm`` is unlinked by pccl's launch (``pccl_torch.testbed.launch``), and only
that: a segment some live process maps or holds open (another job's, starting or running) stays."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pccl_torch.testbed import launch

pytestmark = pytest.mark.skipif(not launch.SHM_DIR.is_dir(), reason="no /dev/shm")

# A live rank: maps the segment (and, with HOLD_FD, keeps its file open too), says so, and waits for stdin to close.
HOLDER = textwrap.dedent("""
    import mmap, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR)
    mapped = mmap.mmap(fd, 4096)
    if sys.argv[2] == "close-fd":
        os.close(fd)  # mapped only, as MPICH keeps it after attaching
    print("ready", flush=True)
    sys.stdin.read()
""")


def _segment(tag: str) -> Path:
    path = launch.SHM_DIR / f"mpich_shm_pccltest{os.getpid()}{tag}_0"
    path.write_bytes(bytes(4096))
    return path


@pytest.fixture
def segments():
    made: list[Path] = []
    yield lambda tag: made.append(_segment(tag)) or made[-1]
    for path in made:
        path.unlink(missing_ok=True)


def test_an_orphaned_segment_is_unlinked(segments) -> None:
    orphan = segments("orphan")
    other = launch.SHM_DIR / f"pccltest{os.getpid()}_not_mpi"
    other.write_bytes(b"")
    try:
        assert launch.release_segments(among={orphan.name, other.name}) == [orphan.name]
        assert not orphan.exists() and other.exists()  # not an MPI library's name: never touched
    finally:
        other.unlink(missing_ok=True)


@pytest.mark.parametrize("how", ["close-fd", "keep-fd"])
def test_a_segment_in_use_stays(segments, how: str) -> None:
    used = segments(how)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(used), how], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert used.name in launch.shm_in_use()
        assert launch.release_segments(among={used.name}) == []
        assert used.exists()
    finally:
        holder.communicate(timeout=30)
    assert launch.release_segments(among={used.name}) == [used.name]  # its process gone: an orphan now


def test_a_launch_releases_what_it_left(segments) -> None:
    earlier = segments("earlier")  # not this launch's: left alone
    killed = launch.SHM_DIR / f"mpich_shm_pccltest{os.getpid()}killed_0"
    rank = f"open({str(killed)!r}, 'wb').write(bytes(4096)); import os; os._exit(9)"  # a rank killed at once
    try:
        assert launch.run_released([sys.executable, "-c", rank]) == 9
        assert not killed.exists()
        assert earlier.exists()
    finally:
        killed.unlink(missing_ok=True)
