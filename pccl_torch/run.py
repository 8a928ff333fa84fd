"""Run an unchanged training script with pccl as its communication backend.

    mpiexec -n 4 python -m pccl_torch.run train.py --deepspeed_config ds.json
    torchrun --nproc-per-node 4 -m pccl_torch.run train.py

Imports pccl_torch (registering the ``pccl`` torch.distributed backend), makes every
``torch.distributed.init_process_group`` call use pccl (:func:`pccl_backend`) and every
``deepspeed.init_distributed`` call too when DeepSpeed is installed, then runs the script as ``__main__``
with its own arguments.

The backend asked for becomes pccl on the CPU and on CUDA alike (``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``,
or none), and devices pccl does not run on (``xpu:xccl``, ...) keep their library. NCCL is replaced on CUDA too,
not kept, because a pccl group already keeps NCCL where it is the better library: it is pccl's level inside a
node, the flat ``vendor`` algorithm pccl's choice can pick, and what pccl does not implement (other dtypes, ops
and collectives) is handed to it unchanged. A script that wants NCCL beside pccl names it and runs without this
wrapper (``dist.init_process_group("cpu:pccl,cuda:nccl")``).
"""

from __future__ import annotations

import functools
import logging
import runpy
import sys
from pathlib import Path

import torch.distributed as dist

import pccl_torch  # noqa: F401 - registers the backend
from pccl_torch.integrations.torch_backend import BACKEND_NAME, monitored_barrier

log = logging.getLogger("pccl_torch.run")  # not __name__: run as `python -m`, that is "__main__"

DEVICES = ("cpu", "cuda")
"""Devices pccl runs on: what they were given becomes pccl."""


def pccl_backend(backend: str | None) -> str:
    """The backend string that gives pccl every device of ``backend`` pccl runs on: ``"gloo"``, ``"nccl"``,
    ``"cpu:gloo,cuda:nccl"`` or None -> ``"pccl"``; other devices keep their library (``"cpu:gloo,xpu:xccl"`` ->
    ``"cpu:pccl,xpu:xccl"``)."""
    if backend is None or "undefined" in str(backend).lower():
        return BACKEND_NAME
    devices = dist.distributed_c10d.BackendConfig(dist.Backend(backend)).get_device_backend_map()
    mapped = {device: BACKEND_NAME if device in DEVICES else name for device, name in devices.items()}
    if set(mapped.values()) == {BACKEND_NAME}:
        return BACKEND_NAME
    return ",".join(f"{device}:{name}" for device, name in mapped.items())


def force_torch_backend() -> None:
    """Make ``torch.distributed.init_process_group`` use pccl whatever backend its caller asks for
    (:func:`pccl_backend`), with one info line saying what was switched, and ``torch.distributed.monitored_barrier``
    take the pccl groups that replace gloo's (``pccl_torch.monitored_barrier``: torch's refuses any group not named
    gloo). Idempotent."""
    original = dist.init_process_group
    if getattr(original, "__pccl_forced__", False):
        return
    dist.monitored_barrier = dist.distributed_c10d.monitored_barrier = monitored_barrier

    @functools.wraps(original)
    def init_process_group(backend: str | None = None, *args, **kwargs):
        forced = pccl_backend(backend)
        if forced != backend:
            log.info("pccl_torch.run: init_process_group(backend=%r) runs with backend %r", backend, forced)
        return original(forced, *args, **kwargs)

    init_process_group.__pccl_forced__ = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group
    dist.distributed_c10d.init_process_group = init_process_group


def _force_deepspeed_backend() -> None:
    """DeepSpeed's ``init_distributed`` uses pccl too (its own bookkeeping names the backend), when installed."""
    try:
        from pccl_torch.integrations.deepspeed import force_backend

        force_backend(BACKEND_NAME)
    except ImportError:
        pass  # no DeepSpeed


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m pccl_torch.run SCRIPT [ARGS...]")
    force_torch_backend()
    _force_deepspeed_backend()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = str(Path(script).resolve().parent)  # as `python script.py`: the script's folder, not the cwd
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
