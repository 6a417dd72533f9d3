"""Collate helpers for one group of samples (imports torch; load lazily).

Each sample is a mapping with a 1-D ``input_ids`` and optionally ``labels`` (same length; defaults to
``input_ids``).  Visual inputs ride along (`VISUAL_KEYS`, below).

``pad_collate``      right-padded ``[batch, longest]`` tensors: ``input_ids`` (padded with `pad_id`),
                     ``labels`` (padded with -100, the ignore index of ``CrossEntropyLoss``) and
                     ``attention_mask`` (the samples' own, padded with 0, or 1 on every token).  Visual
                     inputs are joined as vision towers read them; any other key: 1-D sequences are
                     right-padded into a tensor, numbers become a 1-D tensor, equal-shaped tensors are
                     stacked, anything else is a list.  The runtime's default ``collate_fn``.
``packed_collate``   padding-free packing, the layout of ``transformers.DataCollatorWithFlattening``:
                     one ``[1, total]`` row holding every sample back to back, ``position_ids``
                     restarting at 0 for each sample, ``labels`` with each sample's first position set
                     to -100 (no token is predicted across a boundary), and the varlen kernels' keys
                     under the names transformers reads (``cu_seq_lens_q/k`` int32, ``max_length_q/k``).
                     No ``attention_mask`` (an all-ones mask turns the packed-sequence detection off
                     under SDPA), and ``use_cache=False`` (with a KV cache, sdpa, eager and flex
                     attention build a causal mask over the whole row and mix the samples).  For mRoPE
                     models (Qwen2-VL style), `mrope_collate` builds the position ids per sample.
``check_packing``    measures whether a model keeps packed samples apart (a state-space, convolution or
                     linear-attention layer may carry one sample's state into the next): raises
                     `ConfigError` where it does not.
``visual_stub``      wraps a collate so that the model's vision tower runs on every rank at every step:
                     a batch without images (or videos) gets a zero-loss stub sample appended.  Needed
                     under FSDP when the vision tower is sharded as its own units (a rank that skips it
                     skips its all-gathers: the ranks' collectives no longer match), and under DDP
                     without ``find_unused_parameters``.

Loss targets: with `packed_collate` the targets of a causal LM's shifted loss are each sample's
``labels[1:]``, which is what the loader counts with ``shift_labels=True`` (its default with a packed
collate; ``False`` is refused there).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch

from ..errors import ConfigError, SampleError

__all__ = ["pad_collate", "packed_collate", "mrope_collate", "visual_stub", "check_packing", "IGNORE_INDEX",
           "VISUAL_KEYS", "PIXEL_KEYS", "PACKED_COLLATES"]

IGNORE_INDEX = -100
# How vision towers read per-sample visual inputs (transformers' Qwen2-VL, LLaVA): patch-flattened pixel
# values [patches, dim] and per-image grids [images, 3] are concatenated along dim 0 (over the samples
# that have an image: a batch may mix text-only and image samples); fixed-size images ([channels, height,
# width]) are stacked into [batch, ...] (every sample needs one then).
VISUAL_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
# the keys whose presence makes a vision-language model call its vision tower (transformers' Qwen2-VL calls it once
# for the images and once for the videos of a batch): what `visual_stub` keeps present in every batch
PIXEL_KEYS = ("pixel_values", "pixel_values_videos")
# per token: 0 text, 1 image, 2 video (what a Qwen-VL processor returns); a text-only sample may omit it
TOKEN_TYPES = "mm_token_type_ids"
_OPTIONAL = VISUAL_KEYS + (TOKEN_TYPES,)


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


def _same_keys(batch: Sequence[Mapping], skip: tuple[str, ...]) -> list[str]:
    """The batch's keys (besides `skip`): the same in every sample, except the visual ones (`_OPTIONAL`)."""
    keys = [k for k in batch[0] if k not in skip and k not in _OPTIONAL]
    for j, s in enumerate(batch[1:], 1):
        if [x for x in s if x not in skip and x not in _OPTIONAL] != keys:
            raise SampleError(f"sample {j} of the batch has keys {sorted(s)}, sample 0 has {sorted(batch[0])}; "
                              "every sample of a batch must carry the same keys")
    return keys + [k for k in _OPTIONAL if any(k in s for s in batch)]


def _types(batch: Sequence[Mapping], rows) -> list[torch.Tensor]:
    """Every sample's token types (0 where a text-only sample has none)."""
    out = []
    for s, (ids, _) in zip(batch, rows):
        t = torch.as_tensor(s[TOKEN_TYPES], dtype=torch.long).reshape(-1) if TOKEN_TYPES in s \
            else torch.zeros_like(ids)
        if t.shape != ids.shape:
            raise SampleError(f"{TOKEN_TYPES} has {t.numel()} entries, input_ids {ids.numel()}")
        out.append(t)
    return out


def _visual(key: str, batch: Sequence[Mapping]):
    """One visual input of a batch, joined as the vision tower reads it (`VISUAL_KEYS`)."""
    ts = [torch.as_tensor(s[key]) for s in batch if key in s]
    if any(t.dim() < 2 for t in ts):
        raise SampleError(f"{key} of a sample has shape {[tuple(t.shape) for t in ts]}; {key} must be "
                          "[patches, dim] (patch-flattened), [images, 3] (grids) or an image tensor")
    if key.endswith("grid_thw") or ts[0].dim() == 2:
        return torch.cat(ts, dim=0)
    if len(ts) != len(batch):
        raise SampleError(f"{len(batch) - len(ts)} samples of a batch have no {key}; fixed-size images are stacked "
                          "[batch, ...], so every sample needs one (or flatten images into patches)")
    shapes = {tuple(t.shape) for t in ts}
    if len(shapes) > 1:
        raise SampleError(f"{key} has shapes {sorted(shapes)} in one batch; fixed-size images must share a shape "
                          "(resize them in preprocessing), or flatten them into patches")
    return torch.stack(ts)


def pad_collate(batch: Sequence[Mapping], pad_id: int = 0) -> dict:
    """Right-pad a group to its longest sample (see the module docstring).

    Raises SampleError for an empty group, a sample without ``input_ids`` or with zero tokens, labels
    of another length, samples whose keys differ, or visual inputs that cannot be joined.
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
    for key in _same_keys(batch, ("input_ids", "labels")):
        if key in VISUAL_KEYS:
            out[key] = _visual(key, batch)
        elif key == TOKEN_TYPES:
            out[key] = _extra(_types(batch, rows), 0)
        else:
            out[key] = _extra([s[key] for s in batch], 0 if key == "attention_mask" else pad_id)
    return out


def _extra(vals: list, fill: int):
    """One extra key of `pad_collate`: padded 1-D sequences, a tensor of numbers, stacked tensors, or a list."""
    v0 = vals[0]
    if isinstance(v0, (list, tuple, torch.Tensor)) and (not isinstance(v0, torch.Tensor) or v0.dim() == 1):
        seqs = [torch.as_tensor(v) for v in vals]
        out = torch.full((len(seqs), max(len(t) for t in seqs)), fill, dtype=seqs[0].dtype)
        for i, t in enumerate(seqs):
            out[i, :len(t)] = t
        return out
    if isinstance(v0, (bool, int, float)):
        return torch.tensor(vals)
    if isinstance(v0, torch.Tensor) and all(isinstance(v, torch.Tensor) and v.shape == v0.shape for v in vals):
        return torch.stack(vals)
    return list(vals)


def packed_collate(batch: Sequence[Mapping], *, use_cache_key: bool = True) -> dict:
    """Concatenate a group into one padding-free row (see the module docstring).

    ``use_cache_key=False`` leaves ``use_cache`` out, for a model whose forward takes no such argument
    (it must then not build a KV cache in training).  Visual inputs are joined as in `pad_collate` and
    ``mm_token_type_ids`` concatenated; other per-sample keys (metadata such as an ``id``, a per-sample
    ``attention_mask``) have no place in one packed row and are left out.
    """
    rows = _rows(batch)
    lens = [ids.numel() for ids, _ in rows]
    labels = []
    for _, lab in rows:
        lab = lab.clone()
        lab[0] = IGNORE_INDEX
        labels.append(lab)
    cu = torch.zeros(len(rows) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0)
    out = {
        "input_ids": torch.cat([ids for ids, _ in rows]).unsqueeze(0),
        "labels": torch.cat(labels).unsqueeze(0),
        "position_ids": torch.cat([torch.arange(n, dtype=torch.long) for n in lens]).unsqueeze(0),
        "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max(lens), "max_length_k": max(lens),
    }
    if use_cache_key:
        out["use_cache"] = False
    for key in _same_keys(batch, ("input_ids", "labels")):
        if key in VISUAL_KEYS:
            out[key] = _visual(key, batch)
        elif key == TOKEN_TYPES:
            out[key] = torch.cat(_types(batch, rows)).unsqueeze(0)
    return out


def mrope_collate(rope_index: Callable) -> Callable[[Sequence[Mapping]], dict]:
    """`packed_collate` for mRoPE models (Qwen2-VL, Qwen2.5-VL): the position ids are built per sample and
    restart at every sample boundary.

    `rope_index` is the model's own position rule, e.g. ``model.model.get_rope_index`` of a transformers
    ``Qwen2VLForConditionalGeneration``: called per sample as ``rope_index(input_ids[1, L],
    mm_token_type_ids=[1, L], image_grid_thw=<that sample's grids or None>)``, it returns ``([3, 1, L],
    deltas)``.  The batch's ``position_ids`` are ``[4, 1, total]``: the text positions (restarting per
    sample: what transformers builds the packed attention mask from) over the three mRoPE rows.  Each
    sample needs ``mm_token_type_ids`` (0 text, 1 image) when it holds an image.
    """
    def collate(batch: Sequence[Mapping]) -> dict:
        out = packed_collate(batch)
        pos = []
        for k, s in enumerate(batch):
            ids = torch.as_tensor(s["input_ids"], dtype=torch.long).reshape(1, -1)
            types = torch.as_tensor(s.get("mm_token_type_ids", torch.zeros_like(ids)), dtype=torch.long).reshape(1, -1)
            grid = s.get("image_grid_thw")
            rows, _ = rope_index(ids, mm_token_type_ids=types,
                                 image_grid_thw=None if grid is None else torch.as_tensor(grid))
            if rows.shape != (3, 1, ids.shape[1]):
                raise SampleError(f"rope_index returned position ids of shape {tuple(rows.shape)} for sample {k} of "
                                  f"{ids.shape[1]} tokens; expected (3, 1, {ids.shape[1]})")
            text = torch.arange(ids.shape[1], dtype=torch.long).view(1, 1, -1)
            pos.append(torch.cat([text, rows.to(torch.long)], dim=0))
        out["position_ids"] = torch.cat(pos, dim=2)
        return out
    collate.packs = True  # the loader counts labels[1:] with it, as with packed_collate
    return collate


PACKED_COLLATES = (packed_collate,)  # collates that mask each sample's first label (see `counts_shifted`)


def visual_stub(collate_fn: Callable[[Sequence[Mapping]], dict],
                *stubs: Mapping) -> Callable[[Sequence[Mapping]], dict]:
    """`collate_fn` with the vision tower made unconditional: for each stub, a batch in which no sample carries
    one of the stub's `PIXEL_KEYS` gets the stub appended as one more sample before `collate_fn` runs.

    Why: a vision-language model calls its vision tower only for a batch that holds images, so whether it
    runs is a rank-local fact while the collectives it implies are global.  Under FSDP with the tower's blocks
    sharded as their own units, a rank whose batch is text-only (or a text-only filler) skips their
    all-gathers and reduce-scatters while its peers run them: the collectives no longer match (measured on
    gloo: "Received data size doesn't match expected size", the process aborts; on NCCL we expect a hang or
    mixed-up buffers, not run here).  Under DDP the tower's parameters go without gradients (DDP then needs
    ``find_unused_parameters``).  ODB's batches mix text-only and image samples freely, so this happens at
    any step.

    A stub is one processed sample holding a small image (or video) of its model, e.g. Qwen2-VL: ``input_ids``
    ``[vision_start, image_token, vision_end]``, ``pixel_values`` of a 1 x 2 x 2 patch grid (zeros),
    ``image_grid_thw [[1, 2, 2]]``, ``mm_token_type_ids [0, 1, 0]``, and ``labels`` of -100 only.  With no
    label token it adds nothing to the loss, to the loader's label counts (taken from the dataset's samples,
    never from the stub) or to any gradient: the tower's parameters get exactly zero from it, and the other
    samples' losses are unchanged (in `pad_collate` it is a row of its own; in `packed_collate` and
    `mrope_collate` a segment of its own).  It is appended after the batch's samples, outside the budget:
    keep it tiny.  It must carry the keys the batch's samples carry (`pad_collate` requires the same keys).
    The result counts as a packing collate where `collate_fn` does (`counts_shifted`).  For patch-flattened
    visual inputs (Qwen2-VL style); fixed-size images are stacked one per sample, so `pad_collate` refuses a
    batch that mixes them with text-only samples, the stub's batch included.

    :raises ConfigError: no stub, or a stub that is not a mapping, carries no `PIXEL_KEYS`, has no
        ``input_ids`` or ``labels``, labels of another length, or any label other than -100.
    """
    if not callable(collate_fn):
        raise ConfigError(f"visual_stub needs a collate function, got {collate_fn!r}")
    if not stubs:
        raise ConfigError("visual_stub needs at least one stub sample (a processed sample holding a small image, "
                          "labels all -100); with none it would change nothing")
    need = []
    for k, s in enumerate(stubs):
        if not isinstance(s, Mapping):
            raise ConfigError(f"stub {k} is a {type(s).__name__}, not a processed sample (a mapping)")
        keys = tuple(x for x in PIXEL_KEYS if x in s)
        if not keys:
            raise ConfigError(f"stub {k} carries none of {PIXEL_KEYS} (keys: {sorted(s)}); it would not run the "
                              "vision tower")
        if "input_ids" not in s or "labels" not in s:
            raise ConfigError(f"stub {k} needs 'input_ids' and 'labels' (keys: {sorted(s)}); without labels a "
                              "collate trains on its input_ids")
        try:
            ids = torch.as_tensor(s["input_ids"], dtype=torch.long).reshape(-1)
            lab = torch.as_tensor(s["labels"], dtype=torch.long).reshape(-1)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ConfigError(f"stub {k}: input_ids and labels must be integer sequences ({type(e).__name__}: "
                              f"{e})") from None
        if ids.numel() == 0 or lab.shape != ids.shape:
            raise ConfigError(f"stub {k} has {ids.numel()} input_ids and {lab.numel()} labels; it needs at least "
                              "one token and a label per token")
        if bool((lab != IGNORE_INDEX).any()):
            raise ConfigError(f"stub {k} has {int((lab != IGNORE_INDEX).sum())} label tokens; a stub must add "
                              f"nothing to the loss: set every label to {IGNORE_INDEX}")
        need.append((keys, s))

    def collate(batch: Sequence[Mapping]) -> dict:
        extra = [s for keys, s in need if not all(any(key in b for b in batch) for key in keys)]
        return collate_fn([*batch, *extra] if extra else batch)
    collate.packs = counts_shifted(collate_fn)
    return collate


def check_packing(model, collate_fn: Callable[[Sequence[Mapping]], dict] = packed_collate, *,
                  lengths: Sequence[int] = (9, 6, 7), vocab_size: int | None = None, tol: float = 1e-5,
                  seed: int = 0) -> float:
    """Measure whether `model` keeps the samples of a packed batch apart; return the leak, raise if it does not.

    Packing is exact only where every layer restarts at a sample boundary.  Attention does, through
    ``position_ids`` or ``cu_seq_lens``; a state-space (Mamba), short-convolution or linear-attention layer
    does only where its kernel reads the boundaries.  Measured on tiny random models (transformers 5.24,
    CPU): Bamba, Jamba and LFM2 carried the first sample's tokens into the next sample's logits, silently,
    while Qwen3-Next and Qwen3.5 refuse packed rows without flash-linear-attention.  Attention mixes packed
    samples too where a KV cache is built: transformers' ``DataCollatorWithFlattening`` on a Llama whose
    config keeps ``use_cache=True`` (`packed_collate` passes ``use_cache=False`` in the batch).

    The probe: random token ids of `lengths` (one sample each) through `collate_fn`, then the same with
    every token of the first sample changed, both through `model` with no gradient, in eval mode (the
    model's mode is restored).  The leak is the largest change of any later sample's logits, over the
    largest of their magnitudes.  A model that keeps samples apart gives 0.0 here (sdpa and eager
    attention on CPU), since nothing a later sample's logits are computed from changed.  Call it on the
    model and the collate you train with, once, on every rank if the model is wrapped (FSDP gathers its
    parameters in the forward), or before wrapping.

    :param vocab_size: token ids are drawn below it; default: the model config's (its text config's for a
        vision-language model).
    :returns: the leak (<= `tol`).
    :raises ConfigError: the leak exceeds `tol`; the model raised on the packed batch (its error is
        chained); no vocabulary size; fewer than 2 `lengths` or one below 1; no logits in the output.
    """
    lengths = [int(n) for n in lengths]
    if len(lengths) < 2 or min(lengths) < 1:
        raise ConfigError(f"check_packing needs at least 2 sample lengths of at least 1 token, got {lengths}")
    if vocab_size is None:
        cfg = getattr(model, "config", None)
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        vocab_size = getattr(text, "vocab_size", None)
        if vocab_size is None:
            raise ConfigError(f"check_packing found no vocab_size on {type(model).__name__}'s config; pass "
                              "vocab_size=")
    if int(vocab_size) < 2:
        raise ConfigError(f"check_packing needs a vocabulary of at least 2 tokens, got {vocab_size}")
    vocab = int(vocab_size)
    gen = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]
    changed = [(ids[0] + 1 + torch.randint(0, vocab - 1, (lengths[0],), generator=gen)) % vocab, *ids[1:]]
    try:
        device = next(model.parameters()).device
    except (AttributeError, StopIteration):
        device = torch.device("cpu")

    def logits(rows):
        batch = collate_fn([{"input_ids": r.tolist(), "labels": r.tolist()} for r in rows])
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        try:
            out = model(**batch)
        except Exception as e:
            raise ConfigError(f"{type(model).__name__} refused a packed batch ({type(e).__name__}: {e}); it cannot "
                              "train on packed rows as set up: use pad_collate and cost='padded'") from e
        got = getattr(out, "logits", None)
        if got is None and isinstance(out, Mapping):
            got = out.get("logits")
        if not isinstance(got, torch.Tensor):
            raise ConfigError(f"check_packing found no logits in {type(model).__name__}'s output "
                              f"({type(out).__name__})")
        return got.detach().float().reshape(-1, got.shape[-1])

    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            a, b = logits(ids), logits(changed)
    finally:
        model.train(training)
    later = slice(lengths[0], sum(lengths))
    scale = a[later].abs().max().item()
    leak = (a[later] - b[later]).abs().max().item() / max(scale, 1e-30)
    if not leak <= tol:
        raise ConfigError(
            f"{type(model).__name__} mixes the samples of a packed batch: changing the first sample's tokens "
            f"moved the next samples' logits by {leak:.3g} of their magnitude (tolerance {tol:g}). A state-space, "
            "convolution or linear-attention layer is carrying state across sample boundaries, so packed training "
            "would silently train each sample on its neighbours. Use pad_collate and cost='padded', or kernels "
            "that read the boundaries (for example flash-linear-attention, or Mamba kernels given seq_idx)")
    return leak


def counts_shifted(collate_fn) -> bool:
    """True for a collate that masks each sample's first label (`packed_collate`, `mrope_collate`,
    transformers' ``DataCollatorWithFlattening``): its loss targets are each sample's ``labels[1:]``."""
    if collate_fn in PACKED_COLLATES or getattr(collate_fn, "packs", False):
        return True
    return type(collate_fn).__name__ == "DataCollatorWithFlattening"
