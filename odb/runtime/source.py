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
start method and ``persistent_workers`` work.  With ``num_workers=0`` and no
``pin_memory`` the rank's thread makes the same calls itself (`_direct`): the
DataLoader's in-process iterator would add only a profiler ``record_function``
per item, about a third of the loader's CPU per sample.  Each item comes back as
``(position, index, sample, measure)``; an exception in a worker comes back as
a `odb.core.rank.Failure` value naming the index (the engine raises it on this rank), so a
worker error is never a bare traceback without the index.
"""

from __future__ import annotations

import operator
import time
import traceback
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, get_worker_info

from ..batching.dealt_order import DealtOrder
from ..core.types import Failure, Interrupted
from ..errors import SampleError

__all__ = ["Source", "default_length", "count_labels", "shard_order", "measure_sample", "POLL_S"]

# With workers the inner DataLoader is asked for each item with this timeout and asked again
# until the item comes: between asks the engine sees that a worker died (DataLoader checks its
# workers when a wait times out) or that the rank must stop.  A plain DataLoader notices a dead
# worker through its SIGCHLD handler at once; 0.1 s keeps the engine within that order.
POLL_S = 0.1


def _failure(stage: str, exc: BaseException) -> Failure:
    """The exception of preprocessing or measuring one sample, as a picklable value."""
    return Failure(stage, type(exc).__name__, str(exc),
                   "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=8)))


def default_length(sample: Any) -> int:
    """``len(sample["input_ids"])`` of a 1-D ``input_ids`` (a list or tuple of ints, or a 1-D tensor
    or array).  Raises ValueError for any other shape: a ``[1, n]`` tensor (what a tokenizer returns
    with ``return_tensors="pt"``) would otherwise measure as one token and defeat the budget."""
    if type(sample) is not dict and not isinstance(sample, Mapping) or "input_ids" not in sample:
        keys = sorted(sample)[:8] if isinstance(sample, Mapping) else None
        raise KeyError(f"sample has no 'input_ids' (type {type(sample).__name__}, keys {keys}); "
                       "pass length_fn=... to ODBDataLoader for other layouts")
    ids = sample["input_ids"]
    if type(ids) is list or type(ids) is tuple:  # the common case first (this runs once per sample)
        if ids and isinstance(ids[0], (list, tuple)) or ids and getattr(ids[0], "shape", None):
            raise ValueError(f"input_ids is nested (its first element is a {type(ids[0]).__name__}); a sample's "
                             "input_ids must be 1-D (one sample, not a batch), or pass length_fn=...")
        return len(ids)
    shape = getattr(ids, "shape", None)
    if shape is not None:
        if len(shape) != 1:
            raise ValueError(f"input_ids has shape {tuple(shape)}; a sample's input_ids must be 1-D (squeeze "
                             "the batch axis a tokenizer adds with return_tensors='pt', or pass length_fn=...)")
        return int(shape[0])
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
        raise ValueError(f"input_ids is a {type(ids).__name__}; it must be a 1-D sequence of token ids")
    if len(ids) and isinstance(ids[0], (list, tuple)) or len(ids) and getattr(ids[0], "shape", None):
        raise ValueError(f"input_ids is nested (its first element is a {type(ids[0]).__name__}); a sample's "
                         "input_ids must be 1-D (one sample, not a batch), or pass length_fn=...")
    return len(ids)


def count_labels(sample: Any, shift: bool = False) -> int:
    """Label positions that are not -100, of ``labels``, or of ``input_ids`` when the sample has no
    ``labels`` (what `pad_collate` and `packed_collate` build then: the loss's targets are the
    tokens themselves).

    ``shift=False`` counts the labels as given.  ``shift=True`` counts
    ``labels[1:]``: the targets a causal LM's loss averages over after it
    shifts labels by one (Hugging Face ``*ForCausalLM``: ``labels[..., 1:]``),
    so position 0 is never counted.  With right padding by -100 (`pad_collate`)
    or packing with each sample's first label set to -100 (`packed_collate`)
    the batch's shifted count is the sum of its samples' shifted counts.
    """
    if type(sample) is not dict and not isinstance(sample, Mapping):  # a dict skips the ABC check
        return 0
    labels = sample.get("labels")
    if labels is None:
        labels = sample.get("input_ids")
        if labels is None:
            return 0
    if shift:
        labels = labels[1:]
    if isinstance(labels, torch.Tensor) or hasattr(labels, "__array__"):
        return int((labels != -100).sum())
    if isinstance(labels, (list, tuple, range)):
        return len(labels) - labels.count(-100)  # C speed: this runs once per sample in the workers
    return sum(1 for v in labels if v != -100)


def _size(v: Any, raw: Any) -> int:
    if isinstance(v, bool):
        raise ValueError(f"length must be an int or a tuple of ints, got the bool {raw!r}")
    try:
        return operator.index(v)  # ints, numpy ints, one-element integer tensors; never a float or str
    except TypeError:
        raise ValueError(f"length must be an int or a tuple of ints (sizes per resource), got {raw!r} of type "
                         f"{type(raw).__name__}") from None


def measure_sample(sample: Any, length_fn: Callable | None, shift: bool) -> tuple[tuple[int, ...], int]:
    """A preprocessed sample's ``(sizes, label tokens)``, as the rank core reads it (``length_fn`` or
    `default_length`; the labels shifted when `shift`).  Raises TypeError/ValueError on a length that is not an
    int, a tuple of ints, or a one-dimensional ``input_ids``."""
    raw = default_length(sample) if length_fn is None else length_fn(sample)
    if type(raw) is int:
        sizes = (raw,)
    elif isinstance(raw, (list, tuple)):
        sizes = tuple(_size(v, raw) for v in raw)
    else:
        sizes = (_size(raw, raw),)
    if not sizes or any(v < 0 for v in sizes):
        raise ValueError(f"length must be a non-negative int or a non-empty tuple of them, got {raw!r}")
    return sizes, count_labels(sample, shift)


def _process(pos: int, index: Any, get: Callable[[], Any], length_fn: Callable | None, shift: bool) -> tuple:
    try:
        sample = get()
    except Exception as e:  # reported on this rank with the index, see module doc
        return pos, index, None, _failure("preprocessing", e)
    if sample is None:
        return pos, index, None, None
    try:
        return pos, index, sample, measure_sample(sample, length_fn, shift)
    except Exception as e:
        return pos, index, sample, _failure("length", e)


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
                yield pos, pos, None, _failure("preprocessing", e)
                return
            yield _process(pos, pos, lambda: sample, self.length_fn, self.shift)
            k += 1


class _Keys(Sampler):
    """Yields this epoch's ``(position, index)`` keys; reassigned per epoch (works with persistent workers).

    Fixed shards: the list `keys`.  Dealt sharding: `deal` (`odb.batching.dealt_order.DealtOrder`) answers
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


# DataLoader keywords that only workers use (DataLoader refuses them without workers)
_WORKER_KEYS = ("prefetch_factor", "persistent_workers", "multiprocessing_context")


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


def _direct(wrapped, keys: "_Keys | None") -> Iterator:
    """What an inner ``DataLoader(wrapped, batch_size=None, collate_fn=_identity, sampler=keys)`` with
    no workers and no pinning yields: ``wrapped[key]`` for each key `keys` yields (map-style), or
    ``wrapped``'s own items (an IterableDataset), in the rank's thread."""
    if keys is None:
        return iter(wrapped)
    return map(wrapped.__getitem__, keys)


class Source:
    """This rank's stream of ``(position, index, sample, measure)`` items for one epoch.

    Owns one inner DataLoader for the loader's lifetime (so persistent workers
    persist across epochs), or none without workers and pinning (`_direct`).  `start` begins an epoch; `next`
    returns the next raw item or None at the end; `remaining` lists the indices not yet pulled
    (map-style only).
    """

    def __init__(self, dataset, *, length_fn, num_workers: int, dataloader: Mapping = {}, shift_labels: bool = False,
                 worker_timeout_s: float = 0.0):
        """`dataloader`: the inner DataLoader's other keywords (``LoaderSettings.dataloader``), forwarded as is;
        the worker ones only with workers."""
        self.iterable = isinstance(dataset, IterableDataset)
        self._keys = None if self.iterable else _Keys()
        wrapped = (_IterFetch if self.iterable else _MapFetch)(dataset, length_fn, bool(shift_labels))
        extra = {k: v for k, v in dataloader.items() if num_workers > 0 or k not in _WORKER_KEYS}
        prefetch_factor = extra.get("prefetch_factor")
        pin_memory = bool(extra.get("pin_memory", False))
        kw = dict(batch_size=None, collate_fn=_identity, num_workers=num_workers, **extra)
        # keys the inner DataLoader may pull ahead of the items it has returned (its prefetch)
        self.ahead = num_workers * (2 if prefetch_factor is None else int(prefetch_factor))
        self._poll = num_workers > 0
        if self._poll:
            # `next` asks again after each timeout (POLL_S): a dead worker is seen within one step;
            # a hung one after worker_timeout_s; either becomes a local failure, and the table's
            # abort takes every rank out.
            kw["timeout"] = POLL_S
        if not self.iterable:
            kw["sampler"] = self._keys
        self._worker_timeout_s = worker_timeout_s if num_workers > 0 else 0.0
        # no workers, no pinning: the calls the DataLoader's single-process iterator makes, made here
        self._direct = wrapped if num_workers == 0 and not pin_memory else None
        self._loader = None if self._direct is not None else DataLoader(wrapped, **kw)
        self.stopping: Callable[[], bool] = lambda: False  # the engine's: this rank must stop
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
        self._it = iter(self._loader) if self._direct is None else _direct(self._direct, self._keys)

    def next(self):
        """The next raw item, or None at the end of the epoch.

        With workers the wait is asked in steps of `POLL_S`: a dead worker raises the
        DataLoader's RuntimeError within one step, `stopping` (set by the engine) turning true
        raises `Interrupted`, and a wait longer than the worker timeout raises SampleError (a
        hung worker).
        """
        stopping = self.stopping
        while self._it is not None:
            t0 = time.monotonic()
            while True:
                try:
                    item = next(self._it)
                    break
                except StopIteration:
                    self._it = None
                    return None
                except RuntimeError as e:
                    if not (self._poll and "DataLoader timed out" in str(e)):
                        raise
                    if stopping():
                        raise Interrupted() from None
                    waited = time.monotonic() - t0
                    if self._worker_timeout_s > 0 and waited >= self._worker_timeout_s:
                        raise SampleError(
                            f"no preprocessed sample arrived within timeout_s={self._worker_timeout_s:g} s (after "
                            f"{self._pulled} samples this epoch): a DataLoader worker hung or is slower than "
                            "that. Fix the preprocessing or raise timeout_s") from None
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

    @property
    def reserve_taken(self) -> int:
        """Dealt sharding: reserve positions this rank's reads took (posted in its header); 0 otherwise."""
        deal = self._keys.deal if self._keys is not None else None
        return 0 if deal is None else deal.reserve_taken

    def undealt(self) -> list:
        """Dealt sharding: the indices no rank was dealt (QUOTA's stop counts them once); [] otherwise."""
        deal = self._keys.deal if self._keys is not None else None
        return [] if deal is None else deal.undealt()

    def stop(self) -> None:
        """End the epoch's iterator (non-persistent workers exit here)."""
        self._it = None

    def close(self) -> None:
        self._it = None
        self._loader = None
