"""A decoder-only language model small enough to train on two CPU cores.

Batch contract (what `forward` reads): ``input_ids`` (B, L) long, ``labels``
(B, L) long with -100 on positions that carry no loss (prompt, padding), and
``attention_mask`` (B, L) bool, True on real tokens.  Padding is on the right.
Returns ``(loss_sum, num_label_tokens)``: the summed next-token cross-entropy
over label positions, so callers normalise explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LMConfig", "TinyLM", "Block", "next_token_loss", "hf_tiny_lm"]


@dataclass(frozen=True, kw_only=True)
class LMConfig:
    vocab_size: int = 2048
    dim: int = 64          # model width; 64 keeps a step in milliseconds on CPU
    num_layers: int = 2
    num_heads: int = 4
    max_len: int = 2048    # positions; samples are truncated by the pipeline well below this
    mlp_ratio: int = 4


class Block(nn.Module):
    """Pre-norm transformer block with causal scaled-dot-product attention."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.up = nn.Linear(cfg.dim, cfg.mlp_ratio * cfg.dim)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.num_heads, d // self.num_heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if attn_bias is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


def causal_bias(mask: torch.Tensor) -> torch.Tensor | None:
    """(B, L) key-padding mask -> (B, 1, L, L) bool mask (causal and key-valid).

    Returns None when nothing is padded (the fast causal kernel then applies).
    A query row that is padding still sees key 0 so softmax never sees an
    all-masked row (its output is ignored by the loss).
    """
    if bool(mask.all()):
        return None
    n = mask.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril()
    m = causal[None, None] & mask[:, None, None, :]
    m[..., 0] = True
    return m


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy of position t predicting labels[t+1]; (sum, count)."""
    tgt = labels[:, 1:]
    n = int((tgt != -100).sum())
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                           ignore_index=-100, reduction="sum")
    return loss, n


class TinyLM(nn.Module):
    """Token embedding, learned positions, `num_layers` blocks, tied output head."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos = nn.Embedding(cfg.max_len, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.LayerNorm(cfg.dim)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def trunk(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Run embeddings `x` (B, L, D) through the blocks; returns logits (B, L, V)."""
        if x.shape[1] > self.cfg.max_len:
            raise ValueError(f"sequence of {x.shape[1]} positions exceeds max_len={self.cfg.max_len}; "
                             "truncate in the pipeline or raise LMConfig.max_len")
        x = x + self.pos.weight[: x.shape[1]][None]
        bias = causal_bias(mask)
        for blk in self.blocks:
            x = blk(x, bias)
        return self.norm(x) @ self.embed.weight.t()

    def forward(self, batch: dict) -> tuple[torch.Tensor, int]:
        logits = self.trunk(self.embed(batch["input_ids"]), batch["attention_mask"])
        return next_token_loss(logits, batch["labels"])


class _HFWrapper(nn.Module):
    """Adapts a `transformers` causal LM to the (loss_sum, count) contract."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch: dict) -> tuple[torch.Tensor, int]:
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long())
        return next_token_loss(out.logits, batch["labels"])


def hf_tiny_lm(vocab_size: int, dim: int = 64, num_layers: int = 2, num_heads: int = 4,
               max_len: int = 2048) -> nn.Module:
    """A randomly initialized tiny `transformers` LlamaForCausalLM (no weights downloaded).

    Raises ImportError when transformers is not installed.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=dim, intermediate_size=4 * dim,
                      num_hidden_layers=num_layers, num_attention_heads=num_heads,
                      num_key_value_heads=num_heads, max_position_embeddings=max_len,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    return _HFWrapper(LlamaForCausalLM(cfg))
