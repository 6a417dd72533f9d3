"""The default cross-rank alignment policy: full groups only, a common minimum target.

Legend
    n_r     rank r's window size this round (carry included)
    f_r     closed (full) groups rank r can form from its window (`grouping.pack`)
    c_r     all groups of rank r's window, the open one included
    x_r     rank r's data source is exhausted
    T       the round's target: batches per rank

Why this policy.  A DDP step lasts as long as its slowest rank, so every batch
of a step should cost about the same.  The released package aligned ranks to the
*largest* group count and padded the others by peeling single samples into
singleton batches (plus a forced singleton per window), which wastes budget and
creates stragglers.  Here the target is the *smallest* need:

    T = max(1, min over ranks with n_r > 0 of (c_r if x_r else f_r))

so every rank with data emits T groups that are full (closed) as long as it has
them; a rank with more full groups carries the surplus (it is emitted in a later
round, never dropped), and a partial (open) group is only emitted when its rank's
source is exhausted or when the rank has no full group at all (a window too
small for the budget).  No sample is peeled into a singleton.

Within a round a rank with more full groups than ``T`` emits its ``T`` fullest
and carries the rest; every rank emits its groups in decreasing cost, so the
k-th batch of every rank has a similar cost (all ranks draw from the same
length distribution).

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

__all__ = ["BalancedPolicy", "default_policy", "SUMMARY_TAG"]

SUMMARY_TAG = 0x0DB1  # identifies this policy's summary layout (version 1)


class BalancedPolicy:
    """Full groups, minimum-need target, cost-ordered emission (see the module docstring).

    Summary layout (``summary_len = 6`` ints):
    ``[SUMMARY_TAG, n, exhausted, closed groups, all groups, mean closed fill in 1/1000]``.
    `propose` is deterministic and does not depend on rank order (a minimum
    over ranks); it raises ProtocolError on a summary of another layout (ranks
    running different policies).  Holds a one-entry memo of the last packing (a pure cache: the
    same window always packs the same way), so `summarize` and the following
    `partition` of one round pack once.
    """

    summary_len = 6

    def __init__(self) -> None:
        self._memo: tuple[tuple, object, list[Group]] | None = None

    # -- helpers ---------------------------------------------------------------
    def groups(self, window: Sequence[Sizes], cost: CostModel) -> list[Group]:
        key = tuple(window)
        m = self._memo
        if m is not None and m[1] is cost and m[0] == key:
            return m[2]
        g = pack(window, cost)
        self._memo = (key, cost, g)
        return g

    # -- AlignmentPolicy -------------------------------------------------------
    def summarize(self, window: Sequence[Sizes], cost: CostModel, exhausted: bool) -> list[int]:
        gs = self.groups(window, cost)
        closed = [g for g in gs if g.closed]
        fill = int(round(1000 * sum(g.fill for g in closed) / len(closed))) if closed else 0
        return [SUMMARY_TAG, len(window), int(bool(exhausted)), len(closed), len(gs), fill]

    def propose(self, summaries: Sequence[Sequence[int]], window: int) -> int:
        need = []
        for r, s in enumerate(summaries):
            if len(s) != self.summary_len or s[0] != SUMMARY_TAG:
                raise ProtocolError(
                    f"rank {r} posted a summary {list(s)} that is not BalancedPolicy's "
                    f"(length {self.summary_len}, tag {SUMMARY_TAG}); the ranks would decide differently; "
                    "use the same alignment policy on every rank")
            n, exhausted, closed, total = s[1], s[2], s[3], s[4]
            if n > 0:
                need.append(total if exhausted else closed)
        return max(1, min(need)) if need else 1

    def partition(self, window: Sequence[Sizes], target: int, real: int, cost: CostModel) -> list[list[int]]:
        if not 0 <= real <= len(window):
            raise ProtocolError(f"partition asked for {real} groups from a window of {len(window)}")
        if real == 0:
            return []
        gs = self.groups(window, cost)
        closed = [g for g in gs if g.closed]
        if real <= len(closed):
            # the `real` fullest closed groups, in decreasing fill; a poorly filled one is
            # carried and emitted when the rank has nothing better (every rank does the same,
            # so poor groups of different ranks tend to meet in the same steps)
            pick = sorted(range(len(closed)), key=lambda k: (-closed[k].fill, k))[:real]
            return [list(closed[k].positions) for k in pick]
        chosen = [list(g.positions) for g in gs[:real]]  # every closed group, then the open one
        while len(chosen) < real:  # more groups than the window forms: split the largest
            i = max(range(len(chosen)), key=lambda k: (len(chosen[k]), -k))
            g = chosen[i]
            half = (len(g) + 1) // 2
            chosen[i:i + 1] = [g[:half], g[half:]]
        return sorted(chosen, key=lambda g: -cost.utilisation([window[p] for p in g]))

def default_policy() -> BalancedPolicy:
    """The policy ODB uses unless told otherwise (a fresh instance per rank)."""
    return BalancedPolicy()
