"""A small GPT in plain torch (after nanoGPT): token and position embeddings, pre-norm transformer
blocks of causal self-attention and an MLP, a final norm and a linear head over the vocabulary.
With ``moe_experts > 0`` each block's MLP is a top-2 mixture of experts, spread over the ranks (``moe.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from moe import MoE


@dataclass(kw_only=True, slots=True)
class GPTConfig:
    vocab_size: int = 256
    """Tokens: 256 for the byte-level tokenizer of ``data.py``."""
    block_size: int = 64
    """Longest context, in tokens."""
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    moe_experts: int = 0
    """Experts of each block's mixture-of-experts feed-forward, a multiple of the expert-parallel group's
    size; 0: a dense MLP."""

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.block_size, self.n_layer, self.n_head, self.n_embd) <= 0:
            raise ValueError("every GPTConfig size must be greater than 0.")
        if self.moe_experts < 0:
            raise ValueError(f"moe_experts ({self.moe_experts}) must be 0 (dense) or greater.")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head}).")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # [b, t, c] -> [b, heads, t, c / heads]
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-norm residual block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, config: GPTConfig, expert_group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = (MoE(config.n_embd, config.moe_experts, n_layer=config.n_layer, group=expert_group)
                    if config.moe_experts else MLP(config))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, expert_group: dist.ProcessGroup | None = None) -> None:
        """``expert_group``: the ranks the experts of a mixture-of-experts model are spread over (default:
        torch.distributed's world); build the model on each of them, from the same seed."""
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, expert_group) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        # Not tied to wte: ZeRO-3 and FSDP then shard every parameter exactly once.
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale the residual projections by depth
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor,
                targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[batch, time, vocab]`` for token ids ``idx`` ``[batch, time]``, and the mean
        cross-entropy against ``targets`` when given."""
        t = idx.shape[1]
        if t > self.config.block_size:
            raise ValueError(f"sequence of {t} tokens exceeds block_size {self.config.block_size}")
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, new_tokens: int, *, temperature: float = 1.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Extend ``idx`` ``[batch, time]`` by ``new_tokens`` sampled tokens."""
        for _ in range(new_tokens):
            logits, _ = self(idx[:, -self.config.block_size:])
            probs = F.softmax(logits[:, -1, :] / temperature, dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
        return idx
