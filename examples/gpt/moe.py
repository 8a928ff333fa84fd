"""A top-2 gated mixture-of-experts feed-forward layer with expert parallelism (GShard / DeepSpeed-MoE style).

Every rank holds ``n_experts / world`` of the experts (rank r the experts ``r * local .. (r + 1) * local - 1``);
the router and everything else in the model are replicated (data parallel). A forward pass:

1. **route**: the router scores each token against every expert; its two best experts get the token, weighted
   by their softmax probabilities renormalised over the two;
2. **dispatch**: the (token, expert) assignments are sorted by expert, so the rows bound for each rank are
   contiguous. Each rank counts its rows per (destination rank, expert), a small ``all_to_all_single`` of
   those counts tells every rank how many rows it will receive (the uneven split sizes), and a second
   ``all_to_all_single`` carries the rows themselves;
3. **experts**: each rank runs its local experts on the rows it received (an MLP per expert);
4. **combine**: a third ``all_to_all_single``, with the split sizes reversed, returns the results to the
   tokens' ranks, where each token sums its two experts' outputs times their gate weights.

The all-to-alls are differentiable (:class:`AllToAll`: the backward of an all-to-all is the all-to-all of the
gradients with the split sizes swapped), so the experts get the gradients of every rank's tokens and the
router gets its gradient through the gate weights. No capacity factor: no token is ever dropped, which is why
the split sizes vary from step to step (this is what exercises uneven all-to-alls).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F


class AllToAll(torch.autograd.Function):
    """``torch.distributed.all_to_all_single`` with uneven splits along dim 0, differentiable.

    (``torch.distributed.nn.functional.all_to_all_single`` does the same, but is deprecated as of torch 2.13
    and warns on every call; this is its few lines, kept here so the example reads on its own.)"""

    @staticmethod
    def forward(ctx, x: torch.Tensor, output_splits: list[int], input_splits: list[int],  # type: ignore[override]
                group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.splits, ctx.group = (output_splits, input_splits), group
        out = x.new_empty((sum(output_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:  # type: ignore[override]
        output_splits, input_splits = ctx.splits
        # what was sent from row block i to rank i came back from rank i: swap the splits
        return AllToAll.apply(grad, input_splits, output_splits, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, output_splits: list[int], input_splits: list[int],
               group: dist.ProcessGroup | None) -> torch.Tensor:
    """Rows ``input_splits[i]`` of ``x`` to rank i, ``output_splits[i]`` rows from rank i; autograd-aware."""
    return AllToAll.apply(x, output_splits, input_splits, group)


class Experts(nn.Module):
    """``n_local`` independent MLPs (``n_embd -> 4 n_embd -> n_embd``, GELU), weights stacked per expert.
    Their parameters are expert parallel: :func:`split_parameters` keeps them out of the gradient all-reduce."""

    def __init__(self, n_local: int, n_embd: int) -> None:
        super().__init__()
        self.w_fc = nn.Parameter(torch.empty(n_local, n_embd, 4 * n_embd))
        self.b_fc = nn.Parameter(torch.zeros(n_local, 4 * n_embd))
        self.w_proj = nn.Parameter(torch.empty(n_local, 4 * n_embd, n_embd))
        self.b_proj = nn.Parameter(torch.zeros(n_local, n_embd))

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """``x`` holds ``counts[e]`` rows for local expert e, in expert order; the outputs in the same order."""
        out = [F.gelu(rows @ self.w_fc[e] + self.b_fc[e]) @ self.w_proj[e] + self.b_proj[e]
               for e, rows in enumerate(x.split(counts))]
        return torch.cat(out)


class Dispatch(NamedTuple):
    """Where a layer's assignments went, to bring the results back."""

    order: torch.Tensor
    """Assignment indices sorted by expert (the order the rows were sent in)."""
    send: list[int]
    """Rows sent to each rank."""
    recv: list[int]
    """Rows received from each rank."""


class MoE(nn.Module):
    """Top-2 gated mixture of ``n_experts`` MLP experts, ``n_experts / group size`` of them on this rank.

    Built on every rank from the same seed: each draws the weights of all the experts and keeps its own, so
    the model is the same whatever the number of ranks. ``group`` (default: torch.distributed's world, or
    no communication at all when torch.distributed is not initialised) is the expert-parallel group."""

    def __init__(self, n_embd: int, n_experts: int, *, n_layer: int = 1, top_k: int = 2,
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        distributed = dist.is_available() and dist.is_initialized()
        self.group = group
        self.world = dist.get_world_size(group) if distributed else 1
        rank = dist.get_rank(group) if distributed else 0
        if n_experts <= 0 or n_experts % self.world:
            raise ValueError(f"n_experts ({n_experts}) must be a positive multiple of the group size ({self.world}).")
        if not 0 < top_k <= n_experts:
            raise ValueError(f"top_k ({top_k}) must be in 1..n_experts ({n_experts}).")
        self.n_experts, self.top_k, self.n_local = n_experts, top_k, n_experts // self.world
        self.router = nn.Linear(n_embd, n_experts, bias=False)
        self.experts = Experts(self.n_local, n_embd)
        # every expert's weights drawn on every rank (the same random stream), this rank's kept
        mine = slice(rank * self.n_local, (rank + 1) * self.n_local)
        with torch.no_grad():
            self.experts.w_fc.copy_(torch.randn(n_experts, n_embd, 4 * n_embd)[mine] * 0.02)
            # GPT-2: residual projections scaled by depth, as model.py does for the dense MLP
            self.experts.w_proj.copy_(torch.randn(n_experts, 4 * n_embd, n_embd)[mine] * 0.02 / math.sqrt(2 * n_layer))
        # the load-balancing loss of the last forward (Switch Transformer): n_experts * sum_e f_e * p_e, f_e the
        # fraction of assignments to expert e and p_e its mean router probability; 1 when balanced, up to n_experts
        self.aux_loss = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        # 1. route: top-k experts per token, gate weights renormalised over them
        probs = F.softmax(self.router(tokens), dim=-1)
        gates, experts = probs.topk(self.top_k, dim=-1)  # [tokens, k]
        gates = gates / gates.sum(dim=-1, keepdim=True)
        experts = experts.flatten()  # assignment a = token a // k, expert experts[a]
        per_expert = torch.bincount(experts, minlength=self.n_experts)
        self.aux_loss = self.n_experts * torch.sum(per_expert / experts.numel() * probs.mean(dim=0))
        # 2. dispatch: rows sorted by expert, so each destination rank's rows are contiguous
        order = torch.argsort(experts, stable=True)
        rows = tokens[order // self.top_k]
        counts = self._exchange_counts(per_expert)  # [source rank, local expert]
        dispatch = Dispatch(order, per_expert.view(self.world, self.n_local).sum(1).tolist(), counts.sum(1).tolist())
        received = self._all_to_all(rows, dispatch.recv, dispatch.send)
        # 3. experts: the received rows regrouped by local expert (they arrive by source rank, then expert)
        local = torch.arange(self.n_local, device=x.device).repeat(self.world).repeat_interleave(counts.flatten())
        by_expert = torch.argsort(local, stable=True)
        out = self.experts(received[by_expert], counts.sum(0).tolist())[torch.argsort(by_expert)]
        # 4. combine: results back to their tokens, weighted by the gates and summed over the k experts
        returned = self._all_to_all(out, dispatch.send, dispatch.recv)
        weighted = returned * gates.flatten()[order].unsqueeze(1)
        combined = torch.zeros_like(tokens).index_add(0, order // self.top_k, weighted)
        return combined.view(shape)

    def _exchange_counts(self, per_expert: torch.Tensor) -> torch.Tensor:
        """Rows each rank will send this rank, per local expert: ``[world, n_local]`` (an all-to-all of the
        ``[world, n_local]`` send counts, one equal block a rank)."""
        if self.world == 1:
            return per_expert.view(1, -1)
        counts = torch.empty_like(per_expert)
        dist.all_to_all_single(counts, per_expert, group=self.group)
        return counts.view(self.world, self.n_local)

    def _all_to_all(self, x: torch.Tensor, output_splits: list[int], input_splits: list[int]) -> torch.Tensor:
        return x if self.world == 1 else all_to_all(x, output_splits, input_splits, self.group)


def split_parameters(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """``(replicated, expert)`` parameters of ``model``: the first are data parallel (their gradients
    averaged over ranks), the second expert parallel (each rank's own experts)."""
    expert_ids = {id(p) for m in model.modules() if isinstance(m, Experts) for p in m.parameters()}
    params = list(model.parameters())
    return [p for p in params if id(p) not in expert_ids], [p for p in params if id(p) in expert_ids]


def aux_loss(model: nn.Module) -> torch.Tensor:
    """The sum of the load-balancing losses of ``model``'s MoE layers in their last forward."""
    losses = [m.aux_loss for m in model.modules() if isinstance(m, MoE)]
    return torch.stack(losses).sum() if losses else torch.zeros(())
