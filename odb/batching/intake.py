"""A rank's intake, from gathered values only: what one sample costs as a header carries it, the intake ladder a
rank posts, and the bound on what it may take into its window before the next deal (`odb.batching.deal.Dealer`
tops every rank up to it).

Legend
    N        ranks; W the window (samples a rank packs per round)
    need_r   what rank r may take into its window before the next deal (`round_needs`):
             ``W - n_r + U_r(T) + ahead_r + 1``, n_r its window at the post, U_r(T) the samples in its T largest
             groups (posted as `intake_ladder`), ahead_r its prefetch
"""

from __future__ import annotations

from bisect import bisect_left
from functools import lru_cache
from typing import Callable, NamedTuple, Sequence

import numpy as np

from .base import CostModel, Sizes
from .cost import BudgetCost
from .grouping import Group

__all__ = ["COST_SCALE", "sample_cost", "sample_fits", "intake_ladder", "intake_sizes", "policy_intake",
           "intake_bound", "first_lead", "Posted", "round_needs"]

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
