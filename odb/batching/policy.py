"""The default cross-rank alignment policy: full groups, a common minimum target, a shared cost profile.

Legend
    n_r     rank r's window size this round (carry included)
    f_r     closed (full) groups rank r can form from its window (`grouping.pack`)
    c_r     all groups of rank r's window, the open one included
    x_r     rank r's data source is exhausted
    T       the round's target: batches per rank
    u       a group's cost / budget (`CostModel.utilisation`), its *fill*
    h_r[b]  rank r's closed groups whose fill falls in bucket b (`fill_bucket`)

Why this policy.  A DDP step lasts as long as its slowest rank, so every batch
of a step should cost about the same.  The released package aligned ranks to the
*largest* group count and padded the others by peeling single samples into
singleton batches (plus a forced singleton per window), which wastes budget and
creates stragglers.  Here the target starts from the *smallest* need

    need = max(1, min over ranks with n_r > 0 of (c_r if x_r else f_r))

so every rank with data emits groups that are full (closed) as long as it has
them; a rank with more full groups carries the surplus (emitted in a later
round, never dropped), and a partial (open) group is only emitted when its
rank's source is exhausted or when the rank has no full group at all (a window
too small for the budget).  No sample is peeled into a singleton.

The shared cost profile.  Every rank's summary carries the histogram ``h_r`` of
its closed groups' fills (`fill_bucket`: widths of 0.025 of the budget from 0.5
to 1, coarser above the budget for lone over-budget samples).  From the gathered
summaries, identical on every rank, each rank computes the same *profile*
(`profile`): for every bucket, costliest first, ``min over ranks with data of
h_r[b]`` slots, cut to ``need``.  Every rank can fill each slot with a group of
exactly that bucket, so the k-th batches of all ranks cost within 0.025 of the
budget of each other.  The target is then

    T = len(profile)     if no rank with data is exhausted and 2 len(profile) >= need
    T = need             otherwise

(where, while data flows in a window of 256 or more, the reservoir below first
halves ``need``), i.e. while data flows a round emits only the slots every rank can match, and a
group of a bucket that some rank lacks (typically a long sample whose padded
batch is half empty, or a lone over-budget sample) is carried until every rank
with data holds one of that bucket.  When the profile covers less than half the
need, limiting T to it would carry so much that the window's intake starves
(measured: W = 64 under a 16384 padded budget took 71 steps instead of 63), so
T stays the need and the slots the profile leaves open take each rank's
remaining closed group nearest to a full budget, over-budget samples last.  At
the epoch end (some rank with data exhausted) they take the costliest first
instead, so a rank holding more cost spends it while the others still run.
Over-budget buckets are matched by count: a profile slot of bucket 0 takes each
rank's costliest lone over-budget sample.  Within a bucket the group
with the fewest padding tokens goes first, so the padding-heavy ones are
carried and re-packed with the next samples (for a padded cost that is what
lowers the step count).  Without summaries (``summaries=None``) the `real`
fullest closed groups are taken.  Every rank emits its groups in decreasing
fill, so slot k holds the k-th costliest group on every rank.

The reservoir.  While data flows, with a window of at least 256 samples
(``window`` as passed to `propose`) and a need of at least 4, the need is
halved (rounded up) before the profile is taken: each rank emits only its
better half of groups (the profile's matched slots, fewest padding tokens
first) and carries the rest, which meet the next intake and re-pack with more
similar lengths.  Measured on the default grid (``paper_repro.bench``, 2026-11,
against the same policy without it): ODB steps down at 50 of 135 points and up
at one (+1 step), steps <= 1.10 x GMT missed at 8/90 instead of 9 (worst 1.257
instead of 1.286), <= 1.05 x GMT at 5/45 instead of 6, straggler efficiency
>= 0.97 missed at 65/135 instead of 66, packed budget use >= 0.95 missed at
22/45 instead of 23; no worst point regressed.  Windows under 256 keep the full
need: halving there starves the intake (measured: up to +8 steps at W = 64)
like a short profile does (above).

Known limits (measured in ``paper_repro/results/quality_sim_*.md``): carried
over-budget samples gather at the epoch end, where ranks hold different numbers
of them; and no policy can beat the shard ceiling (mean over max of the ranks'
total cost), which DistributedSampler shards of skewed lengths set below 0.97.

The proposal reads only the gathered summaries, so it is the same on every
rank; the table clamps it to ``[1, hi]``.  `partition` works for any ``real``
(``1 <= real <= len(window)``), also when the clamp or a filler-padded PAD tail
asks for more groups than the window has: it then splits the largest groups
(never below one sample each).
"""

from __future__ import annotations

from typing import Sequence

from ..errors import ProtocolError
from .base import CostModel, Sizes
from .grouping import Group, pack

__all__ = ["BalancedPolicy", "default_policy", "SUMMARY_TAG", "NUM_BUCKETS", "OVER", "fill_bucket"]

SUMMARY_TAG = 0x0DB2  # identifies this policy's summary layout (version 2: fill histogram)
# Bucket upper edges in 1/1000 of the budget, costliest first: over budget in 6 steps (a lone
# over-budget sample may cost up to several budgets), then widths of 0.025 down to 0.5, then the rest.
_EDGES = (10**9, 3000, 2000, 1500, 1250, 1100) + tuple(range(1000, 475, -25))
NUM_BUCKETS = len(_EDGES)
OVER = 6  # buckets 0 .. OVER-1 hold lone over-budget samples; the profile matches them by count
_HEAD = 5  # [tag, n, exhausted, closed groups, all groups], then the fill histogram
# The reservoir (module docstring): while data flows, a window of at least _RESERVOIR_W samples
# whose every rank holds at least _RESERVOIR_NEED full groups emits only half of them.
_RESERVOIR_W = 256
_RESERVOIR_NEED = 4


def fill_bucket(fill: float) -> int:
    """Bucket of a group's fill (cost / budget), 0 the costliest: bucket b holds fills in
    ``(_EDGES[b+1], _EDGES[b]]`` thousandths; the last bucket holds 0.5 and less."""
    milli = int(round(1000 * fill))
    for b in range(len(_EDGES) - 1):
        if milli > _EDGES[b + 1]:
            return b
    return NUM_BUCKETS - 1


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
    (minima over ranks); both raise ProtocolError on a summary of another layout
    (ranks running different policies).  Holds a one-entry memo of the last
    packing (a pure cache: the same window always packs the same way), so
    `summarize` and the following `partition` of one round pack once.
    """

    summary_len = _HEAD + NUM_BUCKETS

    def __init__(self) -> None:
        self._memo: tuple[tuple, object, list[Group]] | None = None

    # -- helpers ---------------------------------------------------------------
    def groups(self, window: Sequence[Sizes], cost: CostModel) -> list[Group]:
        """`grouping.pack` of the window (memoized for the last window)."""
        key = tuple(window)
        m = self._memo
        if m is not None and m[1] is cost and m[0] == key:
            return m[2]
        g = pack(window, cost)
        self._memo = (key, cost, g)
        return g

    def profile(self, summaries: Sequence[Sequence[int]], target: int) -> list[int]:
        """The round's shared profile: a non-increasing-cost list of fill buckets, at most
        `target` long, that every rank with data can fill from its closed groups.

        A pure function of the gathered summaries (identical on every rank, independent of
        rank order).  Raises ProtocolError on a summary of another layout.
        """
        _check(summaries, self.summary_len)
        live = [s for s in summaries if s[1] > 0]
        out: list[int] = []
        if not live:
            return out
        # over budget: slots every rank can fill with one of its lone over-budget samples (each
        # rank takes its costliest ones, so these slots align by cost rank, not by bucket)
        out += [0] * min(sum(s[_HEAD:_HEAD + OVER]) for s in live)
        mins = [min(col) for col in zip(*(s[_HEAD + OVER:] for s in live))]  # per bucket, over ranks
        for b, m in enumerate(mins, start=OVER):
            if len(out) >= target:
                break
            out += [b] * m
        return out[:target]

    # -- AlignmentPolicy -------------------------------------------------------
    def summarize(self, window: Sequence[Sizes], cost: CostModel, exhausted: bool) -> list[int]:
        """This rank's summary (layout in the class docstring); pure in its arguments."""
        gs = self.groups(window, cost)
        hist = [0] * NUM_BUCKETS
        for g in gs:
            if g.closed:
                hist[fill_bucket(g.fill)] += 1
        return [SUMMARY_TAG, len(window), int(bool(exhausted)), sum(hist), len(gs), *hist]

    def propose(self, summaries: Sequence[Sequence[int]], window: int) -> int:
        """The round's target ``T`` (module docstring) from the gathered summaries and the window
        size ``W`` (the same on every rank; it switches the reservoir): deterministic, rank-order
        free, at least 1.  Raises ProtocolError on a summary of another layout."""
        _check(summaries, self.summary_len)
        need = [(s[4] if s[2] else s[3]) for s in summaries if s[1] > 0]
        if not need:
            return 1
        t = max(1, min(need))
        if any(s[2] for s in summaries if s[1] > 0):
            return t  # epoch end: exhausted ranks flush every group, the profile no longer binds
        if window >= _RESERVOIR_W and t >= _RESERVOIR_NEED:
            t = (t + 1) // 2  # emit the better half, carry the rest as a reservoir (module docstring)
        p = len(self.profile(summaries, t))
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
        gs = self.groups(window, cost)
        closed = [g for g in gs if g.closed]
        if real <= len(closed):
            pick = self._pick(window, closed, real, summaries, target)
            return [list(closed[k].positions) for k in pick]
        chosen = [list(g.positions) for g in gs[:real]]  # every closed group, then the open one
        while len(chosen) < real:  # more groups than the window forms: split the largest
            i = max(range(len(chosen)), key=lambda k: (len(chosen[k]), -k))
            g = chosen[i]
            half = (len(g) + 1) // 2
            chosen[i:i + 1] = [g[:half], g[half:]]
        return sorted(chosen, key=lambda g: -cost.utilisation([window[p] for p in g]))

    def _pick(self, window: Sequence[Sizes], closed: list[Group], real: int,
              summaries: Sequence[Sequence[int]] | None, target: int) -> list[int]:
        """Indices into `closed` of the `real` groups to emit, in decreasing fill."""
        def tokens(k: int) -> int:
            return sum(window[p][0] if window[p] else 0 for p in closed[k].positions)

        if summaries is None:
            rank = sorted(range(len(closed)), key=lambda k: (-closed[k].fill, k))
            return rank[:real]
        # per bucket: fewest padding tokens first (real tokens per unit of cost), then position
        by_bucket: list[list[int]] = [[] for _ in range(NUM_BUCKETS)]
        for k in sorted(range(len(closed)), key=lambda k: (-tokens(k) / max(closed[k].fill, 1e-12), k)):
            by_bucket[fill_bucket(closed[k].fill)].append(k)
        taken: list[int] = []
        for b in self.profile(summaries, max(target, real))[:real]:
            if b == 0:  # an over-budget slot: this rank's costliest over-budget sample
                b = next((o for o in range(OVER) if by_bucket[o]), 0)
            if by_bucket[b]:
                taken.append(by_bucket[b].pop(0))
        # the slots the profile leaves open: fullest within budget first; a lone over-budget
        # sample (a step of its own cost) only when nothing else is left, cheapest first
        if any(s[2] for s in summaries if s[1] > 0):
            # epoch end: costliest first, so a rank holding more cost (over-budget samples
            # carried this far) spends it while the other ranks still have batches to run
            left = sorted((k for ks in by_bucket for k in ks), key=lambda k: (-closed[k].fill, k))
        else:
            left = sorted((k for ks in by_bucket for k in ks),
                          key=lambda k: (closed[k].fill > 1.0, abs(1.0 - closed[k].fill), k))
        taken += left[:real - len(taken)]
        return sorted(taken, key=lambda k: (-closed[k].fill, k))


def default_policy() -> BalancedPolicy:
    """The policy ODB uses unless told otherwise (a fresh instance per rank)."""
    return BalancedPolicy()
