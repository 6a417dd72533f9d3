"""Dynamic sharding: deal one global sample order to the ranks online, by measured cost.

Legend
    N        ranks; ``total`` positions ``0 .. total-1`` of the epoch's global order
    need_r   what rank r may take into its window before the next deal, from gathered values only
             (`odb.batching.intake.round_needs`): ``W - n_r + U_r(T) + ahead_r + 1``, n_r its window at the post, U_r(T)
             the samples in its T largest groups (posted as `odb.batching.intake.intake_ladder`), ahead_r its
             prefetch
    taken_r  positions rank r has pulled into its window so far; cost_r their summed measured cost
    pend_r   dealt to rank r and not yet taken; mu the mean measured cost per sample, all ranks
    est_r    rank r's expected total intake: ``cost_r + pend_r * mu``
    class r  the positions ``total - 1 - (N k + r)``: rank r's own reserve, counted from the end
    reserve_r positions of class r that rank r took itself (cumulative): its reserve takes

The rule, a function of gathered numbers only (every replica deals alike; `Dealer`):

* while more positions are left than the ranks need, every rank is topped up to ``pend_r = need_r``,
  so it never reads past what it was dealt unless it drops samples (None, empty, skipped oversize);
* otherwise (the end game) everything left is dealt at once, one position at a time to the rank with
  the lowest ``est_r`` (ties: the lower rank), which then grows by ``mu``, so the ranks' expected totals
  end level (`odb.batching.endgame`: `heap_order`; computed, with the same picks, when large: in closed form
  where that provably gives them, `level_order`, else as one sort, `fill_order`);
* a rank that reads past its dealt keys (drops; a policy over its bound) takes the next position of
  its own class from the end of the order, while it lies at or past the dealer's cursor (nobody was
  dealt it; classes are disjoint), and reports it in ``reserve_r``; every replica then skips it.  A
  rank whose class is used up too is *dry*: its source ends and it is dealt nothing more.  If every
  rank is dry, nothing is left: no position is ever lost or given twice.

Why: with fixed shards the epoch's steps are set by the costliest shard (a shard ceiling mean/max of
the shards' costs, e.g. 0.95 at 16 ranks with CV 1.0); dealing removes it without moving a sample
between ranks.  The lead and bound experiments: ``docs/decisions/2026-11-29-dealing.md``.

Where each part lives: the intake bound in `odb.batching.intake`, the end game's order in `odb.batching.endgame`,
the `Dealer` here, and a rank's replica of it with the keys dealt to it in `odb.batching.dealt_order`.  All pure
(no torch); the runtime and `odb.core.sim` drive the same objects.
"""

from __future__ import annotations

import zlib
from collections import abc
from typing import Callable, Sequence

import numpy as np

from .endgame import FAST_LEFT, Levels, fill_order, heap_order, level_order
from .intake import COST_SCALE

__all__ = ["Dealer"]

# From this many ranks on, a deal's per-rank checks and its top-up run as array operations (`Dealer._absorb`,
# `Dealer._top_up`); below it the Python loop over the ranks costs less than the arrays' setup.
_VECTOR_FROM = 64


class _Part(abc.Sequence):
    """One rank's part of an end-game deal: its positions as an int array, read as ints."""

    __slots__ = ("a",)

    def __init__(self, a: "np.ndarray"):
        self.a = a

    def __len__(self) -> int:
        return len(self.a)

    def __getitem__(self, i):
        return self.a[i].tolist()

    def __iter__(self):
        return iter(self.a.tolist())


class _Parts(abc.Sequence):
    """A deal's parts, rank r's made when read (`_part`); a replica reads only its own."""

    __slots__ = ()

    def __getitem__(self, r):
        if isinstance(r, slice):
            return [self[i] for i in range(*r.indices(len(self)))]
        if r < 0:
            r += len(self)
        if not 0 <= r < len(self):
            raise IndexError(r)
        return self._part(r)

    def _part(self, r: int) -> Sequence[int]:
        raise NotImplementedError


class _Free:
    """The free positions of an end game, in order: ``start, start + 1, ..., start + head - 1``, then ``tail`` (an
    int array); `at` reads some of them without making the rest (a replica reads its own few hundred)."""

    __slots__ = ("start", "head", "tail")

    def __init__(self, start: int, head: int, tail: "np.ndarray"):
        self.start, self.head, self.tail = start, head, tail

    def __len__(self) -> int:
        return self.head + len(self.tail)

    def at(self, i: "np.ndarray") -> "np.ndarray":
        out = self.start + i
        past = i >= self.head
        if past.any():
            out[past] = self.tail[i[past] - self.head]
        return out

    def array(self) -> "np.ndarray":
        return np.concatenate([np.arange(self.start, self.start + self.head, dtype=np.int64), self.tail])


class _EndParts(_Parts):
    """A large end game's parts (`Dealer._give_rest`, `Dealer._give_levels`): rank r's is the free positions at its
    picks, in order, as a `_Part` (an empty list if it has none).  A replica reads only its own: from the `Levels`
    where the dealer has them, else one mask over the picks.  Reading a second rank's (a simulation reads every
    rank's) sorts the picks by rank once; then the first rank's part, if the levels made it, must be the sort's
    (an AssertionError if not: the two would deal one position twice)."""

    __slots__ = ("free", "picks", "counts", "levels", "_first", "_by_rank", "_starts")

    def __init__(self, free: _Free, picks: "np.ndarray | Callable[[], Sequence[int]]", counts: "np.ndarray",
                 levels: "tuple[Levels, np.ndarray] | None" = None):
        self.free, self.picks, self.counts, self.levels = free, picks, counts, levels
        self._first: tuple | None = None  # the first rank read, and its part
        self._by_rank: "np.ndarray | None" = None
        self._starts: "np.ndarray | None" = None

    def __len__(self) -> int:
        return len(self.counts)

    def _part(self, r: int) -> Sequence[int]:
        c = int(self.counts[r])
        if not c:
            return []
        if self._first is None:
            if self.levels is not None:
                lv, live = self.levels
                self._first = (r, self.free.at(lv.picks_of(int(np.searchsorted(live, r)))))
            else:
                self._first = (r, self.free.array()[self.picks == r])
        if self._first[0] == r:
            return _Part(self._first[1])
        if self._by_rank is None:  # each rank's positions, ascending: a stable sort keeps the pick order
            if callable(self.picks):
                self.picks = np.asarray(self.picks(), dtype=np.int64)
            w = len(self.counts)
            key = self.picks.astype(np.uint16 if w <= 1 << 16 else np.int64)
            self._by_rank = self.free.array()[np.argsort(key, kind="stable")]
            self._starts = np.cumsum(self.counts) - self.counts
            if self._first is not None and not np.array_equal(self._slice(self._first[0]), self._first[1]):
                raise AssertionError(f"the end game's levels and its sort give rank {self._first[0]} different parts")
        return _Part(self._slice(r))

    def _slice(self, r: int) -> "np.ndarray":
        a = int(self._starts[r])
        return self._by_rank[a:a + int(self.counts[r])]


class _TopUp(_Parts):
    """A top-up deal's parts (`Dealer._top_up`): rank r's is ``range(starts[r], ends[r])`` unless it is
    closed (an empty list)."""

    __slots__ = ("starts", "ends", "closed")

    def __init__(self, starts: "np.ndarray", ends: "np.ndarray", closed: "np.ndarray"):
        self.starts, self.ends, self.closed = starts, ends, closed

    def __len__(self) -> int:
        return len(self.starts)

    def _part(self, r: int) -> Sequence[int]:
        return [] if self.closed[r] else range(int(self.starts[r]), int(self.ends[r]))


def _ints(v: Sequence[int]) -> "np.ndarray":
    """`v` (a gathered column, a list) as an int64 array: a column already one is taken as it is."""
    a = np.asarray(v)
    if a.dtype != np.int64:
        a = np.array([int(x) for x in v], np.int64) if a.dtype.kind not in "iub" else a.astype(np.int64)
    return a.reshape(-1)


class Dealer:
    """Deals positions ``0 .. total-1`` to ``world`` ranks; identical on every rank given identical inputs.
    Its per-rank state (``dealt``, ``reserve``, ``closed``) is held as arrays: a deal reads the gathered
    columns as they come, with no list of N Python ints made and unmade a round."""

    def __init__(self, total: int, world: int, lead: int):
        if total < 0 or world < 1 or lead < 1:
            raise ValueError(f"Dealer needs total >= 0, world >= 1, lead >= 1 (got {total}, {world}, {lead})")
        self.total, self.world, self.lead = int(total), int(world), int(lead)
        self.cursor = 0                               # every position before it is dealt or taken from a reserve
        self.dealt = np.zeros(self.world, np.int64)   # positions given to each rank so far (reserve takes included)
        self.reserve = np.zeros(self.world, np.int64)  # reserve positions each rank took itself (as gathered)
        self.closed = np.zeros(self.world, bool)       # the rank ran dry: deal it nothing more
        self.rounds = 0
        self._vector = self.world >= _VECTOR_FROM      # checks and top-ups as array operations (same results)

    # the per-rank state: arrays, however it is set (a state loaded, a test's)
    dealt = property(lambda self: self._dealt, lambda self, v: setattr(self, "_dealt", _ints(v).copy()))
    reserve = property(lambda self: self._reserve, lambda self, v: setattr(self, "_reserve", _ints(v).copy()))
    closed = property(lambda self: self._closed,
                      lambda self, v: setattr(self, "_closed", np.array(v, bool).reshape(-1)))

    # -- positions ---------------------------------------------------------------
    def _reserved_at(self, p: int) -> bool:
        k = self.total - 1 - p
        return k // self.world < self.reserve[k % self.world]

    def _skip(self) -> None:
        while self.cursor < self.total and self._reserved_at(self.cursor):
            self.cursor += 1

    @property
    def left(self) -> int:
        """Positions neither dealt nor taken from a reserve."""
        if not self.reserve.any():  # no reserve take (the common case)
            return self.total - self.cursor
        span = self.total - 1 - self.cursor  # class positions at or past the cursor: N k + r <= span
        r = np.arange(min(self.world, max(span + 1, 0)), dtype=np.int64)  # the classes with one (span >= r)
        taken_back = int(np.minimum(self.reserve[:len(r)], (span - r) // self.world + 1).sum())
        return self.total - self.cursor - taken_back

    def undealt(self) -> list[int]:
        """The positions neither dealt nor taken from a reserve, in order."""
        return [p for p in range(self.cursor, self.total) if not self._reserved_at(p)]

    def undealt_array(self) -> "np.ndarray":
        """`undealt` as an int64 array, without a Python step per position (`_undealt`)."""
        return self._undealt().array()

    def _undealt(self) -> "_Free":
        """`undealt` as a `_Free`: reserve takes lie only in the last ``N max(reserve)`` positions (class
        positions counted from the end), so every position from the cursor to that tail is free."""
        w, t = self.world, self.total
        tail = max(self.cursor, t - w * int(self.reserve.max(initial=0)))
        k = t - 1 - np.arange(tail, t, dtype=np.int64)  # the tail's class offsets
        keep = k // w >= self.reserve[k % w]
        return _Free(self.cursor, tail - self.cursor, np.arange(tail, t, dtype=np.int64)[keep])

    @property
    def done(self) -> bool:
        """Every position has been dealt or taken from a reserve."""
        return self.left == 0

    def reserve_position(self, rank: int, k: int) -> int | None:
        """The position of rank `rank`'s k-th reserve take (its class, from the end), or None if that
        one was already dealt (it lies before the cursor): the rank is then dry."""
        p = self.total - 1 - (self.world * k + rank)
        return p if p >= self.cursor else None

    # -- deals ---------------------------------------------------------------------
    def start(self) -> list[list[int]]:
        """The first deal, before any cost is known: ``lead`` each, round robin (fewer if short):
        position p goes to rank ``p mod N`` while ``p < min(total, N * lead)``."""
        return [list(p) for p in self.start_parts()]

    def start_parts(self) -> list[range]:
        """`start`, each rank's part as a range (a replica reads only its own: N ranges, not N * lead ints)."""
        limit = min(self.total, self.world * self.lead)  # no reserve is taken before the first deal
        out = [range(r, limit, self.world) for r in range(self.world)]
        self.dealt += np.fromiter(map(len, out), np.int64, self.world)
        self.cursor = limit
        return out

    def deal(self, taken: Sequence[int], cost: Sequence[int], dry: Sequence[int] | None = None,
             reserve: Sequence[int] | None = None, need: Sequence[int] | None = None) -> list[list[int]]:
        """One round's deal from the gathered ``taken`` counts, ``cost`` sums (ints, `COST_SCALE`),
        ``dry`` flags (a rank whose source ended early gets nothing more, ever), ``reserve``
        counts (cumulative) and ``need`` (per rank, the most it takes before the next deal,
        ``need_r``; None: ``lead`` for every rank; module docstring)."""
        return [list(p) for p in self.deal_parts(taken, cost, dry, reserve, need)]

    def deal_parts(self, taken: Sequence[int], cost: Sequence[int], dry: Sequence[int] | None = None,
                   reserve: Sequence[int] | None = None, need: Sequence[int] | None = None) -> list[Sequence[int]]:
        """`deal`, a contiguous part as a range, a large end game's parts as int arrays read as ints (a
        replica reads only its own part)."""
        w = self.world
        dry = np.zeros(w, np.int64) if dry is None else _ints(dry)
        reserve = self.reserve if reserve is None else _ints(reserve)
        need = np.full(w, self.lead, np.int64) if need is None else _ints(need)
        taken = _ints(taken)
        if not len(taken) == len(cost) == len(dry) == len(reserve) == len(need) == w:
            raise ValueError(f"deal needs {w} taken, cost, dry, reserve and need values, got "
                             f"{len(taken)}, {len(cost)}, {len(dry)}, {len(reserve)} and {len(need)}")
        if (need < 0).any():
            raise ValueError(f"deal got a negative need {need.tolist()}")
        vector = self._vector
        if not (vector and self._absorb(taken, dry, reserve)):  # from 64 ranks on as arrays; bad inputs raise here
            for r in range(w):
                if reserve[r] < self.reserve[r]:
                    raise ValueError(f"rank {r} reports {reserve[r]} reserve takes after {self.reserve[r]}")
                self.dealt[r] += reserve[r] - self.reserve[r]
                if not 0 <= taken[r] <= self.dealt[r]:
                    raise ValueError(f"rank {r} reports {taken[r]} taken of {self.dealt[r]} given")
                if dry[r]:
                    self.closed[r] = True
        self.reserve = reserve  # copied by the setter: the gathered column is the transport's buffer
        self._skip()
        self.rounds += 1
        left = self.left
        if left == 0 or self.closed.all():
            return [[] for _ in range(w)]
        if vector:  # the top-up below, as array operations, when no reserve take lies in its way
            top_a = np.maximum(0, need - self.dealt + taken)
            top_a[self.closed] = 0
            k = int(top_a.sum())
            if left > k and self.cursor + k <= self._first_reserved():
                return self._top_up(top_a)
            if left <= k and left >= FAST_LEFT:  # the end game, without the lists below
                return self._end_game(taken, _ints(cost), left)
        live = np.flatnonzero(~self.closed).tolist()
        out: list = [[] for _ in range(w)]
        pend = (self.dealt - taken).tolist()
        need_l = need.tolist()
        top = {r: max(0, need_l[r] - pend[r]) for r in live}
        if left > sum(top.values()):
            free_below = self._first_reserved()
            for r in live:
                out[r] = self._give_many(r, top[r], free_below)
            return out
        if left >= FAST_LEFT:
            return self._end_game(taken, _ints(cost), left)
        n_taken = int(taken.sum())
        cost = [int(v) for v in cost]
        mu = sum(cost) / n_taken if n_taken else float(COST_SCALE)
        return self._give_rest(heap_order([cost[r] + pend[r] * mu for r in live], live, mu, left), out)

    def _end_game(self, taken: "np.ndarray", cost: "np.ndarray", left: int) -> "_EndParts":
        """`deal_parts`'s end game past `FAST_LEFT` positions, its estimates as array operations: the heap's
        ``cost[r] + pend[r] * mu``, the same float operations element by element; the picks from `level_order`
        where it answers, else from `fill_order`."""
        live = np.flatnonzero(~self.closed)
        n_taken = int(taken.sum())
        mu = sum(cost.tolist()) / n_taken if n_taken else float(COST_SCALE)  # exact int sum, one rounding
        est = cost[live].astype(np.float64) + (self.dealt - taken)[live].astype(np.float64) * mu
        levels = level_order(est, mu, left)
        live_l = live.tolist()
        if levels is not None:
            return self._give_levels(levels, live, lambda: fill_order(est.tolist(), live_l, mu, left))
        return self._give_rest(fill_order(est.tolist(), live_l, mu, left), [[] for _ in range(self.world)])

    def _absorb(self, taken: Sequence[int], dry: Sequence[int], reserve: Sequence[int]) -> bool:
        """`deal_parts`'s per-rank checks and updates (the reserve takes given, the takes within what was
        given, the dry ranks closed) as array operations; False, and nothing updated, if some rank's input
        is at fault (the loop then raises its error)."""
        res, prev, tk = reserve, self.reserve, taken
        dealt = self.dealt + (res - prev)
        if ((res < prev) | (tk < 0) | (tk > dealt)).any():
            return False
        self.dealt = dealt
        self.closed |= dry != 0
        return True

    def _top_up(self, top: "np.ndarray") -> "_TopUp":
        """`deal_parts`'s top-up when no reserve take lies in its way: each live rank, in rank order, gets the
        next ``top[r]`` positions (what `_give_many` gives rank by rank; ``top`` 0 for the closed ones), as
        ranges made when read (a replica reads only its own)."""
        ends = self.cursor + np.cumsum(top)
        self.dealt = self.dealt + top
        self.cursor = int(ends[-1])
        self._skip()
        return _TopUp(ends - top, ends, self.closed.copy())

    def _give_rest(self, picks: Sequence[int], out: list) -> list:
        """Every position neither dealt nor reserved, in order, the i-th to rank ``picks[i]`` (``len(picks)`` is
        `left`); `out` the parts to fill (empty lists)."""
        if len(picks) < FAST_LEFT:
            for r in picks:
                out[r].append(self._give(r))
            return out
        free = self._undealt()
        if len(free) != len(picks):
            raise AssertionError(f"the end game picked {len(picks)} of {len(free)} free positions")
        rk = np.asarray(picks, dtype=np.int64)
        counts = np.bincount(rk, minlength=self.world)
        self.dealt += counts
        self.cursor = self.total  # what the gives would leave: past the last free position and every reserved one
        return _EndParts(free, rk, counts)

    def _give_levels(self, levels: Levels, live: Sequence[int], picks: Callable[[], Sequence[int]]) -> "_EndParts":
        """`_give_rest` of the picks `levels` gives (`level_order`), each rank's part made when read; ``picks``
        sorts them, for a second rank's read."""
        counts = np.zeros(self.world, np.int64)
        counts[live] = levels.counts
        free = self._undealt()
        if len(free) != levels.left or int(counts.sum()) != len(free):
            raise AssertionError(f"the end game picked {int(counts.sum())} of {len(free)} free positions")
        self.dealt += counts
        self.cursor = self.total
        return _EndParts(free, picks, counts, (levels, np.asarray(live, dtype=np.int64)))

    def _first_reserved(self) -> int:
        """The lowest position some rank took from its reserve (``total`` if none): every position
        below it that is at or past the cursor is free."""
        w, t = self.world, self.total
        r = np.flatnonzero(self.reserve)
        if not len(r):
            return t
        return int((t - 1 - (w * (self.reserve[r] - 1) + r)).min())

    def _give_many(self, r: int, k: int, free_below: int) -> range | list[int]:
        if self.cursor + k <= free_below:  # no reserve take in the way: the next k positions in one piece
            out = range(self.cursor, self.cursor + k)
            self.cursor += k
            self.dealt[r] += k
            self._skip()
            return out
        return [self._give(r) for _ in range(k)]

    def _give(self, r: int) -> int:
        p = self.cursor
        self.cursor += 1
        self.dealt[r] += 1
        self._skip()
        return p

    def state_dict(self) -> dict:
        return {"total": self.total, "world": self.world, "lead": self.lead, "cursor": self.cursor,
                "dealt": self.dealt.tolist(), "reserve": self.reserve.tolist(), "closed": self.closed.tolist(),
                "rounds": self.rounds}

    def digest(self) -> int:
        """A CRC-32 of the whole state (what a replica posts, `odb.core.replica`): its arrays' bytes, not their
        repr, so O(N) in C (the repr was N^2 a round for a simulation of N ranks)."""
        crc = zlib.crc32(np.array([self.total, self.world, self.lead, self.cursor, self.rounds], np.int64).tobytes())
        for a in (self.dealt, self.reserve, self.closed):
            crc = zlib.crc32(np.ascontiguousarray(a).tobytes(), crc)
        return crc

    def state_key(self) -> bytes:
        """The whole state as bytes: equal for two dealers exactly when their states are (a memo's key, O(N) in C)."""
        head = np.array([self.total, self.world, self.lead, self.cursor, self.rounds], np.int64).tobytes()
        return b"".join((head, *(np.ascontiguousarray(a).tobytes() for a in (self.dealt, self.reserve, self.closed))))

    def snapshot(self) -> tuple:
        """The state `restore` sets again (its own copies of the arrays)."""
        return self.lead, self.cursor, self.rounds, self.dealt.copy(), self.reserve.copy(), self.closed.copy()

    def restore(self, snap: tuple) -> None:
        """The state of a `snapshot` of a dealer of the same total and world."""
        self.lead, self.cursor, self.rounds = snap[:3]
        self.dealt, self.reserve, self.closed = (a.copy() for a in snap[3:])

    def load_state_dict(self, state: dict) -> None:
        if (state["total"], state["world"]) != (self.total, self.world):
            raise ValueError(f"dealer state is for total={state['total']} world={state['world']}, "
                             f"not total={self.total} world={self.world}")
        self.lead, self.cursor, self.rounds = int(state["lead"]), int(state["cursor"]), int(state["rounds"])
        self.dealt = np.array([int(v) for v in state["dealt"]], np.int64).reshape(self.world)
        self.reserve = np.array([int(v) for v in state["reserve"]], np.int64).reshape(self.world)
        self.closed = np.array([bool(v) for v in state["closed"]], bool).reshape(self.world)
