"""The default cross-rank alignment policy: full groups, a common minimum target, a shared cost profile.

Legend
    n_r     rank r's window size this round (carry included); L the ranks with data (n_r > 0)
    f_r     closed (full) groups rank r can form from its window (`grouping.pack`); c_r all its groups
    x_r     rank r's data source is exhausted
    o_r     rank r's lone over-budget samples; e_r the over-budget slots it fills with its own (`over_slots`)
    u       a group's fill (rule 0); h_r[b] rank r's closed groups whose fill falls in bucket b
            (`fill_bucket`: 0.025 wide from 0.5 to 1)
    a       the policy's ``attention``: the weight of a token's attention work against its linear work,
            per token of context (`attention_coefficient`; default ``QUADRATIC_B`` = 1/24576)
    T       the round's target: batches per rank

The rule, a function of the gathered summaries only (every rank computes the same target):

0. The fill: a group's cost over the budget (`CostModel.utilisation`), except under a one-resource
   padded or packed budget B, where each sample of L tokens weighs ``L (1 + a L)`` (padded: each padded
   to the group's longest, ``n Lmax (1 + a Lmax)``) and the fill is the group's weight over
   ``B (1 + a B)`` (`aligned_fill`).  A group within budget then has a fill of at most 1, a lone
   over-budget sample more than 1, as with the plain fill (``a = 0`` gives the plain fill exactly).

1. The need: once every rank with data is exhausted (the epoch's last round) ``max over them of
   c_r``: one round flushes every window, and a rank with fewer groups splits its costliest ones
   (rule 5); once some rank is exhausted, ``max(1, min over ranks with data of (c_r if x_r else
   f_r))``; else ``max(1, min of (f_r - o_r + e_r))`` (`_fillable`): every rank emits full groups
   while it has them; a surplus is carried, never dropped; no sample is peeled.
2. The over-budget quorum: a round opens with over-budget slots, costliest level first; a level gets
   a slot while at least ``ceil(L / 2)`` ranks hold a sample of it (`over_slots`), and a rank holding
   none lends its fullest group within budget.  Below the quorum such samples are carried.  With
   pooled windows (``lanes`` ranks per participant, `odb.core.placement`) a level's slots come in
   multiples of ``lanes``: a pool's G consecutive batches are one step on its G ranks, so a step's
   over-budget batches are then all of one level.
3. The reservoir: while data flows, with a window of at least 256 and a need of at least 4, the
   need's ordinary slots are halved, rounding up: each rank emits its better half and re-packs the rest.
4. The shared profile (`profile`): the over-budget slots, then per bucket within budget, costliest
   first, ``min over ranks of h_r[b]`` slots, cut to the need.  ``T = len(profile)`` while data flows
   and ``2 len(profile) >= need``, else ``T = need``.
5. `partition`: slot k gets a group of the profile's bucket (fewest padding tokens first), the open
   slots the fullest groups within budget (at the epoch end the costliest first); groups go out in
   decreasing fill, so slot k holds the k-th costliest group on every rank.  Any ``real`` works: more
   groups than the window forms split the costliest group of two or more samples in halves, again and
   again, so the extra batches lower this rank's costliest steps (never below one sample).

Why: a DDP step lasts as long as its slowest rank, so the k-th batches of all ranks should cost the
same; the released package aligned to the largest group count and peeled singletons instead.  Rule 0:
equal padded (or packed) tokens are not equal time, attention grows with L^2, so groups of the same
budget fill ran up to 22% apart in step time; aligned on the attention-aware fill, ODB's predicted
throughput at 8-256 ranks rose by up to 8.7% and fell nowhere (36 points;
``docs/decisions/2026-12-01-attention-aware-fill.md``).  Rules 1 and 5 at the epoch end: a
window's rigid groups (samples too long to pair, each a step of its own) are counted out unevenly
between the ranks, so flushing at the least count took a tail of 20-30 rounds of one or two steps
while most ranks idled; one flush round with the extra batches split by fill raised ODB's predicted
throughput at 8-256 ranks (``docs/decisions/2026-12-02-epoch-end-flush.md``).  The
measurements behind the other rules, and the rules tried and not adopted:
``docs/decisions/2026-11-29-alignment-policy.md``.
"""
from __future__ import annotations

import heapq
from bisect import bisect_right
from itertools import groupby, repeat
from operator import itemgetter, mul
from typing import NamedTuple, Sequence

import numpy as np

from ..errors import ConfigError, ProtocolError
from .base import AlignmentPolicy, CostModel, Sizes
from .cost import QUADRATIC_B, BudgetCost
from .grouping import Group, pack

__all__ = ["BalancedPolicy", "default_policy", "SUMMARY_TAG", "NUM_BUCKETS", "OVER", "fill_bucket",
           "over_slots", "aligned_fill", "attention_coefficient"]

# Identifies this policy's summary layout and decision rule (version 5: the epoch's last round flushes every window).
SUMMARY_TAG = 0x0DB5
# Bucket upper edges in 1/1000 of the budget, costliest first: over budget in 6 steps (a lone
# over-budget sample may cost up to several budgets), then widths of 0.025 down to 0.5, then the rest.
_EDGES = (10**9, 3000, 2000, 1500, 1250, 1100) + tuple(range(1000, 475, -25))
NUM_BUCKETS = len(_EDGES)
OVER = 6  # buckets 0 .. OVER-1 hold lone over-budget samples; they go out in over-budget slots (`over_slots`)
_HEAD = 5  # [tag, n, exhausted, closed groups, all groups], then the fill histogram
_group = tuple.__new__  # a `Group` from its three fields, without NamedTuple's Python-level __new__ (as grouping's)

# The reservoir (module docstring): while data flows, a window of at least _RESERVOIR_W samples
# whose every rank holds at least _RESERVOIR_NEED full groups emits only half of them.
_RESERVOIR_W = 256
_RESERVOIR_NEED = 4


_NEG_LOWER = [-e for e in _EDGES[1:]]  # bucket b's lower edge, negated: ascending, for bisect


def fill_bucket(fill: float) -> int:
    """Bucket of a group's fill (cost / budget), 0 the costliest: bucket b holds fills in
    ``(_EDGES[b+1], _EDGES[b]]`` thousandths; the last bucket holds 0.5 and less."""
    return bisect_right(_NEG_LOWER, -int(round(1000 * fill)))


_NEG_LOWER_A = np.array(_NEG_LOWER, dtype=np.int64)


def _fill_buckets(fills: list[float]) -> list[int]:
    """``[fill_bucket(f) for f in fills]``, past 64 fills in one numpy pass (`_bucket_array`).  A fill that
    is not finite or past 10^15 budgets takes `fill_bucket` (which raises on NaN and infinity, as before)."""
    if len(fills) > 64:
        b = _bucket_array(np.array(fills, dtype=np.float64))
        if b is not None:
            return b.tolist()
    return [fill_bucket(f) for f in fills]


def _bucket_array(f: "np.ndarray") -> "np.ndarray | None":
    """`fill_bucket` of each fill in `f` (float64): ``np.rint`` rounds half to even as `round` does.  None
    where some fill is not finite or past 10^15 budgets (int64 holds the thousandths exactly only below)."""
    t = 1000.0 * f
    if np.abs(t).max() < 1e18:  # False for NaN
        return np.searchsorted(_NEG_LOWER_A, -np.rint(t).astype(np.int64), side="right")
    return None


def attention_coefficient(num_layers: int, hidden_size: int, num_parameters: float) -> float:
    """``a`` for a decoder of `num_layers` layers of width `hidden_size` and `num_parameters` weights:
    ``num_layers * hidden_size / num_parameters``.  Causal attention costs about ``6 num_layers
    hidden_size L^2`` FLOPs per sequence of L tokens (forward and backward), the weights ``6
    num_parameters`` per token, so a sample of L tokens costs ``6 num_parameters L (1 + a L)``
    (e.g. 28 layers of 2048 and 2.1e9 weights: a = 1/36621)."""
    if min(num_layers, hidden_size, num_parameters) <= 0:
        raise ConfigError(f"attention_coefficient needs positive sizes, got {num_layers}, {hidden_size}, "
                          f"{num_parameters}")
    return num_layers * hidden_size / float(num_parameters)


def aligned_fill(groups: Sequence[Group], window: Sequence[Sizes], cost: CostModel,
                 attention: float, moments: Sequence[tuple[float, float]] | None = None) -> list[Group]:
    """`groups` of `window` (each with its plain fill, ``cost.utilisation`` of its samples, as `pack` gives
    it) with the fill of the module docstring's rule 0: the same groups when that is the plain fill
    (``attention == 0``, or a cost other than a one-resource padded or packed budget; a quadratic budget
    weighs attention itself).  `moments`: each group's ``(sum, sum of squares)`` of its lengths, as
    ``pack(..., moments=)`` gives them (the same fills, without a pass over the samples); None or empty:
    computed here."""
    if not attention or not isinstance(cost, BudgetCost) or len(cost.resources) != 1 \
            or cost.resources[0].kind not in ("padded", "packed"):
        return list(groups)
    r, a = cost.resources[0], float(attention)
    B = r.budget
    if r.kind == "padded":  # a group's plain fill is n Lmax / B: its longest is fill B / n, no pass over samples
        scale = 1.0 / (1.0 + a * B)
        if len(groups) > 64:  # the same float operations in the same order, elementwise (IEEE: the same values)
            f = np.array(list(map(itemgetter(2), groups)), dtype=np.float64)
            n = np.array(list(map(len, map(itemgetter(0), groups))), dtype=np.float64)
            return list(map(_group, repeat(Group), zip(map(itemgetter(0), groups), map(itemgetter(1), groups),
                                                       _padded_aligned(f, n, a, B).tolist())))
        return [_group(Group, (g.positions, g.closed, _within(g.fill, g.fill * (1.0 + a * g.fill * B / len(g.positions))
                                                               * scale)))
                for g in groups]
    i, norm = r.index, B * (1.0 + a * B)
    if not moments:  # what `pack` would have given: each group's sum and sum of squares of its lengths
        lens = [(s[i] if i < len(s) else 0) for s in window]  # once per window: C-level maps per group below
        moments = [(sum(ls), sum(map(mul, ls, ls)))
                   for ls in (list(map(lens.__getitem__, g.positions)) for g in groups)]
    elif len(moments) != len(groups):
        raise ValueError(f"{len(moments)} moments for {len(groups)} groups")
    return [_group(Group, (g.positions, g.closed, _within(g.fill, (s + a * q) / norm)))
            for g, (s, q) in zip(groups, moments)]


def _padded_aligned(f: "np.ndarray", n: "np.ndarray", a: float, B: float) -> "np.ndarray":
    """`aligned_fill`'s padded rule elementwise: plain fills `f` of groups of `n` samples (float64) under
    budget `B`, the same float operations in the same order as group by group, `_within` included."""
    al = f * (1.0 + a * f * B / n) * (1.0 / (1.0 + a * B))
    return np.where(f > 1.0, al, np.minimum(al, f))


def _within(plain: float, aligned: float) -> float:
    """`aligned`, never above `plain` for a group within budget: the weight cannot exceed the budget's
    there (module docstring), and rounding must not push a group of exactly the budget past 1."""
    return aligned if plain > 1.0 else min(aligned, plain)


def over_slots(over: Sequence[Sequence[int]], target: int, lanes: int = 1) -> tuple[list[int], list[list[bool]]]:
    """The round's over-budget slots from the ranks' over-budget histograms ``over`` (one
    ``h[0:OVER]`` per rank with data): their levels (buckets, costliest first, at most
    `target`) and, per rank and slot, whether the rank fills the slot with one of its own
    over-budget samples (its costliest one no costlier than the level) or lends a group.

    A level gets a slot while at least ``ceil(len(over) / 2)`` ranks hold a sample of exactly
    that bucket (the quorum; module docstring), its slots rounded down to a multiple of `lanes`.
    Level by level, costliest first, so a smaller `target` gives a prefix of the same slots.  Pure;
    the levels do not depend on rank order."""
    levels: list[int] = []
    if not any(any(h) for h in over):
        return levels, [[]] * len(over)  # read only: one empty list serves every rank
    own: list[list[bool]] = [[] for _ in over]
    k = (len(over) + 1) // 2
    held = [list(h) for h in over]
    for lv in range(OVER):
        # slots of this level: as many as the k-th largest holding of it (the quorum holds that long)
        col = [h[lv] for h in held]
        col.sort(reverse=True)
        n = min(col[k - 1], target - len(levels))
        n -= n % lanes
        if n <= 0:
            continue
        levels += [lv] * n
        mine, lend = [True] * n, [False] * n
        for h, o in zip(held, own):  # own samples of this level first, then cheaper ones, then lend
            left, b = n, lv
            while left and b < OVER:
                hb = h[b]
                if hb >= left:
                    h[b] = hb - left
                    left = 0
                else:
                    left -= hb
                    h[b] = 0
                    b += 1
            o += mine if not left else mine[:n - left] + lend[:left]
    return levels, own


def _profile(live: "np.ndarray", slots: tuple[list[int], list[list[bool]]], target: int) -> list[int]:
    """`BalancedPolicy.profile` of the ranks with data (their summaries, a row each), given their `over_slots`
    (any target >= this one)."""
    levels = slots[0][:target]
    h = live[:, _HEAD + OVER:]  # each rank's closed groups within budget, per bucket, costliest first
    if levels:  # the bucket minima count each rank's groups after those it lends to over-budget slots
        # (its fullest groups: from the costliest bucket on, each bucket giving what is still to lend)
        lend = np.array([o[:len(levels)].count(False) for o in slots[1]], dtype=np.int64)
        if lend.any():
            before = np.cumsum(h, axis=1) - h  # the rank's groups in costlier buckets
            h = h - np.clip(lend[:, None] - before, 0, h)
    out = list(levels)
    for b, m in enumerate(h.min(axis=0).tolist(), OVER):  # per bucket, costliest first: the least count over ranks
        if len(out) >= target:
            break
        out += [b] * m
    return out[:target]


def _fillable(within: int, own: Sequence[bool]) -> int:
    """Slots a rank holding `within` closed groups within budget fills without emitting an
    over-budget sample outside its over-budget slots (``own``: see `over_slots`)."""
    lent = len(own) - sum(own)
    if lent <= within:  # every lent slot is covered: all of them, then `within - lent` more
        return len(own) + within - lent
    for j, o in enumerate(own):  # the slot where the lent groups run out
        if not o:
            within -= 1
            if within < 0:
                return j
    return len(own)  # not reached: lent > within means some slot runs out


_EXACT = 2.0 ** 53  # below it an int64 converts to float64 exactly, as Python's int / float converts


def _padded_window(window: Sequence[Sizes], cost: CostModel, attention: float) -> tuple | None:
    """``(groups, buckets, [order])`` of `window` under a one-resource padded budget past 64 samples: what
    `pack`, `aligned_fill`, `_fill_buckets` and `BalancedPolicy._ordered` give, computed in array passes (the
    same values: the same IEEE operations on the same exactly converted operands, stable sorts where the
    reference sorts stably).  None where that does not hold (another cost, a small window, a sample without
    the resource or its tokens, lengths that are not ints or are negative, a length times the window past
    2^53, a budget not in (0, 2^53)): the reference path then computes them.  `summarize` runs it before
    the round's collective; it is most of the policy's time per round at W = 1,024."""
    if len(window) <= 64 or not isinstance(cost, BudgetCost) or len(cost.resources) != 1 \
            or cost.resources[0].kind != "padded":
        return None
    r = cost.resources[0]
    B = r.budget
    if isinstance(B, bool) or not isinstance(B, (int, float)) or not 0 < B < _EXACT:
        return None
    n = len(window)
    try:
        lens = np.array(list(map(itemgetter(r.index), window)))
        tok = lens if r.index == 0 else np.array(list(map(itemgetter(0), window)))
    except (IndexError, TypeError):
        return None
    if lens.dtype.kind != "i" or tok.dtype.kind != "i" or lens.ndim != 1 or tok.ndim != 1:
        return None
    if int(lens.min()) < 0 or int(tok.min()) < 0 or int(lens.max()) * n >= _EXACT or int(tok.max()) * n >= _EXACT:
        return None
    order = np.argsort(-lens, kind="stable")  # `_longest_first`
    ls = lens[order]
    # `grouping._pack_padded`'s cap at every place, in int64: for an int top >= 1, ``B // top`` is exact below
    # 2^53 (fmod is exact, B - fmod(B, top) a multiple of top) and floor(B / top) = floor(B) // top
    cap = np.maximum(np.where(ls > 0, int(B) // np.maximum(ls, 1), n), 1)
    nxt = np.minimum(np.arange(n) + cap, n).tolist()
    starts = []
    i = 0
    while i < n:  # its walk: each group starts where the one before ended
        starts.append(i)
        i = nxt[i]
    ol = order.tolist()
    k = len(starts)
    pos = list(map(tuple, map(ol.__getitem__, map(slice, starts, starts[1:] + [n]))))
    st = np.array(starts, dtype=np.int64)
    closed = [True] * k
    closed[-1] = len(pos[-1]) == int(cap[starts[-1]])  # every group but the last ends before the window does
    cnt = np.diff(np.append(st, n))
    top_a = ls[st]
    f = (cnt * top_a) / B  # `len(g) * top / B`
    if attention:  # `aligned_fill`'s padded rule
        f = _padded_aligned(f, cnt.astype(np.float64), float(attention), B)
    bucket = _bucket_array(f)
    if bucket is None:
        return None
    fills = f.tolist()
    groups = list(map(_group, repeat(Group), zip(pos, closed, fills)))
    m = k if closed[-1] else k - 1  # only the last group can be open: the closed ones are a prefix
    cf, cb = f[:m], bucket[:m]
    by_fill = np.argsort(-cf, kind="stable")
    place = np.empty(m, dtype=np.int64)
    place[by_fill] = np.arange(m)
    if m:
        end = starts[m] if m < k else n  # the open group's tokens are no closed group's
        density = np.add.reduceat(tok[order[:end]], st[:m]) / np.maximum(cf, 1e-12)
        d = np.argsort(-density, kind="stable")
        ks = d[np.argsort(cb[d], kind="stable")].tolist()
    else:
        ks = []
    edges = np.cumsum(np.bincount(cb, minlength=NUM_BUCKETS)).tolist()
    by_bucket = [ks[lo:hi] for lo, hi in zip([0] + edges[:-1], edges)]
    return groups, bucket.tolist(), [_Order(groups[:m], by_fill.tolist(), place.tolist(), by_bucket, k)]


class _Order(NamedTuple):
    """A window's closed groups in the orders `BalancedPolicy.partition` reads (rule 5)."""

    closed: list                # the closed groups, in `pack`'s order (a group's index k is its place here)
    by_fill: list[int]          # the k in decreasing fill, ties by k
    place: list[int]            # place[k]: k's index in `by_fill`
    by_bucket: list[list[int]]  # per fill bucket, its k: most real tokens per unit of cost first, ties by k
    groups: int                 # all the window's groups, the open one included


class _Round(NamedTuple):
    """`BalancedPolicy`'s memo of the last summaries (pure caches of them)."""

    key: object                 # the summaries as given: an array (compared by identity only) or rows (by value)
    live: "np.ndarray"          # those of the ranks with data, a row each
    slots: tuple                # their `over_slots`
    profile: list               # [target, `_profile` at it]: the longest profile computed (`_profile_of`)
    within: "np.ndarray | None"  # each live rank's closed groups within budget; None: no over-budget sample


def _check(summaries: Sequence[Sequence[int]], length: int) -> None:
    for r, s in enumerate(summaries):
        if len(s) != length or s[0] != SUMMARY_TAG:
            raise ProtocolError(
                f"rank {r} posted a summary {list(s)[:8]} that is not BalancedPolicy's "
                f"(length {length}, tag {SUMMARY_TAG}); the ranks would decide differently; "
                "use the same alignment policy (and ODB version) on every rank")


def _as_array(summaries: Sequence[Sequence[int]], length: int) -> "np.ndarray":
    """The summaries as one int64 array of a row per rank; ProtocolError (naming the first rank at fault)
    unless every row has `length` ints and the tag."""
    if isinstance(summaries, np.ndarray):
        a = summaries
        if a.ndim == 2 and a.shape[1] == length and a.dtype.kind in "iu" and (a[:, 0] == SUMMARY_TAG).all():
            return a
        _check(a.tolist() if a.ndim == 2 else [a.tolist()], length)
        raise ProtocolError(f"summaries as an array of shape {a.shape} and dtype {a.dtype}, not (ranks, {length}) ints")
    rows = list(summaries)
    if set(map(len, rows)) <= {length} and set(map(itemgetter(0), rows)) <= {SUMMARY_TAG}:
        return np.array(rows, dtype=np.int64).reshape(len(rows), length)
    _check(rows, length)
    raise AssertionError("unreachable: _check raises on the row at fault")


# The last round memo any instance computed from a summaries array, keyed by that array's identity (the memo holds
# it, so the identity cannot be reused) and the settings it reads: a round's gathered headers are one read-only array,
# so the simulation's N policy copies (`odb.core.sim`, one a simulated rank) compute the round's `over_slots` (O(N)
# each) once, not N times.  In a training process, one loader's policy: the instance memo already hits.
_LAST_ROUND: list = [None]


def _same(key: object, summaries: object) -> bool:
    """The memo's key holds these summaries: the same array object (a round's gathered headers are read-only
    and hand both calls of the round one array; an equal array elsewhere is merely computed again), or rows
    equal row by row (a decoded header's summary is a tuple kept as it is: mostly the same objects)."""
    if key is summaries:
        return True
    if isinstance(summaries, np.ndarray) or isinstance(key, np.ndarray):
        return False
    return key == tuple(map(tuple, summaries))


class BalancedPolicy(AlignmentPolicy):
    """Full groups, minimum-need target, a shared per-step cost profile (see the module docstring).

    Summary layout (``summary_len = 5 + NUM_BUCKETS`` ints):
    ``[SUMMARY_TAG, n, exhausted, closed groups, all groups, h[0] .. h[NUM_BUCKETS - 1]]``
    (``h``: closed groups per `fill_bucket`; the length never depends on the window).
    `propose` and `profile` are deterministic and do not depend on rank order
    (minima and quorum counts over ranks); both raise ProtocolError on a summary
    of another layout or tag (ranks running different policies or versions: the
    tag also versions the decision rule).  Holds one-entry memos of the last
    packing and of the last summaries' over-budget slots (pure caches), so
    `summarize` and the following `partition` of one round pack once, and
    `propose` and `partition` compute the slots once.  The summaries may come as rows or as one
    ``(N, summary_len)`` int array (``summary_arrays``: the runtime hands the gathered headers' columns,
    with no N x summary_len Python ints a round); the decision is the same either way.
    """

    summary_len = _HEAD + NUM_BUCKETS
    summary_arrays = True  # `propose` and `partition` read the gathered summaries as one array (`AlignmentPolicy`)

    def __init__(self, attention: float = QUADRATIC_B, lanes: int = 1) -> None:
        """:param attention: ``a`` of the fill (module docstring, rule 0; `attention_coefficient` gives it
            for a model); 0 aligns on the plain budget fill.  A public attribute: the construction check
            compares it across ranks.
        :param lanes: ranks per participant (the loader's ``pool_size``; rule 2), also compared.
        :raises ConfigError: a negative or non-finite attention, lanes not an int >= 1."""
        if isinstance(attention, bool) or not isinstance(attention, (int, float)) or not 0 <= attention < float("inf"):
            raise ConfigError(f"BalancedPolicy attention must be a finite number >= 0, got {attention!r}; "
                              "the groups' fills could not be compared; pass e.g. attention_coefficient(...) or 0")
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
            raise ConfigError(f"BalancedPolicy lanes must be an int >= 1 (the loader's pool_size), got {lanes!r}")
        self.attention, self.lanes = float(attention), lanes
        self._memo: tuple[tuple, object, list[Group], list[int], list] | None = None
        self._round: _Round | None = None

    # -- helpers ---------------------------------------------------------------
    def groups(self, window: Sequence[Sizes], cost: CostModel) -> list[Group]:
        """`grouping.pack` of the window, with the fills of rule 0 (memoized for the last window)."""
        return self._packed(window, cost)[0]

    def _packed(self, window: Sequence[Sizes], cost: CostModel) -> tuple[list[Group], list[int]]:
        """The window's groups and each group's `fill_bucket` (memoized for the last window)."""
        key = tuple(window)
        m = self._memo
        if m is not None and m[1] is cost and m[0] == key:
            return m[2], m[3]
        fast = _padded_window(window, cost, self.attention)
        if fast is not None:  # the same groups, buckets and orders as below, in array passes
            self._memo = (key, cost, *fast)
            return self._memo[2], self._memo[3]
        moments: list = []
        g = aligned_fill(pack(window, cost, moments), window, cost, self.attention, moments)
        self._memo = (key, cost, g, _fill_buckets(list(map(itemgetter(2), g))), [])
        return self._memo[2], self._memo[3]

    def _ordered(self, window: Sequence[Sizes], cost: CostModel) -> _Order:
        """The window's closed groups in the orders `partition` reads (`_Order`; memoized with the packing:
        they depend on the window alone, so `summarize` computes them before the round's collective)."""
        self._packed(window, cost)
        key, _, gs, buckets, memo = self._memo
        if memo:
            return memo[0]
        closed = [g for g in gs if g.closed]
        bucket = [b for g, b in zip(gs, buckets) if g.closed]
        fills = list(map(itemgetter(2), closed))
        by_fill = sorted(range(len(closed)), key=fills.__getitem__, reverse=True)  # stable also reversed: ties by k
        place = [0] * len(closed)
        for i, k in enumerate(by_fill):
            place[k] = i
        try:  # every sample has its tokens (the common case): one C-level pass
            tok = list(map(itemgetter(0), key))
        except IndexError:
            tok = [s[0] if s else 0 for s in key]
        density = [sum(map(tok.__getitem__, g.positions)) / max(g.fill, 1e-12) for g in closed]
        by_bucket: list[list[int]] = [[] for _ in range(NUM_BUCKETS)]
        for k in sorted(range(len(closed)), key=density.__getitem__, reverse=True):  # stable: ties by k
            by_bucket[bucket[k]].append(k)
        memo.append(_Order(closed, by_fill, place, by_bucket, len(gs)))
        return memo[0]

    def _slots(self, summaries: Sequence[Sequence[int]]) -> tuple["np.ndarray", tuple[list[int], list[list[bool]]]]:
        """The summaries of the ranks with data (an int64 array, a row each) and their `over_slots` (any
        target; memoized for the last summaries, so `propose` and `partition` of one round compute them
        once)."""
        m = self._round
        if m is not None and _same(m.key, summaries):
            return m.live, m.slots
        shared = _LAST_ROUND[0]  # another instance's memo of this very array (`_LAST_ROUND`)
        if shared is not None and shared[0] == (self.lanes, self.summary_len) and shared[1].key is summaries:
            self._round = shared[1]
            return self._round.live, self._round.slots
        a = _as_array(summaries, self.summary_len)
        has = a[:, 1] > 0
        live = a if has.all() else a[has]  # every rank has data but at the epoch's end: no copy
        over = live[:, _HEAD:_HEAD + OVER]
        if over.any():  # some rank holds an over-budget sample
            slots = over_slots(over.tolist(), 1 << 30, self.lanes)
            within = live[:, 3] - over.sum(axis=1)  # closed groups within budget, per rank
        else:  # none does (the common case): no over-budget slot, nobody lends, every closed group is within budget
            slots, within = ([], [[]] * len(live)), None
        key = summaries if isinstance(summaries, np.ndarray) else tuple(map(tuple, summaries))
        self._round = _Round(key, live, slots, [0, []], within)
        if isinstance(summaries, np.ndarray):
            _LAST_ROUND[0] = ((self.lanes, self.summary_len), self._round)
        return live, slots

    def _profile_of(self, live: list, slots: tuple, target: int) -> list[int]:
        """`_profile` for this round's summaries, memoized with the round: a profile is the prefix, cut
        to its target, of one list (a shorter profile than its target is that whole list), so the
        longest one computed answers every target up to its own."""
        memo = self._round.profile
        done, prof = memo
        if target > done and len(prof) == done:
            memo[:] = target, _profile(live, slots, target)
            done, prof = memo
        return prof[:target]

    def profile(self, summaries: Sequence[Sequence[int]], target: int) -> list[int]:
        """The round's shared profile: a non-increasing-cost list of fill buckets, at most
        `target` long, that every rank with data can fill from its closed groups.

        It opens with the round's over-budget slots (`over_slots`, cut to `target`), where a
        rank without a sample of the level or a cheaper one lends its fullest group within
        budget; the bucket minima that follow count each rank's groups after those.  Every
        rank can fill every slot as long as `target` is at most the need (`propose`).  A pure
        function of the gathered summaries (identical on every rank, independent of rank
        order).  Raises ProtocolError on a summary of another layout.
        """
        live, slots = self._slots(summaries)
        return list(self._profile_of(live, slots, target)) if len(live) else []

    # -- AlignmentPolicy -------------------------------------------------------
    def summarize(self, window: Sequence[Sizes], cost: CostModel, exhausted: bool) -> list[int]:
        """This rank's summary (layout in the class docstring); pure in its arguments."""
        o = self._ordered(window, cost)  # also what `partition` reads of the window alone, before the collective
        hist = list(map(len, o.by_bucket))  # closed groups per fill bucket
        return [SUMMARY_TAG, len(window), int(bool(exhausted)), len(o.closed), o.groups, *hist]

    def propose(self, summaries: Sequence[Sequence[int]], window: int) -> int:
        """The round's target ``T`` (module docstring) from the gathered summaries and the window
        size ``W`` (the same on every rank; it switches the reservoir): deterministic, rank-order
        free, at least 1.  Raises ProtocolError on a summary of another layout."""
        live, slots = self._slots(summaries)
        if not len(live):
            return 1
        ex = live[:, 2]
        if ex.any():
            # epoch end: exhausted ranks flush every group, the profile no longer binds
            if ex.all():  # the last round: every window at once (rule 1)
                return max(1, int(live[:, 4].max()))
            return max(1, int(np.where(ex != 0, live[:, 4], live[:, 3]).min()))
        within = self._round.within
        if within is None:  # no over-budget sample anywhere: `_fillable` of a rank is its closed groups
            t = max(1, int(live[:, 3].min()))
        elif slots[0]:
            t = max(1, min(map(_fillable, within.tolist(), slots[1])))
        else:  # no over-budget slot: `_fillable` of a rank is its closed groups within budget
            t = max(1, int(within.min()))
        if window >= _RESERVOIR_W and t >= _RESERVOIR_NEED:
            qt = min(len(slots[0]), t)  # the reservoir halves the ordinary slots only (module docstring)
            t = qt + (t - qt + 1) // 2
        p = len(self._profile_of(live, slots, t))
        return p if 2 * p >= t else t  # a short profile would carry too much (see the module docstring)

    def partition(self, window: Sequence[Sizes], target: int, real: int, cost: CostModel, *,
                  summaries: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
        """`real` groups of `window` (see the module and `AlignmentPolicy` docstrings).

        :param summaries: this round's gathered summaries (every rank's, identical on
            every rank); None falls back to the `real` fullest closed groups.
        :raises ProtocolError: ``real`` outside ``[0, len(window)]``, or summaries of
            another layout.
        """
        if not 0 <= real <= len(window):
            raise ProtocolError(f"partition asked for {real} groups from a window of {len(window)}")
        if real == 0:
            return []
        o = self._ordered(window, cost)
        closed = o.closed
        if real <= len(closed):
            return [list(closed[k].positions) for k in self._pick(o, real, summaries, target)]
        # every closed group, then the open one
        return self._split(window, self._packed(window, cost)[0][:real], real, cost)

    def _split(self, window: Sequence[Sizes], groups: Sequence[Group], real: int, cost: CostModel) -> list[list[int]]:
        """`groups` (with rule 0's fills) split until there are `real` of them, in decreasing fill: the
        costliest group of two or more samples is halved, the first half holding its first samples
        (ties: the one with more samples, then the earlier one).  Requires `real` at most their samples."""
        # a max-heap on (fill, samples, age); the age keeps ties in the order the groups came
        heap = [(-g.fill, -len(g.positions), k, list(g.positions)) for k, g in enumerate(groups)]
        heapq.heapify(heap)
        done, made = [], len(groups)
        while len(heap) + len(done) < real:
            item = heapq.heappop(heap)
            g = item[3]
            if len(g) == 1:  # a lone sample cannot be split: it goes out as it is
                done.append(item)
                continue
            half = (len(g) + 1) // 2
            for part in (g[:half], g[half:]):
                f = aligned_fill([Group(tuple(part), True, cost.utilisation([window[p] for p in part]))], window, cost,
                                 self.attention)[0].fill
                heapq.heappush(heap, (-f, -len(part), made, part))
                made += 1
        return [item[3] for item in sorted(heap + done)]

    def _pick(self, o: _Order, real: int, summaries: Sequence[Sequence[int]] | None, target: int) -> list[int]:
        """Indices into ``o.closed`` of the `real` groups to emit, in decreasing fill."""
        if summaries is None:
            return o.by_fill[:real]
        closed, place, bb = o.closed, o.place, o.by_bucket
        head = [0] * NUM_BUCKETS  # per bucket, its groups taken so far (fewest padding tokens first)
        taken: list[int] = []
        for b, run in groupby(self.profile(summaries, max(target, real))[:real]):
            if b >= OVER:  # a run of slots of one bucket within budget: as many of its groups as it has
                h = head[b]
                got = bb[b][h:h + len(list(run))]
                taken += got
                head[b] = h + len(got)
                continue
            for _ in run:  # over-budget slot: the costliest own sample no costlier than the level, else lend
                c = next((x for x in range(b, OVER) if head[x] < len(bb[x])), None)
                if c is None:
                    c = next((x for x in range(OVER, NUM_BUCKETS) if head[x] < len(bb[x])), 0)
                if head[c] < len(bb[c]):
                    taken.append(bb[c][head[c]])
                    head[c] += 1
        # the slots the profile leaves open: fullest within budget first; a lone over-budget
        # sample (a step of its own cost) only when nothing else is left, cheapest first
        if len(taken) < real:
            rest = [k for b in range(NUM_BUCKETS) for k in bb[b][head[b]:]]
            if self._slots(summaries)[0][:, 2].any():
                # epoch end: costliest first, so a rank holding more cost (over-budget samples
                # carried this far) spends it while the other ranks still have batches to run
                rest.sort(key=place.__getitem__)
            else:
                rest.sort(key=lambda k: (closed[k].fill > 1.0, abs(1.0 - closed[k].fill), k))
            taken += rest[:real - len(taken)]
        return sorted(taken, key=place.__getitem__)  # decreasing fill, ties by index


def default_policy(lanes: int = 1) -> BalancedPolicy:
    """The policy ODB uses unless told otherwise (a fresh instance per rank): `BalancedPolicy` with the
    default ``attention`` (1/24576, verl's workload estimate ``24576 L + L^2``), for pools of `lanes`
    ranks (the loader's ``pool_size``)."""
    return BalancedPolicy(lanes=lanes)
