"""A default collate function: pad token sequences to the batch's longest sample."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Sequence

import torch

__all__ = ["pad_collate"]

_PAD = {"labels": -100, "attention_mask": 0}


def pad_collate(samples: Sequence[Mapping[str, Any]], pad_id: int = 0) -> dict:
    """Collate mapping samples into a dict of tensors.

    Keys whose values are 1-D int sequences (lists or tensors) are right-padded
    to the longest in the batch: ``labels`` with -100, ``attention_mask`` with
    0, everything else with `pad_id`.  If the samples have ``input_ids`` but no
    ``attention_mask``, one is added.  Scalars become a 1-D tensor; other values
    are gathered into a list.  Raises TypeError if the samples are not mappings
    with the same keys.
    """
    if not samples or not all(isinstance(s, Mapping) for s in samples):
        raise TypeError(f"pad_collate needs a non-empty list of mappings, got {[type(s).__name__ for s in samples]}")
    keys = list(samples[0])
    if any(list(s) != keys for s in samples[1:]):
        raise TypeError(f"samples have different keys: {sorted({tuple(s) for s in samples})}")
    out: dict = {}
    for key in keys:
        vals = [s[key] for s in samples]
        v0 = vals[0]
        if isinstance(v0, (list, tuple, torch.Tensor)) and (not isinstance(v0, torch.Tensor) or v0.dim() == 1):
            seqs = [torch.as_tensor(v) for v in vals]
            longest = max(len(t) for t in seqs)
            fill = _PAD.get(key, pad_id)
            padded = torch.full((len(seqs), longest), fill, dtype=seqs[0].dtype)
            for i, t in enumerate(seqs):
                padded[i, :len(t)] = t
            out[key] = padded
        elif isinstance(v0, (int, float, bool)):
            out[key] = torch.tensor(vals)
        else:
            out[key] = vals
    if "input_ids" in out and "attention_mask" not in out and isinstance(out["input_ids"], torch.Tensor):
        mask = torch.zeros_like(out["input_ids"], dtype=torch.long)
        for i, s in enumerate(samples):
            mask[i, :len(s["input_ids"])] = 1
        out["attention_mask"] = mask
    return out
