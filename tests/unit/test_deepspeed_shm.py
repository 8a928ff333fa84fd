"""``release_shared_memory``: the segment DeepSpeed's CPU backend leaves in /dev/shm is unlinked by its name."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pccl_torch.integrations.deepspeed import SHM_DIR, SHM_PREFIX, shared_memory_name

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm on this machine")

RELEASE = """
import sys, torch.distributed as dist
from pccl_torch.integrations.deepspeed import SHM_DIR, release_shared_memory, shared_memory_name
print(release_shared_memory())  # before init: nothing to do
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
(SHM_DIR / shared_memory_name(0)).write_bytes(b"x")  # where DeepSpeed's shm_initialize creates rank 0's
other = SHM_DIR / shared_memory_name(1)
other.write_bytes(b"y")  # another rank's: not this rank's to unlink
print(release_shared_memory(), (SHM_DIR / shared_memory_name(0)).exists(), other.exists())
other.unlink()
print(release_shared_memory())  # already gone
dist.destroy_process_group()
"""


def test_the_name_is_deepspeeds() -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert shared_memory_name(3, env) == f"{SHM_PREFIX}_{os.getuid()}_127.0.0.1_29500_3"
    assert shared_memory_name(0, {}) == f"{SHM_PREFIX}_{os.getuid()}___0"  # unset: empty, as DeepSpeed reads them


def test_release_unlinks_this_ranks_segment_only(tmp_path) -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(40000 + (hash(str(tmp_path)) % 20000)), "PATH": "/usr/bin"}
    done = subprocess.run([sys.executable, "-c", RELEASE, str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "False", "True", "False"]
