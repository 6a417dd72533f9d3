"""The released package's (0.1.2) grouping and alignment, RE-IMPLEMENTED FROM ITS DESCRIPTION.

For comparison only (``paper_repro.bench`` runs it through the same table and
metrics as ODB's own policy).  This is not the released code: it follows the
description in ``shared/FACTS.md`` section 2:

* sort the window by token length, walk longest-first; the first group of every
  window is the single longest sample (a forced singleton); each next group
  holds ``budget // (length of the sample that closed the previous group)``
  samples (budget = batch size x longest, i.e. padded tokens of resource 0);
* target ``T`` = the largest group count over ranks, clipped by the smallest
  number of samples any rank with data holds;
* a rank with fewer groups peels single samples off its longest multi-sample
  group into singleton groups until it has ``T``; a rank with more defers its
  last groups to the next window.

It satisfies the `AlignmentPolicy` contract, so the runtime checks hold for it too.
"""

from __future__ import annotations

from typing import Sequence

from ..batching.base import AlignmentPolicy, CostModel, Sizes
from ..errors import ProtocolError

__all__ = ["ReleasePolicy", "RELEASE_TAG"]

RELEASE_TAG = 0x0DB0


def _budget(cost: CostModel) -> float:
    b = getattr(cost, "budgets", None)
    if not b:
        raise ProtocolError(f"ReleasePolicy needs a cost model with `budgets`, got {cost!r}")
    return b[0]


class ReleasePolicy(AlignmentPolicy):
    """See the module docstring.  Summary: ``[RELEASE_TAG, n, exhausted, groups]``."""

    summary_len = 4

    def _runs(self, window: Sequence[Sizes], cost: CostModel) -> list[list[int]]:
        """The window's groups by the release's rule (module docstring), as window positions."""
        if not window:
            return []
        B = _budget(cost)
        order = sorted(range(len(window)), key=lambda p: (-window[p][0], p))
        out = [[order[0]]]                       # forced singleton: the longest sample alone
        prev = window[order[0]][0]
        i = 1
        while i < len(order):
            size = max(1, int(B // prev)) if prev > 0 else len(order)
            g = order[i:i + size]
            out.append(g)
            prev = window[g[-1]][0]
            i += len(g)
        return out

    def summarize(self, window: Sequence[Sizes], cost: CostModel, exhausted: bool) -> list[int]:
        return [RELEASE_TAG, len(window), int(bool(exhausted)), len(self._runs(window, cost))]

    def propose(self, summaries: Sequence[Sequence[int]], window: int) -> int:
        live = [s for s in summaries if s[1] > 0]
        if any(len(s) != self.summary_len or s[0] != RELEASE_TAG for s in summaries):
            raise ProtocolError("ranks posted summaries of different policies; use ReleasePolicy on every rank")
        if not live:
            return 1
        return max(1, min(max(s[3] for s in live), min(s[1] for s in live)))

    def partition(self, window: Sequence[Sizes], target: int, real: int, cost: CostModel, *,
                  summaries=None) -> list[list[int]]:
        gs = [list(g) for g in self._runs(window, cost)]
        while len(gs) < real:                   # peel singletons off the longest multi-sample group
            k = next(k for k, g in enumerate(gs) if len(g) > 1)
            gs.insert(k + 1, [gs[k].pop()])
        return gs[:real]                        # defer the rest to the next window
