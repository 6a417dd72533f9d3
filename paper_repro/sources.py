"""Every per-method batch source of `paper_repro.train`, and the registry that names them.

A source is built by `batch_source(method, ds, spec, rank, world_size)` and has ``epoch(e)``
yielding ``(batch, meta)`` for this rank (meta: ``local_samples``, ``global_samples`` this step on
all ranks, ``real_tokens``, ``padded_tokens``, ``filler``, ``scale``, the loss multiplier, and
``indices``, the dataset indices in the batch, empty for a filler: the trainer checks exactly-once),
``join_context(ddp)``, ``setup_s`` (the one-off length-cache cost of GMT/BMT) and ``notes``.
A method whose package is missing raises `MethodUnavailable` (reported, never silently skipped).
Imports run one way: `paper_repro.train` -> this module -> `paper_repro.workloads`.
"""

from __future__ import annotations

import contextlib
import time

from torch.utils.data import DistributedSampler

from .data import collate_pad, sample_len
from .workloads import max_len_bound

__all__ = ["MethodUnavailable", "SOURCES", "batch_source", "fixed_batch_size", "build_length_cache",
           "FixedBatches", "OfflineBatches", "ODBBatches"]


class MethodUnavailable(RuntimeError):
    """A method's implementation is not importable here (reported, never silently skipped)."""


def _meta(items_or_batch: dict, local: int, global_: int, indices, scale: float = 1.0, filler: bool = False) -> dict:
    # a packed row (no attention_mask: an all-ones mask would turn off the model's packed-sequence detection)
    # has no padding: every position is a token
    m = items_or_batch.get("attention_mask")
    real, padded = (int(m.sum()), int(m.numel())) if m is not None else (items_or_batch["input_ids"].numel(),) * 2
    return {"local_samples": local, "global_samples": global_, "real_tokens": real if not filler else 0,
            "padded_tokens": padded, "filler": filler, "scale": scale,
            "indices": [] if filler else [int(i) for i in indices]}


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
        # What DataLoader(batch_size=bs, sampler=..., num_workers=0) does (fetch each index in the
        # caller's thread, then collate), with the indices kept for the exactly-once check.
        self.sampler.set_epoch(e)
        order = list(self.sampler)
        for i in range(0, len(order), self.bs):
            idx = order[i:i + self.bs]
            b = collate_pad([self.ds[j] for j in idx])
            yield b, _meta(b, len(idx), len(idx) * self.world_size, idx)


def fixed_batch_size(method: str, spec: dict) -> int:
    """Per-rank micro-batch size of a fixed-batch method: 1 for Standard batch 1, budget // longest
    possible sample for the memory-equivalent batch (never over the token budget)."""
    if method in ("standard1", "standard1_noacc"):
        return 1
    if method == "standardB":
        return max(1, spec["budget"] // max_len_bound(spec))
    raise ValueError(f"{method!r} is not a fixed-batch method; valid: 'standard1', 'standard1_noacc', 'standardB'")


def build_length_cache(ds, rank: int = 0, world_size: int = 1) -> tuple[list[int], float]:
    """Run the whole pipeline once to record every sample's post-pipeline length.

    This is what an offline sampler (GMT/BMT) needs before training can start.  The pass is
    sharded: this rank preprocesses indices ``rank::world_size`` and the ranks exchange their
    lengths (one all-gather when world_size > 1), the cheapest way for the oracles.  Returns
    (lengths, seconds on this rank, the exchange included).  For an augmented workload the cache
    is built at epoch 0 and is stale afterwards (reported in the notes by the caller).
    """
    t = time.perf_counter()
    if hasattr(ds, "set_epoch"):
        ds.set_epoch(0)
    mine = {i: sample_len(ds[i]) for i in range(rank, len(ds), world_size)}
    if world_size > 1:
        import torch.distributed as dist

        parts: list = [None] * world_size
        dist.all_gather_object(parts, mine)  # SYNC: every rank of an offline method builds its cache here
        mine = {i: n for part in parts for i, n in part.items()}
    return [mine[i] for i in range(len(ds))], time.perf_counter() - t


class OfflineBatches:
    """GMT / BMT from `odb.baselines` (and HF's rebalance sampler, `odb.baselines.peers`), fed a length cache the
    ranks build first (sharded).

    The schedule's steps are shuffled per epoch with the run's seed (fairseq
    shuffles its token-budget batches the same way; without it GMT would train
    longest-first).  A ``None`` entry (a rank with no batch in the last step)
    becomes a zero-weight filler so every rank runs the same DDP steps.  The
    cache is built at epoch 0; under augmentation (the "mm" workload) it is stale
    afterwards, and batches that then exceed the budget are counted
    (``over_budget_batches``), not hidden.
    """

    def __init__(self, method: str, ds, spec: dict, rank: int, world_size: int):
        try:
            from odb.baselines import bucketed_max_tokens, global_max_tokens
            from odb.batching import make_cost_model
        except ImportError as e:
            raise MethodUnavailable(f"{method}: odb.baselines is not importable ({e})") from None
        self.ds, self.rank, self.world_size, self.seed = ds, rank, world_size, spec["seed"]
        lengths, self.setup_s = build_length_cache(ds, rank, world_size)
        cost = make_cost_model("padded", spec["budget"])
        sizes = [(x,) for x in lengths]
        if method == "gmt":
            self.schedule = global_max_tokens(sizes, cost, world_size)
        elif method == "hf_rebalance":  # HF's BatchRebalanceSampler (`odb.baselines.peers`), on the same cache
            from odb.baselines.peers import hf_rebalance

            self.schedule = hf_rebalance(sizes, cost, world_size, seed=spec["seed"])
        else:
            self.schedule = bucketed_max_tokens(sizes, cost, world_size, bucket=spec.get("bmt_bucket", 4096))
        self.notes = (f"length cache pass over {len(ds)} samples; "
                      f"{len(self.schedule[0])} steps per rank")

    def join_context(self, ddp):
        return contextlib.nullcontext()

    def epoch(self, e: int):
        import numpy as np

        steps = np.random.default_rng([self.seed, e]).permutation(len(self.schedule[0]))
        for s in steps:
            row = self.schedule[self.rank][s]
            g = sum(len(self.schedule[r][s]) for r in range(self.world_size) if self.schedule[r][s] is not None)
            if row is None:
                b = collate_pad([self.ds[0]])
                yield b, _meta(b, 0, g, (), scale=0.0, filler=True)
            else:
                b = collate_pad([self.ds[i] for i in row])
                yield b, _meta(b, len(row), g, row)


class ODBBatches:
    """`odb.ODBDataLoader` in "pad" or "join" mode over the same dataset.

    Lengths are measured by the loader after `__getitem__` (`sample_len`: visual
    + text tokens), so nothing is cached beforehand (``setup_s`` is 0).  The loss
    multiplier is the loader's ``info.loss_scale`` (label-token basis); join mode
    wraps the epoch in DDP `Join`.  ``packed``: padding-free batches (`odb.batching.packed_collate`, one row
    per batch with the keys transformers reads; text samples only) under ``cost="packed"``.
    """

    def __init__(self, mode: str, ds, spec: dict, rank: int, world_size: int, packed: bool = False):
        try:
            import odb
            loader_cls = odb.ODBDataLoader
        except (ImportError, AttributeError) as e:
            raise MethodUnavailable(f"odb_{mode}: odb.ODBDataLoader is not importable ({e})") from None
        self.odb, self.mode = odb, mode
        from odb.batching import BalancedPolicy

        att = spec.get("attention")  # the policy's attention term (`RunSpec.attention`); None: the default policy
        policy = BalancedPolicy(attention=att) if att is not None else None
        from odb.batching import packed_collate

        self.packed = packed
        self.loader = loader_cls(ds, token_budget=spec["budget"], collate_fn=packed_collate if packed else collate_pad,
                                 length_fn=sample_len, shuffle=True, seed=spec["seed"], num_workers=0,
                                 buffer_size=spec.get("window", 256), mode=mode, cost="packed" if packed else "padded",
                                 loss_basis="label_tokens", timeout_s=spec.get("timeout_s", 120), policy=policy)
        self.setup_s, self.notes = 0.0, f"mode={mode}, window={spec.get('window', 256)}, no length cache"

    def close(self) -> None:
        """Stop the loader's engine and free its gloo group (every rank calls this at the same point)."""
        self.loader.close()

    def join_context(self, ddp):
        from odb.integrations import join_context

        return join_context(ddp, self.loader)  # DDP Join in mode "join" (the loader refuses it without)

    def epoch(self, e: int):
        if hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(e)
        for b in self.loader:
            info = self.odb.pop_step_info(b)
            yield b, _meta(b, info.local_samples, info.global_samples, info.indices, scale=info.loss_scale,
                           filler=info.filler)

    def loader_stats(self) -> dict:
        """The loader's own timers since construction: the consumer's wait and the engine's collectives."""
        st = self.loader.stats
        return {"loader_wait_s": st.wait_time_s, "collective_s": st.collective_s, "rounds": st.rounds}


# method -> how to build its source (the one list of methods; an unknown name lists the valid ones)
SOURCES = {
    "standard1": lambda ds, spec, r, n: FixedBatches(ds, fixed_batch_size("standard1", spec), spec, r, n),
    "standard1_noacc": lambda ds, spec, r, n: FixedBatches(ds, fixed_batch_size("standard1_noacc", spec), spec, r, n),
    "standardB": lambda ds, spec, r, n: FixedBatches(ds, fixed_batch_size("standardB", spec), spec, r, n),
    "gmt": lambda ds, spec, r, n: OfflineBatches("gmt", ds, spec, r, n),
    "bmt": lambda ds, spec, r, n: OfflineBatches("bmt", ds, spec, r, n),
    "hf_rebalance": lambda ds, spec, r, n: OfflineBatches("hf_rebalance", ds, spec, r, n),
    "odb_pad": lambda ds, spec, r, n: ODBBatches("pad", ds, spec, r, n),
    "odb_packed": lambda ds, spec, r, n: ODBBatches("pad", ds, spec, r, n, packed=True),
    "odb_join": lambda ds, spec, r, n: ODBBatches("join", ds, spec, r, n),
}


def batch_source(method: str, ds, spec: dict, rank: int, world_size: int):
    """The per-rank batch source of `method`; raises MethodUnavailable if its code is missing."""
    try:
        make = SOURCES[method]
    except KeyError:
        raise ValueError(f"unknown method {method!r}; valid: {sorted(SOURCES)}") from None
    return make(ds, spec, rank, world_size)
