"""Right-padded collate for `paper_repro.nets` (text and image+text samples).

A multimodal sample reserves ``num_visual`` positions at the start of its row
(filled by the VLM's image encoder, label -100); its post-pipeline length is
``num_visual + len(input_ids)``.
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["collate_pad", "sample_len", "PAD_ID"]

PAD_ID = 0


def sample_len(item: dict) -> int:
    """Post-pipeline length: visual tokens + text tokens."""
    return int(item.get("num_visual", 0)) + len(item["input_ids"])


def collate_pad(items: Sequence[dict]) -> dict:
    """Pad a list of samples to the longest; raises ValueError on an empty list."""
    if not items:
        raise ValueError("collate_pad got an empty batch")
    n = max(sample_len(x) for x in items)
    b = len(items)
    ids = torch.full((b, n), PAD_ID, dtype=torch.long)
    labels = torch.full((b, n), -100, dtype=torch.long)
    mask = torch.zeros((b, n), dtype=torch.bool)
    nv = torch.zeros(b, dtype=torch.long)
    pixels = []
    for i, x in enumerate(items):
        v = int(x.get("num_visual", 0))
        t = len(x["input_ids"])
        ids[i, v:v + t] = torch.as_tensor(x["input_ids"])
        labels[i, v:v + t] = torch.as_tensor(x["labels"])
        mask[i, :v + t] = True
        nv[i] = v
        pixels.append(x.get("pixel_values"))
    out = {"input_ids": ids, "labels": labels, "attention_mask": mask, "num_visual": nv}
    if any(p is not None for p in pixels):
        out["pixel_values"] = pixels
    return out
