"""One epoch of dealt sharding on one rank: the epoch's global order of keys (`Keys`) and this rank's replica of the
`odb.batching.deal.Dealer` with the keys dealt to it, in the order its data source reads them (`DealtOrder`).
"""

from __future__ import annotations

from array import array
from collections import abc
from typing import Any, Callable, Sequence

import numpy as np

from .deal import Dealer

__all__ = ["Keys", "DealtOrder"]

class Keys(abc.Sequence):
    """An epoch's order of ``(position, index)`` keys held as two int sequences (`array` or `range`):
    indexing gives the pair.  What a dealt rank holds of the whole epoch: N ranks each hold every key,
    and one tuple per key (millions at cluster scale) is memory and a collector pass over all of them
    at every full collection (measured: ~100 ms pauses at 2M keys).  Immutable."""

    __slots__ = ("pos", "idx")

    def __init__(self, pos: Sequence[int], idx: Sequence[int]):
        if len(pos) != len(idx):
            raise ValueError(f"Keys got {len(pos)} positions and {len(idx)} indices")
        self.pos, self.idx = pos, idx

    @classmethod
    def of(cls, order: Sequence, skip=frozenset()) -> "Keys | list":
        """The keys ``(p, order[p])`` for every position p not in `skip`: compact when every index is an
        int (a sampler's usual indices), else a plain list of pairs."""
        pos = array("q", (p for p in range(len(order)) if p not in skip)) if skip else range(len(order))
        try:
            return cls(pos, array("q", (order[p] for p in pos)))
        except (TypeError, OverflowError):  # not plain ints: keep them as they came
            return [(p, order[p]) for p in pos]

    def __len__(self) -> int:
        return len(self.pos)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Keys(self.pos[i], self.idx[i])
        return self.pos[i], self.idx[i]

    def take(self, at: Sequence[int]) -> list[tuple[int, Any]]:
        """``[self[p] for p in at]``; a run of consecutive positions (a top-up's part) in one slice."""
        if isinstance(at, range) and at.step == 1 and 0 <= at.start <= at.stop <= len(self):
            return list(zip(self.pos[at.start:at.stop], self.idx[at.start:at.stop]))
        return [self[p] for p in at]


class DealtOrder:
    """One epoch of dealt sharding on one rank: the epoch's global order of keys still to emit
    (identical on every rank), this rank's replica of the `Dealer`, and the keys dealt to this
    rank in the order its data source reads them (`key`).

    `first` and `deal` apply a deal (every rank applies the same deals, from gathered numbers
    only) and return this rank's new keys.  `key(i)` answers the source's i-th read: a dealt
    key, else (while more may still be dealt) this rank's next reserve position, which it
    counts in `reserve_taken` and reports in its next header; else None.  A None while more
    could have been dealt makes the rank *dry* (`dry`): its source ends and the dealer deals
    it nothing more (module docstring).  Pure: no torch, no threads.

    Who touches it: it is built with its first deal at the pass start (`odb.runtime.epoch_pass.start_engine`,
    `odb.core.sim`); after that the rank's data source alone reads it (`key`, `keys`, `dry`, `reserve_taken`,
    `undealt`: the rank core asks the source, never the order) and the replicated decision alone advances it
    (`deal`, in `odb.core.replica.Replicated.decide`, which also posts its dealer's digest).
    """

    def __init__(self, keys: Sequence[tuple[int, Any]], world_size: int, rank: int, lead: int, stats=None,
                 shared_deals: dict | None = None):
        # a tuple or `Keys` is kept as it is: immutable, so many ranks in one process (a simulation) share one
        self.order, self.rank, self.stats = (keys if isinstance(keys, (tuple, Keys)) else list(keys)), rank, stats
        # many replicas in one process (`odb.core.sim`): the last deal, keyed by the dealer's whole state and
        # the deal's inputs, so N replicas in the same state compute it once (a deal is a pure function of both)
        self._shared = shared_deals
        self.dealer = Dealer(len(self.order), world_size, lead)
        self.keys: list[tuple[int, Any]] = []  # this rank's keys, as its source reads them
        self.reserve_taken = 0                 # reserve positions this rank took itself (in its headers)
        self.dry = False                       # a read found nothing while more could have been dealt

    @property
    def done(self) -> bool:
        """Every position of the order has been dealt or taken from a reserve."""
        return self.dealer.done

    def first(self) -> list[tuple[int, Any]]:
        """The first deal (before any cost is known): this rank's keys."""
        return self._mine(self._apply(self.dealer.start_parts, ()))

    def deal(self, taken: Sequence[int], cost: Sequence[int], dry: Sequence[int],
             reserve: Sequence[int], need: Sequence[int] | None = None) -> list[tuple[int, Any]]:
        """One round's deal from the gathered numbers (`Dealer.deal`): this rank's new keys."""
        return self._mine(self._apply(self.dealer.deal_parts, (taken, cost, dry, reserve, need)))

    def _apply(self, fn: Callable, args: tuple) -> list:
        if self._shared is None:
            return fn(*args)
        # the key as bytes (the state's, each input's as int64): compared in C, where tuples of ints were N^2 a round
        key = (fn.__name__, self.dealer.state_key(),
               tuple(None if a is None else np.asarray([int(v) for v in a] if not isinstance(a, np.ndarray) else a,
                                                       np.int64).tobytes() for a in args))
        hit = self._shared.get("deal")
        if hit is not None and hit[0] == key:
            self.dealer.restore(hit[1])
            return hit[2]
        parts = fn(*args)
        self._shared["deal"] = (key, self.dealer.snapshot(), parts)
        return parts

    def _mine(self, parts: Sequence[Sequence[int]]) -> list[tuple[int, Any]]:
        part = parts[self.rank]
        mine = self.order.take(part) if isinstance(self.order, Keys) else [self.order[p] for p in part]
        self.keys.extend(mine)
        if self.stats is not None:
            self.stats.dealt += len(mine)
        return mine

    def key(self, i: int) -> tuple[int, Any] | None:
        """The key of this rank's i-th read (reads come in order i = 0, 1, ...), or None: the end.
        Raises ValueError for a read past the next one (a reserve take would answer the wrong read)."""
        if i < len(self.keys):
            return self.keys[i]
        if i > len(self.keys):
            raise ValueError(f"read {i} of rank {self.rank}'s dealt keys before read {len(self.keys)}")
        if self.done or self.dry:
            return None
        p = self.dealer.reserve_position(self.rank, self.reserve_taken)
        if self.stats is not None:
            self.stats.reserve_taken += p is not None
            self.stats.ran_dry += p is None
        if p is None:
            self.dry = True
            return None
        self.reserve_taken += 1
        self.keys.append(self.order[p])
        return self.keys[-1]

    def undealt(self) -> list:
        """The dataset indices (second key items) not dealt to any rank yet."""
        return [self.order[p][1] for p in self.dealer.undealt()]
