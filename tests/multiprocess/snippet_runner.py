"""Runs documentation snippets as one launch's script (``test_doc_snippets.py``): the doc's command line with
``train.py`` replaced by this file, the snippets' files in ``PCCL_DOC_SNIPPETS`` (``os.pathsep``-separated).

Each snippet runs as ``__main__`` (``runpy.run_path``) with fresh globals and ``sys.argv = [snippet, *args]``,
so it sees the arguments the launcher gave (DeepSpeed's ``--local_rank`` included) and a missing import or
name fails as it would in ``python train.py``. After each one, whatever it left initialised is torn down
(``pccl_torch.shutdown()``, ``destroy_process_group()``) so the next starts from nothing. Recorded per
snippet: the default group's backend and how many collectives pccl counted (``stats("all")``, read before
any ``pccl_torch.shutdown()``, the snippet's own included). The rank's result (``rank_result.write``) is
written last, after every snippet and its teardown returned; a snippet that raises ends the rank with a
non-zero status and no result.

The runner imports nothing of pccl_torch before a snippet does (a snippet that forgets ``import pccl_torch``
must fail here as it fails alone), and wraps ``pccl_torch.shutdown`` once the snippet has imported it."""

from __future__ import annotations

import builtins
import os
import runpy
import sys
from pathlib import Path

from rank_result import launched_rank, write

SNIPPETS_ENV = "PCCL_DOC_SNIPPETS"
_counted = [0]
"""Collectives pccl counted in the current snippet, read by the wrapped ``pccl_torch.shutdown``."""
_original_shutdown = None


def _pccl_calls() -> int:
    pccl_torch = sys.modules.get("pccl_torch")
    if pccl_torch is None:
        return 0
    try:
        return sum(pccl_torch.stats("all")["calls"].values())
    except Exception:  # noqa: BLE001 - nothing initialised: nothing counted
        return 0


def _shutdown_counting() -> None:
    _counted[0] = max(_counted[0], _pccl_calls())
    _original_shutdown()


def _import_watching(name, *args, _import=builtins.__import__, **kwargs):
    """``__import__`` that wraps ``pccl_torch.shutdown`` as soon as anything has imported ``pccl_torch``."""
    global _original_shutdown
    module = _import(name, *args, **kwargs)
    pccl_torch = sys.modules.get("pccl_torch")
    current = getattr(pccl_torch, "shutdown", None)
    if current is not None and current is not _shutdown_counting:  # (re)bound by pccl_torch's own import
        _original_shutdown = current
        pccl_torch.shutdown = _shutdown_counting
    return module


def _teardown() -> None:
    """Whatever the snippet left initialised: pccl's default communicator, then torch's default group."""
    import torch.distributed as dist

    if _original_shutdown is not None and sys.modules["pccl_torch"].is_initialized():
        _original_shutdown()
    if dist.is_initialized():
        dist.destroy_process_group()


def main() -> None:
    paths = [Path(p) for p in os.environ[SNIPPETS_ENV].split(os.pathsep) if p]
    args = sys.argv[1:]
    rank = launched_rank()
    builtins.__import__ = _import_watching
    _import_watching("sys")  # pccl_torch already imported (python -m pccl_torch.run): wrap it now
    done = []
    for path in paths:
        _counted[0] = 0
        print(f"[snippet {path.stem}] rank {rank}: start", flush=True)
        sys.argv = [str(path), *args]
        runpy.run_path(str(path), run_name="__main__")
        import torch.distributed as dist

        backend = dist.get_backend() if dist.is_initialized() else None
        calls = max(_counted[0], _pccl_calls())
        _teardown()
        done.append({"snippet": path.stem, "backend": backend, "pccl_calls": calls})
        print(f"[snippet {path.stem}] rank {rank}: done (backend {backend}, {calls} pccl calls)", flush=True)
    write({"snippets": done}, rank)


if __name__ == "__main__":
    main()
