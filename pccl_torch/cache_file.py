"""The small JSON files pccl keeps between runs (tuned choices, measured links): read leniently, written
atomically, and never over a file that is not pccl's own of that kind.

A cache is ``{"format": FORMAT, "entries": ...}``. A missing file reads as empty; an unreadable one, or another
kind of file, reads as empty with one warning naming it; writing refuses (with a warning) to replace a file that is
there but not such a cache, so pointing a cache at the selector profile cannot destroy the profile.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def read(path: Path, fmt: str, what: str) -> dict:
    """The cache document at ``path`` (``{}`` when absent, unreadable or not a ``fmt`` file; warned)."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("pccl %s: ignoring the unreadable cache %s: %s", what, path, exc)
        return {}
    if not isinstance(document, dict) or document.get("format") != fmt:
        log.warning("pccl %s: ignoring %s: not a pccl %s cache (format %r)", what, path, what,
                    document.get("format") if isinstance(document, dict) else type(document).__name__)
        return {}
    return document


def write(path: Path, fmt: str, what: str, entries: Any) -> bool:
    """Replace the cache at ``path`` with ``entries`` (atomically); False when not written (warned): the file
    exists and is not a ``fmt`` cache, or cannot be written."""
    if path.exists() and not read(path, fmt, what):
        log.warning("pccl %s: not writing to %s: the file exists and is not a pccl %s cache; point the cache "
                    "elsewhere or remove it", what, path, what)
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"format": fmt, "entries": entries}, indent=1))
        temporary.replace(path)
    except OSError as exc:
        log.warning("pccl %s: cannot write %s: %s", what, path, exc.strerror)
        return False
    return True
