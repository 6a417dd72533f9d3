"""Collate helpers for one group of samples (imports torch; load lazily).

Each sample is a mapping with ``input_ids`` (a 1-D int sequence or tensor) and
optionally ``labels`` (same length; defaults to ``input_ids``).

``pad_collate``      right-padded ``[batch, longest]`` tensors: ``input_ids``
                     (padded with `pad_id`), ``labels`` (padded with -100, the
                     ignore index of ``CrossEntropyLoss``) and ``attention_mask``
                     (the samples' own, padded with 0, or 1 on every token).
                     Any other key is kept: 1-D sequences are right-padded with
                     `pad_id` into a tensor, numbers become a 1-D tensor, other
                     values a list.  It is the runtime's default ``collate_fn``
                     (``odb.runtime.pad_collate`` is this function).
``packed_collate``   padding-free packing: one ``[1, total]`` row holding every
                     sample back to back, ``position_ids`` restarting at 0 for each
                     sample, ``labels`` with the first token of each sample set to
                     -100 (so no token is predicted across a boundary), and
                     ``cu_seqlens`` (int32 ``[batch + 1]``) and ``max_seqlen`` for
                     varlen attention kernels.  This is the layout of
                     ``transformers.DataCollatorWithFlattening`` (which models
                     detect from restarting ``position_ids``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from ..errors import SampleError

__all__ = ["pad_collate", "packed_collate", "IGNORE_INDEX"]

IGNORE_INDEX = -100


def _rows(batch: Sequence[Mapping]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if not batch:
        raise SampleError("collate got an empty batch; a group always holds at least one sample")
    out = []
    for k, s in enumerate(batch):
        if "input_ids" not in s:
            raise SampleError(f"sample {k} of the batch has no 'input_ids' (keys: {sorted(s)}); "
                              "every sample must carry its token ids")
        ids = torch.as_tensor(s["input_ids"], dtype=torch.long).reshape(-1)
        lab = torch.as_tensor(s.get("labels", ids), dtype=torch.long).reshape(-1)
        if ids.numel() == 0:
            raise SampleError(f"sample {k} of the batch has zero tokens; it would vanish from the batch")
        if lab.shape != ids.shape:
            raise SampleError(f"sample {k}: labels have {lab.numel()} tokens, input_ids {ids.numel()}")
        out.append((ids, lab))
    return out


def pad_collate(batch: Sequence[Mapping], pad_id: int = 0) -> dict:
    """Right-pad a group to its longest sample (see the module docstring).

    Raises SampleError for an empty group, a sample without ``input_ids`` or
    with zero tokens, labels of another length, or samples whose keys differ.
    """
    rows = _rows(batch)
    L = max(ids.numel() for ids, _ in rows)
    input_ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), L), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, (ids, lab) in enumerate(rows):
        n = ids.numel()
        input_ids[i, :n] = ids
        labels[i, :n] = lab
        mask[i, :n] = 1
    out: dict = {"input_ids": input_ids, "labels": labels, "attention_mask": mask}
    keys = [k for k in batch[0] if k not in ("input_ids", "labels")]
    for k, s in enumerate(batch[1:], 1):
        if [x for x in s if x not in ("input_ids", "labels")] != keys:
            raise SampleError(f"sample {k} of the batch has keys {sorted(s)}, sample 0 has {sorted(batch[0])}; "
                              "every sample of a batch must carry the same keys")
    for key in keys:
        out[key] = _extra([s[key] for s in batch], 0 if key == "attention_mask" else pad_id)
    return out


def _extra(vals: list, fill: int):
    """One extra key of `pad_collate`: padded 1-D sequences, a tensor of numbers, or a list."""
    v0 = vals[0]
    if isinstance(v0, (list, tuple, torch.Tensor)) and (not isinstance(v0, torch.Tensor) or v0.dim() == 1):
        seqs = [torch.as_tensor(v) for v in vals]
        out = torch.full((len(seqs), max(len(t) for t in seqs)), fill, dtype=seqs[0].dtype)
        for i, t in enumerate(seqs):
            out[i, :len(t)] = t
        return out
    if isinstance(v0, (bool, int, float)):
        return torch.tensor(vals)
    return list(vals)


def packed_collate(batch: Sequence[Mapping]) -> dict[str, torch.Tensor | int]:
    """Concatenate a group into one padding-free row (see the module docstring)."""
    rows = _rows(batch)
    lens = [ids.numel() for ids, _ in rows]
    labels = []
    for _, lab in rows:
        lab = lab.clone()
        lab[0] = IGNORE_INDEX
        labels.append(lab)
    cu = torch.zeros(len(rows) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0)
    return {
        "input_ids": torch.cat([ids for ids, _ in rows]).unsqueeze(0),
        "labels": torch.cat(labels).unsqueeze(0),
        "position_ids": torch.cat([torch.arange(n, dtype=torch.long) for n in lens]).unsqueeze(0),
        "cu_seqlens": cu,
        "max_seqlen": max(lens),
    }
