"""The few SGD steps the framework drivers train with (same data per rank for every backend compared)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def sgd_steps(model: torch.nn.Module, rank: int, *, features: int, batch: int, lr: float, seed: int,
              steps: int = 5, before_step: Callable[[], object] | None = None,
              device: torch.device | str = "cpu") -> list[float]:
    """``steps`` SGD steps of MSE regression on random data seeded by ``seed + rank``; returns the losses.

    ``before_step`` runs between backward and the optimizer step (e.g. gradient clipping). The data is made
    on the CPU and moved to ``device``, so runs on different devices see the same numbers.
    """
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed + rank)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(batch, features, generator=g).to(device), torch.randn(batch, 1, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if before_step is not None:
            before_step()
        opt.step()
        losses.append(loss.item())
    return losses
