"""Dynamic sharding: deal one global sample order to the ranks online, by measured cost.

Legend
    N        ranks; ``total`` positions ``0 .. total-1`` of the epoch's global order
    need_r   what rank r may take into its window before the next deal, from gathered values only
             (`round_needs`): ``W - n_r + U_r(T) + ahead_r + 1``, n_r its window at the post, U_r(T)
             the samples in its T largest groups (posted as `intake_ladder`), ahead_r its prefetch
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
  end level (`heap_order`; computed, with the same picks, when large: in closed form where that provably
  gives them, `level_order`, else as one sort, `fill_order`);
* a rank that reads past its dealt keys (drops; a policy over its bound) takes the next position of
  its own class from the end of the order, while it lies at or past the dealer's cursor (nobody was
  dealt it; classes are disjoint), and reports it in ``reserve_r``; every replica then skips it.  A
  rank whose class is used up too is *dry*: its source ends and it is dealt nothing more.  If every
  rank is dry, nothing is left: no position is ever lost or given twice.

Why: with fixed shards the epoch's steps are set by the costliest shard (a shard ceiling mean/max of
the shards' costs, e.g. 0.95 at 16 ranks with CV 1.0); dealing removes it without moving a sample
between ranks.  The lead and bound experiments: ``docs/decisions/2026-11-29-dealing.md``.  `Dealer`
and `DealtOrder` are pure (no torch); the runtime and `odb.core.sim` drive the same objects.
"""

from __future__ import annotations

import heapq
import math
import zlib
from array import array
from bisect import bisect_left
from collections import abc
from functools import lru_cache
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .base import CostModel, Sizes
from .cost import BudgetCost
from .grouping import Group

__all__ = ["Dealer", "DealtOrder", "Keys", "COST_SCALE", "sample_cost", "sample_fits", "intake_ladder", "intake_sizes",
           "intake_bound", "policy_intake", "first_lead", "round_needs", "Posted", "heap_order", "fill_order",
           "level_order", "Levels"]

COST_SCALE = 1_000_000  # per-sample costs travel in headers as ints: round(cost * COST_SCALE)


def sample_cost(cost: CostModel) -> Callable[[Sizes], int]:
    """``sizes -> round(cost.utilisation([sizes]) * COST_SCALE)``: one sample's cost as the header
    carries it; for a one-resource padded or packed cost, the same without the generic call."""
    if isinstance(cost, BudgetCost) and len(cost.resources) == 1 and cost.resources[0].kind != "quadratic":
        r = cost.resources[0]
        i, k = r.index, COST_SCALE / r.budget
        return lambda s: round((s[i] if i < len(s) else 0) * k)
    return lambda s: round(cost.utilisation([s]) * COST_SCALE)


def sample_fits(cost: CostModel) -> Callable[[Sizes], bool]:
    """``sizes -> cost.fits([sizes])``: one sample within the budget; for a one-resource padded or packed cost, the
    same without the generic call (a sample alone costs its own size of the resource)."""
    if isinstance(cost, BudgetCost) and len(cost.resources) == 1 and cost.resources[0].kind != "quadratic":
        r = cost.resources[0]
        i, budget = r.index, r.budget
        return lambda s: (s[i] if i < len(s) else 0) <= budget
    return lambda s: cost.fits([s])


@lru_cache(maxsize=64)
def intake_ladder(window: int) -> tuple[int, ...]:
    """The targets T at which a rank posts ``U(T)`` (module docstring): 1, 2, 3, 4, 6, 8, 12, ...
    (each at most 1.5x the one before), ending with ``window``, the largest target the table allows."""
    out, v = [], 1
    while v < window:
        out.append(v)
        v = v + 1 if v < 2 else (v * 3) // 2 if v & (v - 1) == 0 else (v * 4) // 3
    out.append(max(1, int(window)))
    return tuple(out)


def intake_sizes(groups: Sequence[Group], window: int) -> list[int]:
    """``U(T)`` for every T of `intake_ladder` (window): the samples in the T largest `groups`."""
    sizes = sorted((len(g.positions) for g in groups), reverse=True)
    out, acc, k = [], 0, 0
    for t in intake_ladder(window):
        while k < min(t, len(sizes)):
            acc += sizes[k]
            k += 1
        out.append(acc)
    return out


def policy_intake(policy, window: Sequence[Sizes], cost: CostModel, W: int) -> list[int]:
    """What a rank posts for the bound: `intake_sizes` of ``policy.groups(window, cost)`` (its
    ``partition`` emits whole groups among them, or the whole window when asked for more:
    `BalancedPolicy`), or when that is None (`AlignmentPolicy.groups`' default) the window size at
    every T (no bound below the whole window: the dealer then tops the rank up to ``W``)."""
    groups = policy.groups(window, cost)
    if groups is None:
        return [len(window)] * len(intake_ladder(W))
    return intake_sizes(groups, W)


def intake_bound(window: int, n, ladder, target: int):
    """Positions a rank with `n` samples in its window (at the post) and `ladder` (its posted
    `intake_sizes`) takes into its window before the next deal, when the round's target is
    `target` and its policy emits whole groups of `grouping.pack`: ``W - n + U(T)`` with T
    rounded up the ladder.  Prefetch comes on top.  Every rank at once: `n` an int array and
    `ladder` a 2-D int array (a row per rank) give an int array."""
    lad = intake_ladder(window)
    j = min(bisect_left(lad, target), len(lad) - 1)  # T rounded up the (increasing) ladder
    u = ladder[:, j] if isinstance(ladder, np.ndarray) and ladder.ndim == 2 else int(ladder[j])
    out = np.maximum(0, int(window) - n) + u
    return out if isinstance(out, np.ndarray) else int(out)


def first_lead(window: int, aheads: Sequence[int]) -> int:
    """The first deal's lead, the same on every rank: the window, the largest prefetch any rank
    posted (``aheads``: each rank's inner-DataLoader prefetch, gathered), and one (a margin: the
    exhaustive dealt model, ``models/dealt.py``, finds no property that needs it; it absorbs a
    policy that emits one sample more than its posted bound)."""
    return int(window) + max(map(int, aheads), default=0) + 1


class Posted(NamedTuple):
    """What the ranks posted for the intake bound, as columns: each rank's window size ``n`` at the post
    and its intake ladder (a row per rank)."""

    n: Sequence[int]
    intake: Sequence[Sequence[int]]


def round_needs(window: int, target: int, posted: "Posted | Sequence[tuple[int, Sequence[int]]]",
                aheads: Sequence[int], *, as_array: bool = False) -> "list[int] | np.ndarray":
    """Each rank's need for one round's deal, from gathered values only: its `intake_bound` (its
    posted window size ``n`` and intake ladder, the round's target) plus its gathered prefetch
    (what its inner DataLoader may read ahead of its window before the next deal) and one (the
    margin of `first_lead`).  `posted`: each rank's ``(n, ladder)``, or `Posted` columns.
    ``as_array``: an int64 array (what `Dealer.deal_parts` reads), not a list."""
    if not isinstance(posted, Posted):
        posted = Posted([n for n, _ in posted], [list(lad) for _, lad in posted])
    n = np.asarray(posted.n, dtype=np.int64)
    if len(n) != len(aheads):
        raise ValueError(f"round_needs got {len(n)} posted headers and {len(aheads)} prefetch values")
    if not len(n):
        return np.zeros(0, np.int64) if as_array else []
    ladder = np.asarray(posted.intake, dtype=np.int64).reshape(len(n), -1)
    need = intake_bound(window, n, ladder, target) + np.asarray(aheads, dtype=np.int64) + 1
    return need if as_array else need.tolist()


# From this many ranks on, a deal's per-rank checks and its top-up run as array operations (`Dealer._absorb`,
# `Dealer._top_up`); below it the Python loop over the ranks costs less than the arrays' setup.
_VECTOR_FROM = 64

# From this many positions on, the end game is computed as one sort (`fill_order`, `Dealer._give_rest`); below it
# a Python step per position costs less than the arrays' setup.
_FAST_LEFT = 2048


def heap_order(start: Sequence[float], ranks: Sequence[int], mu: float, left: int) -> list[int]:
    """The end game's rule (module docstring) as written: `left` picks, each the rank with the lowest
    ``(estimate, rank)``, whose estimate then grows by `mu` (a float addition); ``start`` the ranks'
    estimates, in the order of ``ranks``."""
    heap = list(zip(start, ranks))
    heapq.heapify(heap)
    out, replace = [], heapq.heapreplace
    for _ in range(left):
        est, r = heap[0]
        out.append(r)
        replace(heap, (est + mu, r))  # pop the cheapest, push it back one sample costlier
    return out


def fill_order(start: Sequence[float], ranks: Sequence[int], mu: float, left: int,
               fast_from: int = _FAST_LEFT, margins: Sequence[int] = (2, 64)) -> "list[int] | np.ndarray":
    """`heap_order`'s picks, the same in the same order, as one sort once `left` reaches `fast_from`.

    Rank r's estimates ``s_r, s_r + mu, (s_r + mu) + mu, ...`` never decrease, so the heap pops the
    `left` least ``(estimate, rank, k)`` of all the ranks' sequences in that order.  Each sequence is
    generated by the same float additions (`numpy.add.accumulate` adds in sequence) a margin past the
    water level (the continuous level at which the ranks below it take `left` in all).  The result
    stands only if no rank's picks reach the end of what was generated for it (then nothing missing
    could sort before a pick); else the margin widens (`margins`, past the level), and then the heap decides.  ``ranks``
    ascending (`Dealer.deal_parts` passes its live ranks)."""
    if left < max(fast_from, 1) or not 0.0 < mu < math.inf or not all(map(math.isfinite, start)) \
            or any(a >= b for a, b in zip(ranks, ranks[1:])):
        return heap_order(start, ranks, mu, left)
    v0 = np.asarray(start, dtype=np.float64)
    n = len(v0)
    low = np.sort(v0)
    levels = (left * mu + np.cumsum(low)) / np.arange(1, n + 1)  # the level if the m lowest ranks take all
    level = levels[np.flatnonzero(levels >= low)[-1]]             # the most ranks still below their level
    base = np.ceil(np.maximum(level - v0, 0.0) / mu).astype(np.int64)
    for margin in margins:
        c = np.maximum(base + margin, 1)  # at least each start: a rank above the level is compared too
        K = int(c.max())
        if n * K <= 4 * int(c.sum()):  # about level: one (n, K) block, each rank's row accumulated along it
            est = np.full((n, K), mu)
            est[:, 0] = v0
            np.add.accumulate(est, axis=1, out=est)
            v = est[np.arange(K)[None, :] < c[:, None]]        # rank-major: rank, then k
        else:
            v = np.concatenate([np.add.accumulate(np.concatenate(([x], np.full(k - 1, mu)))) for x, k in zip(v0, c)])
        who = np.repeat(np.arange(n), c)
        # stable: equal estimates by rank, then k (the rank-major order), as the heap breaks ties; and the merge
        # of the ranks' sorted runs is faster than a quicksort (3.6 against 8.6 ms for 1,024 runs of 220)
        order = np.argsort(v, kind="stable")
        picked = who[order[:left]]
        if (np.bincount(picked, minlength=n) < c).all():
            return np.asarray(ranks, dtype=np.int64)[picked]
    return heap_order(start, ranks, mu, left)


class Levels:
    """The end game's picks in closed form (`level_order`), where they provably are `heap_order`'s.

    With the start estimates written ``s_r = s_0 + a_r mu + ph_r`` (``s_0`` the least, ``a_r`` a whole number of
    steps, ``0 <= ph_r < mu`` the phase), rank r's k-th estimate lies on level ``a_r + k``, and the picks run level
    by level, each level's ranks in the order ``(ph_r, r)``.  ``counts`` (per entry of ``start``) and `picks_of`
    (the indices into the pick sequence of one entry's picks, ascending) read that order without building it:
    O(N log N) for the levels and the counts, O(N + c) for one rank's picks, where the sort takes O(left log N)."""

    __slots__ = ("a", "order", "where", "sorted_a", "pre", "counts", "left")

    def __init__(self, a: "np.ndarray", order: "np.ndarray", level: int, left: int, sorted_a: "np.ndarray",
                 pre: "np.ndarray"):
        self.a, self.order, self.left, self.sorted_a, self.pre = a, order, left, sorted_a, pre
        self.where = np.empty(len(a), np.int64)
        self.where[order] = np.arange(len(a))                    # each entry's place in the (ph, r) order
        counts = np.maximum(level - a, 0)                        # whole levels below the last one
        at = order[a[order] <= level]                            # the last level's ranks, in (ph, r) order
        counts[at[:left - self._below(level)]] += 1
        self.counts = counts

    def _below(self, level):
        """Picks on the levels below `level` (an int or an int array): ``sum_r max(0, level - a_r)``."""
        c = np.searchsorted(self.sorted_a, level, "left")
        return c * level - self.pre[c]

    def picks_of(self, i: int) -> "np.ndarray":
        """The places of entry i's picks in the pick sequence, ascending (its k-th on level ``a_i + k``, after the
        levels below and the ranks before it in ``(ph, r)`` order on its own level)."""
        levels = self.a[i] + np.arange(int(self.counts[i]), dtype=np.int64)
        before = np.sort(self.a[self.order[:self.where[i]]])
        return self._below(levels) + np.searchsorted(before, levels, "right")


_U = 2.0 ** -53  # the unit roundoff of a float64 addition or product (round to nearest)


def _distinct(v: "np.ndarray") -> "np.ndarray":
    """``np.unique(v)`` of a float array: its distinct values, ascending.  Not ``np.unique`` itself: numpy 2.4's
    imports ``numpy.ma`` on its first call (12-22 ms measured), which stalled the first end-game deal of a
    process in the middle of its epoch."""
    s = np.sort(v)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if len(s) else s


def level_order(start: Sequence[float], mu: float, left: int) -> "Levels | None":
    """`heap_order`'s picks as `Levels`, for ranks in ascending order, or None where the levels cannot be
    trusted (then the sort or the heap decides).

    The heap compares float estimates ``v_rk``, each ``v_r(k-1) + mu`` rounded, so ``|v_rk - (s_r + k mu)|
    <= k u V`` (u the unit roundoff; V bounds every estimate compared, up to the level after the last pick).  Two
    ranks with the same start have the same floats: the heap breaks their ties by rank, as the levels do.  Any two
    other estimates lie at least the least gap between distinct phases (the wrap past ``mu`` included) apart, as
    reals; the phases are computed within ``3 u V``.  So the levels' order is the floats' wherever each such gap
    exceeds ``M = (4 K + 16) u V`` (K the most steps a rank takes), which is checked here: two distinct starts whose
    phases come closer (a start ``j mu`` above another, say) return None, and so does a step ``mu <= M`` (the wrap
    gap is at most ``mu``), where ``v + mu`` may round to ``v``."""
    v0 = np.asarray(start, dtype=np.float64)
    n = len(v0)
    if n == 0 or left < 1 or not 0.0 < mu < math.inf or not np.isfinite(v0).all():
        return None
    s0 = v0.min()
    x = v0 - s0
    a = np.floor(x / mu)
    ph = x - a * mu
    if a.max() > 2 ** 52:
        return None
    a = a.astype(np.int64)
    lo, hi = 0, left + 1  # the last level: the most L with sum_r max(0, L - a_r) <= left (a_r >= 0, one at 0)
    sorted_a = np.sort(a)
    pre = np.concatenate(([0], np.cumsum(sorted_a)))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        c = int(np.searchsorted(sorted_a, mid, "left"))
        lo, hi = (mid, hi) if c * mid - int(pre[c]) <= left else (lo, mid)
    steps = lo + 2                                   # a rank's estimates compared: up to the level after the last
    bound = 2 * float(np.abs(v0).max()) + (steps + 2) * mu
    gap = (4 * steps + 16) * _U * bound
    q = _distinct(ph)                                # one phase per distinct start (equal starts: equal phases)
    if len(_distinct(v0)) != len(q) or q[0] != 0.0 or q[0] + mu - q[-1] < gap or (np.diff(q) < gap).any():
        return None
    return Levels(a, np.argsort(ph, kind="stable"), lo, left, sorted_a, pre)


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
            if left <= k and left >= _FAST_LEFT:  # the end game, without the lists below
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
        if left >= _FAST_LEFT:
            return self._end_game(taken, _ints(cost), left)
        n_taken = int(taken.sum())
        cost = [int(v) for v in cost]
        mu = sum(cost) / n_taken if n_taken else float(COST_SCALE)
        return self._give_rest(heap_order([cost[r] + pend[r] * mu for r in live], live, mu, left), out)

    def _end_game(self, taken: "np.ndarray", cost: "np.ndarray", left: int) -> "_EndParts":
        """`deal_parts`'s end game past `_FAST_LEFT` positions, its estimates as array operations: the heap's
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
        if len(picks) < _FAST_LEFT:
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
