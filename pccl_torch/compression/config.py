"""Which wire format a call uses: ``compression=`` on the call, else ``PCCL_COMPRESSION`` for its collective.

``PCCL_COMPRESSION=all_gather:int8,reduce_scatter:bf16`` (or one format for every collective: ``PCCL_COMPRESSION=bf16``)
is read once per communicator, as ``PCCL_ALGO`` is. The rule for dtypes a format does not apply to (bf16
on a bfloat16 tensor, anything on integers): an explicit ``compression=`` is an error, raised before any
communication; the environment's choice leaves such calls exact, so a job-wide setting never breaks a
framework's integer or already-16-bit collectives. On a single node nothing crosses a network, so the API
layer (``pccl_torch.selection.choice``) runs such calls exact after these checks.
"""

from __future__ import annotations

import torch

from pccl_torch import environment
from pccl_torch.algorithms import COLLECTIVES, Collective
from pccl_torch.compression.formats import get

COMPRESSION_ENV = "PCCL_COMPRESSION"
EXACT = "none"
"""The value that leaves a collective exact (any case)."""


def _check_format(_collective: str, name: str) -> None:
    """A format name, or ``none``; ``ValueError`` listing the valid ones otherwise."""
    if name.lower() != EXACT:
        get(name)


def env_formats() -> dict[str, str]:
    """``PCCL_COMPRESSION`` as {collective: format}: one format for every collective (``bf16``), or
    ``collective:format,...``; ``none`` leaves a collective exact. A malformed value raises ``ValueError``
    naming the variable and what is valid."""
    formats = environment.per_collective(COMPRESSION_ENV, COLLECTIVES, _check_format, "all_gather:int8",
                                         for_all=True)
    return {collective: name for collective, name in formats.items() if name.lower() != EXACT}


def for_call(collective: Collective, explicit: str | None, env: dict[str, str], dtype: torch.dtype) -> str | None:
    """The format of one call (None: exact). An explicit format that does not apply to ``dtype`` raises."""
    if explicit is not None:
        get(explicit).check_dtype(dtype)
        return explicit
    name = env.get(collective)
    return name if name is not None and get(name).applies_to(dtype) else None
