"""Run an unchanged training script with pccl as its communication backend.

    mpiexec -n 4 python -m pccl_torch.run train.py --deepspeed_config ds.json

Imports pccl_torch (registering the ``pccl`` torch.distributed backend), makes every
``deepspeed.init_distributed`` call use it when DeepSpeed is installed, then runs the script as
``__main__`` with its own arguments.
"""

from __future__ import annotations

import runpy
import sys

import pccl_torch  # noqa: F401 - registers the backend


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m pccl_torch.run SCRIPT [ARGS...]")
    try:
        from pccl_torch.integrations.deepspeed import force_backend

        force_backend("pccl")
    except ImportError:
        pass  # no DeepSpeed: torch.distributed users pass backend="pccl" themselves
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
