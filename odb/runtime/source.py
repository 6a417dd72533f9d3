"""The rank's data source: its index order, preprocessing in DataLoader workers, measurement.

Legend
    position   the place of a sample in this rank's index order for the epoch
               (map-style) or in this rank's stream (IterableDataset); the unit
               of resume bookkeeping
    index      the dataset index (map-style) or, for an IterableDataset, the position
    sizes      tuple of non-negative ints per sample, resource 0 = tokens

Preprocessing (the dataset's ``__getitem__`` / ``__iter__``) and measurement
(``length_fn``, label counting) run inside an ordinary inner
``torch.utils.data.DataLoader`` with ``batch_size=None``, so any worker count,
start method and ``persistent_workers`` work.  Each item comes back as
``(position, index, sample, measure)``; an exception in a worker comes back as
a `_Failure` value naming the index (the engine raises it on this rank), so a
worker error is never a bare traceback without the index.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, get_worker_info

from ..batching.deal import DealtOrder
from ..errors import SampleError

__all__ = ["Source", "Item", "default_length", "count_labels", "shard_order"]


class _Failure:
    """An exception raised while preprocessing or measuring one sample (picklable)."""

    def __init__(self, stage: str, exc: BaseException):
        self.stage = stage
        self.type = type(exc).__name__
        self.message = str(exc)
        self.tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=8))


def default_length(sample: Any) -> int:
    """``len(sample["input_ids"])``; the sample must be a mapping with ``input_ids``."""
    if not isinstance(sample, Mapping) or "input_ids" not in sample:
        keys = sorted(sample)[:8] if isinstance(sample, Mapping) else None
        raise KeyError(f"sample has no 'input_ids' (type {type(sample).__name__}, keys {keys}); "
                       "pass length_fn=... to ODBDataLoader for other layouts")
    return len(sample["input_ids"])


def count_labels(sample: Any, shift: bool = False) -> int:
    """Label positions that are not -100; 0 if the sample has none.

    ``shift=False`` counts ``labels`` as given.  ``shift=True`` counts
    ``labels[1:]``: the targets a causal LM's loss averages over after it
    shifts labels by one (Hugging Face ``*ForCausalLM``: ``labels[..., 1:]``),
    so position 0 is never counted.  With right padding by -100 (`pad_collate`)
    or packing with each sample's first label set to -100 (`packed_collate`)
    the batch's shifted count is the sum of its samples' shifted counts.
    """
    labels = sample.get("labels") if isinstance(sample, Mapping) else None
    if labels is None:
        return 0
    if shift:
        labels = labels[1:]
    if isinstance(labels, torch.Tensor):
        return int((labels != -100).sum())
    return sum(1 for v in labels if v != -100)


def _measure(sample: Any, length_fn: Callable | None, shift: bool) -> tuple[tuple[int, ...], int]:
    raw = default_length(sample) if length_fn is None else length_fn(sample)
    sizes = (int(raw),) if isinstance(raw, (int,)) or hasattr(raw, "__index__") else tuple(int(v) for v in raw)
    if not sizes or any(v < 0 for v in sizes):
        raise ValueError(f"length must be a non-negative int or a non-empty tuple of them, got {raw!r}")
    return sizes, count_labels(sample, shift)


def _process(pos: int, index: Any, get: Callable[[], Any], length_fn: Callable | None, shift: bool) -> tuple:
    try:
        sample = get()
    except Exception as e:  # reported on this rank with the index, see module doc
        return pos, index, None, _Failure("preprocessing", e)
    if sample is None:
        return pos, index, None, None
    try:
        return pos, index, sample, _measure(sample, length_fn, shift)
    except Exception as e:
        return pos, index, sample, _Failure("length", e)


class _MapFetch(Dataset):
    """Map-style wrapper: key ``(position, index)`` -> processed, measured item."""

    def __init__(self, dataset: Dataset, length_fn: Callable | None, shift: bool):
        self.dataset, self.length_fn, self.shift = dataset, length_fn, shift

    def __getitem__(self, key):
        pos, index = key
        return _process(pos, index, lambda: self.dataset[index], self.length_fn, self.shift)


class _IterFetch(IterableDataset):
    """Iterable wrapper: numbers the stream so positions are unique across workers
    (``position = k * num_workers + worker_id``)."""

    def __init__(self, dataset: IterableDataset, length_fn: Callable | None, shift: bool):
        self.dataset, self.length_fn, self.shift = dataset, length_fn, shift

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        it = iter(self.dataset)
        k = 0
        while True:
            pos = k * nw + wid
            try:
                sample = next(it)
            except StopIteration:
                return
            except Exception as e:
                yield pos, pos, None, _Failure("preprocessing", e)
                return
            yield _process(pos, pos, lambda: sample, self.length_fn, self.shift)
            k += 1


class _Keys(Sampler):
    """Yields this epoch's ``(position, index)`` keys; reassigned per epoch (works with persistent workers).

    Fixed shards: the list `keys`.  Dealt sharding: `deal` (`odb.batching.deal.DealtOrder`) answers
    each read, its keys growing while the epoch runs (and, between deals, from this rank's reserve);
    the iterator ends when it answers None.  It never blocks: the thread that pulls keys is the
    engine thread that applies the deals.
    """

    def __init__(self) -> None:
        self.keys: list = []
        self.deal: DealtOrder | None = None

    def __iter__(self):
        i = 0
        while True:
            if self.deal is not None:
                key = self.deal.key(i)
            else:
                key = self.keys[i] if i < len(self.keys) else None
            if key is None:
                return
            yield key
            i += 1

    def __len__(self) -> int:
        return len(self.keys) if self.deal is None else len(self.deal.keys)


def _identity(x):
    return x


def shard_order(num_samples: int, rank: int, world_size: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The default equal shard: a permutation (seeded by ``seed + epoch``) dealt round robin.

    Shard sizes differ by at most one; no index is repeated or dropped.
    """
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        perm = torch.randperm(num_samples, generator=g).tolist()
    else:
        perm = list(range(num_samples))
    return perm[rank::world_size]


class Item:
    """One usable sample in the engine: where it came from, the sample, its sizes."""

    __slots__ = ("pos", "index", "sample", "sizes", "labels")

    def __init__(self, pos, index, sample, sizes, labels):
        self.pos, self.index, self.sample, self.sizes, self.labels = pos, index, sample, sizes, labels


class Source:
    """This rank's stream of ``(position, index, sample, measure)`` items for one epoch.

    Owns one inner DataLoader for the loader's lifetime (so persistent workers
    persist across epochs).  `start` begins an epoch; `next` returns the next
    raw item or None at the end; `remaining` lists the indices not yet pulled
    (map-style only).
    """

    def __init__(self, dataset, *, length_fn, num_workers: int, prefetch_factor, persistent_workers: bool,
                 multiprocessing_context, worker_init_fn, pin_memory: bool = False, shift_labels: bool = False,
                 worker_timeout_s: float = 0.0):
        self.iterable = isinstance(dataset, IterableDataset)
        self._keys = None if self.iterable else _Keys()
        wrapped = (_IterFetch if self.iterable else _MapFetch)(dataset, length_fn, bool(shift_labels))
        kw = dict(batch_size=None, collate_fn=_identity, num_workers=num_workers,
                  persistent_workers=persistent_workers and num_workers > 0,
                  multiprocessing_context=multiprocessing_context if num_workers > 0 else None,
                  worker_init_fn=worker_init_fn, pin_memory=pin_memory)
        if num_workers > 0 and prefetch_factor is not None:
            kw["prefetch_factor"] = prefetch_factor
        # keys the inner DataLoader may pull ahead of the items it has returned (its prefetch)
        self.ahead = num_workers * (2 if prefetch_factor is None else int(prefetch_factor))
        if num_workers > 0 and worker_timeout_s > 0:
            # A hung (not dead) worker: DataLoader raises after this long without a sample, the engine
            # turns that into a local failure, and the table's abort takes every rank out.
            kw["timeout"] = worker_timeout_s
        if not self.iterable:
            kw["sampler"] = self._keys
        self._worker_timeout_s = worker_timeout_s if num_workers > 0 else 0.0
        self._loader = DataLoader(wrapped, **kw)
        self._it: Iterator | None = None
        self._pulled = 0

    def start(self, keys: Sequence[tuple[int, Any]] | None, skip: set | frozenset = frozenset(),
              deal: "DealtOrder | None" = None) -> None:
        """Begin an epoch over `keys` (map-style) or the whole stream minus the
        positions in `skip` (IterableDataset: skipped items are still read).
        With `deal` (whose first deal is applied), `keys` is ignored: the deal answers every read."""
        if self._keys is not None:
            self._keys.keys = [] if deal is not None else list(keys or ())
            self._keys.deal = deal
        self._skip = skip if self.iterable else frozenset()
        self._pulled = 0
        self._it = iter(self._loader)

    def next(self):
        while self._it is not None:
            try:
                item = next(self._it)
            except StopIteration:
                self._it = None
                return None
            except RuntimeError as e:
                if self._worker_timeout_s > 0 and "timed out" in str(e):
                    raise SampleError(
                        f"no preprocessed sample arrived within timeout_s={self._worker_timeout_s:g} s (after "
                        f"{self._pulled} samples this epoch): a DataLoader worker hung or is slower than that. "
                        "Fix the preprocessing or raise timeout_s") from e
                raise
            self._pulled += 1
            if item[0] not in self._skip:
                return item
        return None

    @property
    def dry(self) -> bool:
        """Dealt sharding: the key iterator ended while more keys could still have been dealt."""
        return self._keys is not None and self._keys.deal is not None and self._keys.deal.dry

    @property
    def pulled(self) -> int:
        """Items received this epoch (usable or not)."""
        return self._pulled

    def remaining(self) -> list | None:
        """Indices not yet pulled this epoch (None for an IterableDataset: its rest is unknown)."""
        if self._keys is None:
            return None
        keys = self._keys.keys if self._keys.deal is None else self._keys.deal.keys
        return [index for _, index in keys[self._pulled:]]

    def stop(self) -> None:
        """End the epoch's iterator (non-persistent workers exit here)."""
        self._it = None

    def close(self) -> None:
        self._it = None
        self._loader = None
