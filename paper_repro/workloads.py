"""Workloads, nets and per-method batch sources for `paper_repro.train`.

A *spec* (dict, from `paper_repro.repro.RunSpec`) names the data (``kind``:
"lengths" = real corpus tokens at lengths drawn from a paper distribution,
"text" = the docstring chat corpus, "mm" = image + text with random-resize
augmentation), the net and the method list.  `batch_source` turns a method
name into an object with ``epoch(e)`` yielding ``(batch, meta)`` for this
rank, where meta carries ``local_samples``, ``global_samples`` (this step,
all ranks), ``real_tokens``, ``padded_tokens``, ``filler`` and ``scale`` (the
loss multiplier), plus ``join_context(ddp)`` and the one-off ``setup_s``
(length-cache cost for GMT/BMT).
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler

from .data import ChatDataset, ImageChatDataset, LengthDataset, chat_pairs, collate_pad, get_tokenizer, sample_len
from .nets import LMConfig, TinyLM, TinyVLM, VLMConfig, apply_lora, hf_tiny_lm

__all__ = ["MethodUnavailable", "build_datasets", "val_batches", "build_net", "batch_source", "paper_lengths", "fixed_batch_size"]


class MethodUnavailable(RuntimeError):
    """A method's implementation is not importable here (reported, never silently skipped)."""


def paper_lengths(name: str, n: int, seed: int, cutoff: int, scale: float = 1.0) -> np.ndarray:
    """`n` post-pipeline lengths from `paper_repro.distributions` (CV-matched), divided by `scale`
    (so a CPU net trains on them; the CV is unchanged up to rounding and clipping) and clipped
    to [8, cutoff]."""
    from . import distributions

    lengths = np.asarray([s[0] for s in distributions.sample_lengths(name, n, seed=seed)], dtype=np.float64)
    return np.clip(np.round(lengths / scale), 8, cutoff).astype(np.int64)


def build_datasets(spec: dict):
    """(train, val) datasets for the spec; deterministic for spec["seed"]."""
    tok = get_tokenizer(spec.get("vocab", 2048))
    n, nv, seed = spec["num_train"], spec["num_val"], spec["seed"]
    if spec["kind"] == "lengths":
        lengths = paper_lengths(spec["dist"], n + nv, seed, spec["cutoff"], spec.get("length_scale", 1.0))
        return LengthDataset(tok, lengths[:n], seed=seed), LengthDataset(tok, lengths[n:], seed=seed + 1)
    pairs = chat_pairs(seed)
    order = np.random.default_rng(seed).permutation(len(pairs))
    tr, va = order[:n], order[n:n + nv]
    if spec["kind"] == "text":
        return ChatDataset(tok, pairs, tr, spec["cutoff"]), ChatDataset(tok, pairs, va, spec["cutoff"])
    if spec["kind"] == "mm":
        kw = dict(seed=seed, cutoff=spec["cutoff"], max_side=spec.get("max_side", 448))
        return ImageChatDataset(tok, pairs, tr, **kw), ImageChatDataset(tok, pairs, va, **kw)
    raise ValueError(f"unknown workload kind {spec['kind']!r}; valid: 'lengths', 'text', 'mm'")


def val_batches(ds, spec: dict) -> list[dict]:
    """The validation set in fixed batches of 8 (the same for every method)."""
    return [collate_pad([ds[j] for j in range(i, min(len(ds), i + 8))]) for i in range(0, len(ds), 8)]


def build_net(spec: dict) -> torch.nn.Module:
    """A fresh net with the spec's init seed (identical across methods and ranks)."""
    torch.manual_seed(spec["seed"])
    n = spec["net"]
    max_len = spec["cutoff"] + (256 if spec["kind"] == "mm" else 0) + 8
    lm = LMConfig(vocab_size=spec.get("vocab", 2048), dim=n["dim"], num_layers=n["layers"],
                  num_heads=n["heads"], max_len=max_len)
    if spec["kind"] == "mm":
        net = TinyVLM(VLMConfig(lm=lm))
    elif n.get("impl") == "hf":
        net = hf_tiny_lm(lm.vocab_size, lm.dim, lm.num_layers, lm.num_heads, max_len)
    else:
        net = TinyLM(lm)
    if spec.get("lora"):
        apply_lora(net, r=spec.get("lora_r", 8))
    return net


def _meta(items_or_batch: dict, local: int, global_: int, scale: float = 1.0, filler: bool = False) -> dict:
    m = items_or_batch["attention_mask"]
    return {"local_samples": local, "global_samples": global_, "real_tokens": int(m.sum()) if not filler else 0,
            "padded_tokens": int(m.numel()), "filler": filler, "scale": scale}


class FixedBatches:
    """Standard: fixed `batch_size` per rank, DistributedSampler (equal shards, no padding
    when len(ds) is a multiple of world_size, which `paper_repro.repro` ensures)."""

    def __init__(self, ds, batch_size: int, spec: dict, rank: int, world_size: int):
        if len(ds) % world_size:
            raise ValueError(f"num_train={len(ds)} is not a multiple of world_size={world_size}; "
                             "DistributedSampler would duplicate samples")
        self.ds, self.bs, self.world_size = ds, batch_size, world_size
        self.sampler = DistributedSampler(ds, world_size, rank, shuffle=True, seed=spec["seed"])
        self.setup_s, self.notes = 0.0, f"batch {batch_size} per rank"

    def join_context(self, ddp):
        return contextlib.nullcontext()

    def epoch(self, e: int):
        self.sampler.set_epoch(e)
        dl = DataLoader(self.ds, batch_size=self.bs, sampler=self.sampler, collate_fn=collate_pad, num_workers=0)
        for b in dl:
            k = int(b["input_ids"].shape[0])
            yield b, _meta(b, k, k * self.world_size)


def batch_source(method: str, ds, spec: dict, rank: int, world_size: int):
    """The per-rank batch source of `method`; raises MethodUnavailable if its code is missing."""
    if method in ("standard1", "standard1_noacc", "standardB"):
        return FixedBatches(ds, fixed_batch_size(method, spec), spec, rank, world_size)
    if method in ("gmt", "bmt"):
        from .methods import OfflineBatches
        return OfflineBatches(method, ds, spec, rank, world_size)
    if method in ("odb_pad", "odb_join"):
        from .methods import ODBBatches
        return ODBBatches(method[4:], ds, spec, rank, world_size)
    raise ValueError(f"unknown method {method!r}")


def fixed_batch_size(method: str, spec: dict) -> int:
    """Per-rank micro-batch size of a fixed-batch method: 1 for Standard batch 1, budget // longest
    possible sample for the memory-equivalent batch (never over the token budget)."""
    if method in ("standard1", "standard1_noacc"):
        return 1
    if method == "standardB":
        return max(1, spec["budget"] // max_len_bound(spec))
    raise ValueError(f"{method!r} is not a fixed-batch method; valid: 'standard1', 'standard1_noacc', 'standardB'")


def max_len_bound(spec: dict) -> int:
    """The longest post-pipeline sample the workload can produce (sizes a memory-equivalent batch)."""
    if spec["kind"] == "mm":
        side = spec.get("max_side", 448)
        return spec["cutoff"] + (-(-side // 28)) ** 2
    return spec["cutoff"]
