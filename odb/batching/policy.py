"""The default cross-rank alignment policy: full groups, a common minimum target, a shared cost profile.

Legend
    n_r     rank r's window size this round (carry included)
    f_r     closed (full) groups rank r can form from its window (`grouping.pack`)
    c_r     all groups of rank r's window, the open one included
    x_r     rank r's data source is exhausted
    o_r     rank r's lone over-budget samples (closed groups of one sample costing more than the budget)
    e_r     the over-budget slots rank r fills with its own over-budget samples (`over_slots`)
    L       the ranks with data (n_r > 0); k = ceil(L / 2) of them make the over-budget quorum
    T       the round's target: batches per rank
    u       a group's cost / budget (`CostModel.utilisation`), its *fill*
    h_r[b]  rank r's closed groups whose fill falls in bucket b (`fill_bucket`)

Why this policy.  A DDP step lasts as long as its slowest rank, so every batch
of a step should cost about the same.  The released package aligned ranks to the
*largest* group count and padded the others by peeling single samples into
singleton batches (plus a forced singleton per window), which wastes budget and
creates stragglers.  Here the target starts from the *smallest* need

    need = max(1, min over ranks with n_r > 0 of (c_r if x_r else f_r))          (some x_r: the epoch end)
    need = max(1, min over ranks with n_r > 0 of (f_r - o_r + e_r))              (while data flows)

(the second exactly: the slots rank r fills without emitting a lone over-budget
sample outside its own over-budget slots, `_fillable`), so every rank with data
emits groups that are full (closed) as long as it has them; a rank with more
full groups carries the surplus (emitted in a later round, never dropped), and a
partial (open) group is only emitted when its rank's source is exhausted or when
the rank has no full group at all (a window too small for the budget).  No
sample is peeled into a singleton.

The over-budget quorum.  A lone over-budget sample (fill above 1) makes its
step a straggler unless the other ranks run costly batches in the same step.
Each round therefore opens with over-budget slots (`over_slots`), costliest
level first: a level (one of the ``OVER`` over-budget buckets) gets a slot while
at least k of the L ranks with data hold a sample of exactly that bucket.  In
such a slot every rank emits its costliest over-budget sample no costlier than
the level (a cheaper one rides along for free: the step's cost is set by the
level), and a rank holding none lends its fullest group within budget.  Samples
of a level without a quorum are carried: while data flows the need above leaves
them out, so no rank has to emit one in an ordinary slot (only a rank left with
nothing else, when the table's clamp to 1 forces a batch).  Measured (2026-11)
on the 36 grid points that hold over-budget samples (sharegpt4o and mmmix under
a budget of 8192; ``straggler loss`` = sum over steps of the largest batch cost
minus the ranks' mean, in budgets), loss in steps holding an over-budget batch,
against the policy before the quorum (82.3; over-budget samples matched only
when every rank held one, otherwise emitted when the need forced it): 67.9 with
k = ceil(L / 2); 91.2 with a quarter of the ranks; 74.0 without the cheaper
samples riding along; 104.8 with one slot per sample the median rank holds,
each rank's costliest first (the costliest of eight samples sets the step).
k = L (every rank) gave 57.8 on the grid's short epochs, but with 8192 samples
per rank it carried up to 41 samples per rank (k = ceil(L / 2): 11) and took 51
steps more than k = ceil(L / 2) (sharegpt4o, N = 16, W = 64, padded): when
every rank must hold one the ranks' holdings drift apart like random walks,
while with half of them the holders spend faster than they receive.  On that
long epoch the quorum lifts straggler efficiency from 0.852 to 0.890 for one
step more of 1952 (dealt shards, `deal.py`: 0.866 to 0.910, 6 steps more of
1902); at N = 2 (k = 1: a sample goes out with the other rank's fullest group)
it lowers it from 0.969 to 0.965.

The shared cost profile.  Every rank's summary carries the histogram ``h_r`` of
its closed groups' fills (`fill_bucket`: widths of 0.025 of the budget from 0.5
to 1, coarser above the budget for lone over-budget samples).  From the gathered
summaries, identical on every rank, each rank computes the same *profile*
(`profile`): the over-budget slots, then for every bucket within budget,
costliest first, ``min over ranks with data of h_r[b]`` slots (counted after
each rank's lent groups), cut to the need.  Every rank can fill each slot with
a group of exactly that bucket, so the k-th batches of all ranks cost within
0.025 of the budget of each other.  The target is then

    T = len(profile)     if no rank with data is exhausted and 2 len(profile) >= need
    T = need             otherwise

(where, while data flows in a window of 256 or more, the reservoir below first
halves the need's ordinary slots), i.e. while data flows a round emits only the
slots every rank can match, and a group of a bucket that some rank lacks
(typically a long sample whose padded batch is half empty) is carried until
every rank with data holds one of that bucket.  When the profile covers less
than half the need, limiting T to it would carry so much that the window's
intake starves (measured, 2026-11: release lengths, N = 8, W = 64, a 16384
padded budget took 71 steps instead of 63), so T stays the need and the slots
the profile leaves open take each rank's remaining closed group nearest to a
full budget, over-budget samples last.  At the epoch end (some rank with data
exhausted) they take the costliest first instead, so a rank holding more cost
spends it while the others still run.  Within a bucket the group with the
fewest padding tokens goes first, so the padding-heavy ones are carried and
re-packed with the next samples (for a padded cost that is what lowers the step
count).  Without summaries (``summaries=None``) the `real` fullest closed
groups are taken.  Every rank emits its groups in decreasing fill, so slot k
holds the k-th costliest group on every rank.

The reservoir.  While data flows, with a window of at least 256 samples
(``window`` as passed to `propose`) and a need of at least 4, the need's
ordinary slots (those after the over-budget slots) are halved (rounded up)
before the profile is taken: each rank emits only its better half of groups
(the profile's matched slots, fewest padding tokens first) and carries the
rest, which meet the next intake and re-pack with more similar lengths.
Measured on the default grid (``paper_repro.bench``, 2026-11, against the same
policy without it): ODB steps down at 56 of 135 points and up at none, steps
<= 1.10 x GMT missed at 8/90 instead of 9 (worst 1.257 instead of 1.286),
<= 1.05 x GMT at 5/45 instead of 6, straggler efficiency >= 0.97 missed at
64/135 instead of 67, packed budget use >= 0.95 missed at 22/45 instead of 23;
no worst point regressed.  Windows under 256 keep the full need.  On the
default grid halving at W = 64 too would look better (17 steps fewer over its
45 W = 64 points, straggler misses 63 instead of 64), but that comes from the
grid's short epochs (1024 samples per rank), where the epoch end weighs most:
with 8192 samples per rank it took 7 to 13 more steps at 3 of 5 W = 64 points
(9 fewer at one) and lowered straggler efficiency by up to 0.007.

The mismatch within a round (measured, not adopted).  Fills fall within a round
(from about 1.0 to about 0.55 at W = 64) and the k-th batches of different
ranks differ most in the low tail, where the ranks with the fewest groups emit
their lone long samples while the others carry theirs.  Two rules that make the
others follow did worse on the default grid: every slot filled to the lowest
rank's k-th group (cumulative minima of ``h_r``): straggler misses 70 instead
of 64, steps up at 48 points; the open slots filled no costlier than the
poorest ranks' groups: misses 63, but the worst point 0.859 instead of 0.871
and 9/90 points over 1.10 x GMT.

Known limits (measured in ``paper_repro/results/quality_sim_*.md``):
over-budget samples of a level without a quorum gather at the epoch end, where
ranks hold different numbers of them; with dealt shards this lengthens the
drain (the 36 over-budget points: loss in over-budget steps 80.5 -> 67.7, in
steps where some rank has no batch 128.7 -> 139.1; 9114 steps instead of
9104).  No policy can beat the shard ceiling (mean over max of the ranks' total
cost), which DistributedSampler shards of skewed lengths set below 0.97.

The proposal reads only the gathered summaries, so it is the same on every
rank; the table clamps it to ``[1, hi]``.  `partition` works for any ``real``
(``1 <= real <= len(window)``), also when the clamp or a filler-padded PAD tail
asks for more groups than the window has: it then splits the largest groups
(never below one sample each).
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Sequence

from ..errors import ProtocolError
from .base import CostModel, Sizes
from .grouping import Group, pack

__all__ = ["BalancedPolicy", "default_policy", "SUMMARY_TAG", "NUM_BUCKETS", "OVER", "fill_bucket",
           "over_slots"]

# Identifies this policy's summary layout and decision rule (version 3: the over-budget quorum).
SUMMARY_TAG = 0x0DB3
# Bucket upper edges in 1/1000 of the budget, costliest first: over budget in 6 steps (a lone
# over-budget sample may cost up to several budgets), then widths of 0.025 down to 0.5, then the rest.
_EDGES = (10**9, 3000, 2000, 1500, 1250, 1100) + tuple(range(1000, 475, -25))
NUM_BUCKETS = len(_EDGES)
OVER = 6  # buckets 0 .. OVER-1 hold lone over-budget samples; they go out in over-budget slots (`over_slots`)
_HEAD = 5  # [tag, n, exhausted, closed groups, all groups], then the fill histogram
# The reservoir (module docstring): while data flows, a window of at least _RESERVOIR_W samples
# whose every rank holds at least _RESERVOIR_NEED full groups emits only half of them.
_RESERVOIR_W = 256
_RESERVOIR_NEED = 4


_NEG_LOWER = [-e for e in _EDGES[1:]]  # bucket b's lower edge, negated: ascending, for bisect


def fill_bucket(fill: float) -> int:
    """Bucket of a group's fill (cost / budget), 0 the costliest: bucket b holds fills in
    ``(_EDGES[b+1], _EDGES[b]]`` thousandths; the last bucket holds 0.5 and less."""
    return bisect_right(_NEG_LOWER, -int(round(1000 * fill)))


def over_slots(over: Sequence[Sequence[int]], target: int) -> tuple[list[int], list[list[bool]]]:
    """The round's over-budget slots from the ranks' over-budget histograms ``over`` (one
    ``h[0:OVER]`` per rank with data): their levels (buckets, costliest first, at most
    `target`) and, per rank and slot, whether the rank fills the slot with one of its own
    over-budget samples (its costliest one no costlier than the level) or lends a group.

    A level gets a slot while at least ``ceil(len(over) / 2)`` ranks hold a sample of exactly
    that bucket (the quorum; module docstring).  Level by level, costliest first, so a smaller
    `target` gives a prefix of the same slots.  Pure; the levels do not depend on rank order."""
    levels: list[int] = []
    own: list[list[bool]] = [[] for _ in over]
    if not any(any(h) for h in over):
        return levels, own
    k = (len(over) + 1) // 2
    held = [list(h) for h in over]
    for lv in range(OVER):
        # slots of this level: as many as the k-th largest holding of it (the quorum holds that long)
        col = [h[lv] for h in held]
        col.sort(reverse=True)
        n = min(col[k - 1], target - len(levels))
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


def _profile(live: Sequence[Sequence[int]], slots: tuple[list[int], list[list[bool]]],
             target: int) -> list[int]:
    """`BalancedPolicy.profile` of the ranks with data, given their `over_slots` (any target >= this one)."""
    levels = slots[0][:target]
    rows = []
    for s, o in zip(live, slots[1]):
        h = s[_HEAD + OVER:]
        lend = o[:len(levels)].count(False)  # this rank's fullest groups that go into over-budget slots
        if lend:
            h = list(h)
            for b in range(len(h)):
                if h[b] >= lend:
                    h[b] -= lend
                    break
                lend -= h[b]
                h[b] = 0
        rows.append(h)
    out = list(levels)
    for b, m in enumerate((min(col) for col in zip(*rows)), start=OVER):  # per bucket, over ranks
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


def _check(summaries: Sequence[Sequence[int]], length: int) -> None:
    for r, s in enumerate(summaries):
        if len(s) != length or s[0] != SUMMARY_TAG:
            raise ProtocolError(
                f"rank {r} posted a summary {list(s)[:8]} that is not BalancedPolicy's "
                f"(length {length}, tag {SUMMARY_TAG}); the ranks would decide differently; "
                "use the same alignment policy (and ODB version) on every rank")


class BalancedPolicy:
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
    `propose` and `partition` compute the slots once.
    """

    summary_len = _HEAD + NUM_BUCKETS

    def __init__(self) -> None:
        self._memo: tuple[tuple, object, list[Group], list[int]] | None = None
        self._round: tuple[tuple, list, tuple[list[int], list[list[bool]]], dict] | None = None

    # -- helpers ---------------------------------------------------------------
    def groups(self, window: Sequence[Sizes], cost: CostModel) -> list[Group]:
        """`grouping.pack` of the window (memoized for the last window)."""
        return self._packed(window, cost)[0]

    def _packed(self, window: Sequence[Sizes], cost: CostModel) -> tuple[list[Group], list[int]]:
        """The window's groups and each group's `fill_bucket` (memoized for the last window)."""
        key = tuple(window)
        m = self._memo
        if m is not None and m[1] is cost and m[0] == key:
            return m[2], m[3]
        g = pack(window, cost)
        self._memo = (key, cost, g, [fill_bucket(x.fill) for x in g])
        return self._memo[2], self._memo[3]

    def _slots(self, summaries: Sequence[Sequence[int]]) -> tuple[list, tuple[list[int], list[list[bool]]]]:
        """The summaries of the ranks with data and their `over_slots` (any target; memoized for
        the last summaries, so `propose` and `partition` of one round compute them once)."""
        _check(summaries, self.summary_len)
        key = tuple(map(tuple, summaries))
        m = self._round
        if m is not None and m[0] == key:
            return m[1], m[2]
        live = [s for s in key if s[1] > 0]
        slots = over_slots([s[_HEAD:_HEAD + OVER] for s in live], 1 << 30)
        self._round = (key, live, slots, {})
        return live, slots

    def _profile_of(self, live: list, slots: tuple, target: int) -> list[int]:
        """`_profile` for this round's summaries (memoized per target with the round)."""
        memo = self._round[3]
        if target not in memo:
            memo[target] = _profile(live, slots, target)
        return memo[target]

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
        return list(self._profile_of(live, slots, target)) if live else []

    # -- AlignmentPolicy -------------------------------------------------------
    def summarize(self, window: Sequence[Sizes], cost: CostModel, exhausted: bool) -> list[int]:
        """This rank's summary (layout in the class docstring); pure in its arguments."""
        gs, buckets = self._packed(window, cost)
        hist = [0] * NUM_BUCKETS
        for g, b in zip(gs, buckets):
            if g.closed:
                hist[b] += 1
        return [SUMMARY_TAG, len(window), int(bool(exhausted)), sum(hist), len(gs), *hist]

    def propose(self, summaries: Sequence[Sequence[int]], window: int) -> int:
        """The round's target ``T`` (module docstring) from the gathered summaries and the window
        size ``W`` (the same on every rank; it switches the reservoir): deterministic, rank-order
        free, at least 1.  Raises ProtocolError on a summary of another layout."""
        live, slots = self._slots(summaries)
        if not live:
            return 1
        if any(s[2] for s in live):
            # epoch end: exhausted ranks flush every group, the profile no longer binds
            return max(1, min((s[4] if s[2] else s[3]) for s in live))
        t = max(1, min(_fillable(s[3] - sum(s[_HEAD:_HEAD + OVER]), o) for s, o in zip(live, slots[1])))
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
        gs, buckets = self._packed(window, cost)
        closed = [g for g in gs if g.closed]
        if real <= len(closed):
            pick = self._pick(window, closed, [b for g, b in zip(gs, buckets) if g.closed], real, summaries, target)
            return [list(closed[k].positions) for k in pick]
        chosen = [list(g.positions) for g in gs[:real]]  # every closed group, then the open one
        while len(chosen) < real:  # more groups than the window forms: split the largest
            i = max(range(len(chosen)), key=lambda k: (len(chosen[k]), -k))
            g = chosen[i]
            half = (len(g) + 1) // 2
            chosen[i:i + 1] = [g[:half], g[half:]]
        return sorted(chosen, key=lambda g: -cost.utilisation([window[p] for p in g]))

    def _pick(self, window: Sequence[Sizes], closed: list[Group], bucket: list[int], real: int,
              summaries: Sequence[Sequence[int]] | None, target: int) -> list[int]:
        """Indices into `closed` (whose fill buckets are `bucket`) of the `real` groups to emit,
        in decreasing fill."""
        if summaries is None:
            rank = sorted(range(len(closed)), key=lambda k: (-closed[k].fill, k))
            return rank[:real]
        # per bucket: fewest padding tokens first (real tokens per unit of cost), then position
        by_bucket: list[list[int]] = [[] for _ in range(NUM_BUCKETS)]
        tok = [s[0] if s else 0 for s in window]
        density = [sum(map(tok.__getitem__, g.positions)) / max(g.fill, 1e-12) for g in closed]
        for k in sorted(range(len(closed)), key=density.__getitem__, reverse=True):  # stable: ties by k
            by_bucket[bucket[k]].append(k)
        taken: list[int] = []
        for b in self.profile(summaries, max(target, real))[:real]:
            if b < OVER:  # over-budget slot: the costliest own sample no costlier than the level, else lend
                b = next((o for o in range(b, OVER) if by_bucket[o]), None)
                if b is None:
                    b = next((o for o in range(OVER, NUM_BUCKETS) if by_bucket[o]), 0)
            if by_bucket[b]:
                taken.append(by_bucket[b].pop(0))
        # the slots the profile leaves open: fullest within budget first; a lone over-budget
        # sample (a step of its own cost) only when nothing else is left, cheapest first
        if len(taken) < real:
            rest = [k for ks in by_bucket for k in ks]
            if any(s[2] for s in summaries if s[1] > 0):
                # epoch end: costliest first, so a rank holding more cost (over-budget samples
                # carried this far) spends it while the other ranks still have batches to run
                rest.sort(key=lambda k: (-closed[k].fill, k))
            else:
                rest.sort(key=lambda k: (closed[k].fill > 1.0, abs(1.0 - closed[k].fill), k))
            taken += rest[:real - len(taken)]
        return sorted(taken, key=lambda k: (-closed[k].fill, k))


def default_policy() -> BalancedPolicy:
    """The policy ODB uses unless told otherwise (a fresh instance per rank)."""
    return BalancedPolicy()
