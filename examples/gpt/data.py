"""The corpus shipped with the examples (``corpus.txt``), a byte-level tokenizer, a deterministic
train/val split and seeded random batches."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

CORPUS = Path(__file__).resolve().parent / "corpus.txt"
VOCAB_SIZE = 256  # every byte value is a token


def encode(text: str) -> torch.Tensor:
    """Token ids (the UTF-8 bytes) of ``text``, as int64."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(ids: torch.Tensor) -> str:
    return bytes(ids.tolist()).decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class Splits:
    train: torch.Tensor
    val: torch.Tensor


def load_splits(path: Path = CORPUS, val_fraction: float = 0.1) -> Splits:
    """The corpus as tokens: the first ``1 - val_fraction`` is train, the rest val (the same every run)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    ids = encode(path.read_text(encoding="utf-8"))
    cut = int(len(ids) * (1 - val_fraction))
    return Splits(train=ids[:cut], val=ids[cut:])


def get_batch(data: torch.Tensor, batch_size: int, block_size: int,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` random windows of ``block_size`` tokens and the same windows shifted by one."""
    if len(data) <= block_size:
        raise ValueError(f"need more than block_size={block_size} tokens, got {len(data)}")
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = torch.stack([data[i:i + block_size] for i in starts.tolist()])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in starts.tolist()])
    return x, y
