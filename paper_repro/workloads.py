"""Workloads and nets for `paper_repro.train`: datasets, validation batches, the net, length bounds.

A *spec* (`paper_repro.spec.RunSpec`, as a dict) names the data (``kind``:
"lengths" = real corpus tokens at lengths drawn from a paper distribution,
"text" = the docstring chat corpus, "mm" = image + text with random-resize
augmentation), the net and the method list.  The per-method batch sources are
in `paper_repro.sources` (which imports this module, never the other way).
"""

from __future__ import annotations

import numpy as np
import torch

from .data import ChatDataset, ImageChatDataset, LengthDataset, chat_pairs, collate_pad, get_tokenizer
from .nets import LMConfig, TinyLM, TinyVLM, VLMConfig, apply_lora, hf_tiny_lm

__all__ = ["build_datasets", "val_batches", "build_net", "paper_lengths", "max_len_bound"]


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


def max_len_bound(spec: dict) -> int:
    """The longest post-pipeline sample the workload can produce (sizes a memory-equivalent batch)."""
    if spec["kind"] == "mm":
        side = spec.get("max_side", 448)
        return spec["cutoff"] + (-(-side // 28)) ** 2
    return spec["cutoff"]
