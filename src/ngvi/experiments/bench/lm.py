"""The language model of the GPU bench: a GPT-style decoder where our users train (issue 30).

12 blocks, d = 768, 12 heads, vocabulary 8192, context 256: 91.4M trainable weights once the embeddings are
frozen, which lets the hooked rules (VOGN, the K-FAC family) run too: every trainable layer is an
``nn.Linear`` or ``nn.LayerNorm``. Attention is ``F.scaled_dot_product_attention`` (causal). ``lm_config``
scales it down for the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F


@dataclass(frozen=True)
class LMConfig:
    blocks: int = 12
    width: int = 768
    heads: int = 12
    vocab: int = 8192
    context: int = 256
    batch: int = 16


#: the full model (the GPU bench), the CPU's scaled-down one and a smoke test's
FULL = LMConfig()
SMALL = LMConfig(blocks=2, width=64, heads=4, vocab=256, context=32, batch=8)
TINY = LMConfig(blocks=1, width=16, heads=2, vocab=32, context=8, batch=2)


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class LanguageModel(nn.Module):
    """Token and position embeddings (frozen), ``blocks`` pre-norm blocks, a final norm and an untied head."""

    def __init__(self, config: LMConfig = FULL) -> None:
        super().__init__()
        self.tokens = nn.Embedding(config.vocab, config.width)
        self.positions = nn.Embedding(config.context, config.width)
        self.tokens.requires_grad_(False)
        self.positions.requires_grad_(False)
        self.blocks = nn.Sequential(*(Block(config.width, config.heads) for _ in range(config.blocks)))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab)

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.norm(self.blocks(self.tokens(ids) + self.positions(positions))))


def lm_batch(config: LMConfig, device: torch.device | str, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Random token ids and their next-token targets (the bench times steps, not learning)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab, (config.batch, config.context + 1), generator=gen)
    return ids[:, :-1].to(device), ids[:, 1:].to(device)


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
