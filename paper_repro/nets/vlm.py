"""A vision-language model with Qwen-VL-style dynamic resolution.

An image of H x W pixels (after the pipeline's random resize) is cut into
``patch`` x ``patch`` patches; each 2x2 block of patches is merged into one
visual token, so an image contributes

    num_visual_tokens(H, W) = ceil(H / (patch*merge)) * ceil(W / (patch*merge))

tokens (the image is zero-padded up to a multiple of ``patch*merge``).  The
visual tokens are projected to the LM width and placed before the text, so a
sample's cost is known only after augmentation: that is the paper's point.

Batch contract: the LM keys plus ``pixel_values``, a list (one per sample) of
(3, H, W) float tensors or None, and ``num_visual`` (B,) long.  The collate
(`paper_repro.data.collate_pad`) already reserved ``num_visual[i]`` positions at
the start of row i (label -100, mask True); this module fills them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .lm import LMConfig, TinyLM, next_token_loss

__all__ = ["VLMConfig", "TinyVLM", "num_visual_tokens"]


@dataclass(frozen=True, kw_only=True)
class VLMConfig:
    lm: LMConfig = LMConfig()
    patch: int = 14   # Qwen-VL patch side in pixels
    merge: int = 2    # 2x2 patch merge per visual token


def num_visual_tokens(height: int, width: int, patch: int = 14, merge: int = 2) -> int:
    """Visual tokens for an H x W image: one per (patch*merge)^2 cell, rounded up."""
    cell = patch * merge
    return math.ceil(height / cell) * math.ceil(width / cell)


class TinyVLM(nn.Module):
    """`TinyLM` plus a patch encoder with 2x2 merge and a projector."""

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.cfg = cfg
        self.lm = TinyLM(cfg.lm)
        d = cfg.lm.dim
        self.patch_embed = nn.Conv2d(3, d, kernel_size=cfg.patch, stride=cfg.patch)
        self.merge_proj = nn.Linear(d * cfg.merge * cfg.merge, d)

    def encode_image(self, img: torch.Tensor) -> torch.Tensor:
        """(3, H, W) -> (num_visual_tokens(H, W), D)."""
        cell = self.cfg.patch * self.cfg.merge
        h, w = img.shape[-2:]
        img = F.pad(img, (0, -w % cell, 0, -h % cell))
        p = self.patch_embed(img[None])[0]                       # (D, H/p, W/p)
        m = self.cfg.merge
        d, gh, gw = p.shape
        p = p.view(d, gh // m, m, gw // m, m).permute(1, 3, 2, 4, 0).reshape(gh // m * (gw // m), m * m * d)
        return self.merge_proj(p)

    def forward(self, batch: dict) -> tuple[torch.Tensor, int]:
        x = self.lm.embed(batch["input_ids"])
        rows = []
        for i, img in enumerate(batch["pixel_values"]):
            nv = int(batch["num_visual"][i])
            if img is None or nv == 0:
                rows.append(x[i])
                continue
            v = self.encode_image(img)
            if v.shape[0] != nv:
                raise ValueError(f"sample {i}: the collate reserved {nv} visual positions but the image "
                                 f"{tuple(img.shape)} gives {v.shape[0]}; the pipeline and the net disagree on "
                                 "patch/merge")
            rows.append(torch.cat([v, x[i, nv:]], 0))
        logits = self.lm.trunk(torch.stack(rows), batch["attention_mask"])
        return next_token_loss(logits, batch["labels"])
