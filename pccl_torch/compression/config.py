"""Which wire format a call uses: ``compression=`` on the call, else ``PCCL_COMPRESSION`` for its collective.

``PCCL_COMPRESSION=all_gather:int8,reduce_scatter:bf16`` (or one format for all three: ``PCCL_COMPRESSION=bf16``)
is read once per communicator, as ``PCCL_ALGO`` is. The rule for dtypes a format does not apply to (bf16
on a bfloat16 tensor, anything on integers): an explicit ``compression=`` is an error, raised before any
communication; the environment's choice leaves such calls exact, so a job-wide setting never breaks a
framework's integer or already-16-bit collectives. On a single node nothing crosses a network, so the API
layer (``pccl_torch.choice``) runs such calls exact after these checks.
"""

from __future__ import annotations

import os

import torch

from pccl_torch.algorithms import COLLECTIVES, Collective
from pccl_torch.compression.formats import NAMES, get

COMPRESSION_ENV = "PCCL_COMPRESSION"


def env_formats() -> dict[str, str]:
    """``PCCL_COMPRESSION`` as {collective: format}; a malformed value raises, naming what is valid."""
    raw = os.environ.get(COMPRESSION_ENV, "").strip()
    if not raw or raw.lower() == "none":
        return {}
    if ":" not in raw:
        get(raw)  # an unknown format fails here, listing the valid ones
        return dict.fromkeys(COLLECTIVES, raw)
    formats = {}
    for entry in raw.split(","):
        collective, sep, name = entry.strip().partition(":")
        if collective not in COLLECTIVES or not sep:
            raise ValueError(f"{COMPRESSION_ENV} entry {entry!r} must look like 'all_gather:int8' with a collective "
                             f"of {', '.join(COLLECTIVES)} and a format of {', '.join(NAMES)}")
        if name.lower() != "none":
            get(name)
            formats[collective] = name
    return formats


def for_call(collective: Collective, explicit: str | None, env: dict[str, str], dtype: torch.dtype) -> str | None:
    """The format of one call (None: exact). An explicit format that does not apply to ``dtype`` raises."""
    if explicit is not None:
        get(explicit).check_dtype(dtype)
        return explicit
    name = env.get(collective)
    return name if name is not None and get(name).applies_to(dtype) else None
