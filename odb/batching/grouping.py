"""Local grouping: split one rank's window into budget-fitting groups (pure; no torch).

Legend
    window  a rank's samples this round, as sizes tuples; a *position* indexes it
    group   positions forming one batch; *closed* when no remaining window
            sample fits into it any more, *open* otherwise (only the last group
            can be open)

`pack` orders the window by single-sample cost, longest first (ties by
position, so the result is a pure function of the window), then fills one
group at a time:

1. take samples from the long end while they fit;
2. when the next long sample does not fit, top the group up from the short
   end while those fit (for a padded cost this adds nothing: the group's
   longest sample fixes its per-sample cost, so the group stays a run of
   consecutive lengths, i.e. length-homogeneous; for packed and quadratic
   costs, which have no padding, it fills the gap the long samples leave);
3. close the group.

A sample over budget on its own is a closed group of one.  The cost is O(W)
model evaluations for the built-in kinds (O(W * group size) for a callable).
"""

from __future__ import annotations

from operator import itemgetter
from typing import NamedTuple, Sequence

import numpy as np

from .base import CostModel, Sizes
from .cost import BudgetCost

__all__ = ["Group", "pack", "order_longest_first"]


class Group(NamedTuple):
    """One group of window positions; `fill` is its cost / budget (largest over resources).
    (A named tuple: a window of 1024 forms hundreds per round, and a frozen dataclass's
    construction alone took 0.2 ms of the round's decision time.)"""

    positions: tuple[int, ...]
    closed: bool
    fill: float


def _weights(window: Sequence[Sizes], cost: CostModel) -> list[float]:
    if isinstance(cost, BudgetCost):
        res = cost.resources
        if len(res) == 1:
            r = res[0]
            i = r.index
            try:  # every sample has this resource (the common case): one C-level pass
                lens = list(map(itemgetter(i), window))
            except IndexError:  # a sample without it has none of it
                lens = [(s[i] if i < len(s) else 0) for s in window]
            return [r.a * L + r.b * L * L for L in lens] if r.kind == "quadratic" else lens
        return [max(r.cost([s]) / r.budget for r in res) for s in window]
    return [cost.utilisation([s]) for s in window]


def order_longest_first(window: Sequence[Sizes], cost: CostModel) -> list[int]:
    """Window positions by single-sample cost, largest first, ties by position."""
    return _longest_first(_weights(window, cost))


def _longest_first(vals: list[float]) -> list[int]:
    """Positions by `vals`, largest first, ties in position order: ``sorted(range(n), key=vals.__getitem__,
    reverse=True)`` (stable also reversed), from a window of 64 on as a stable argsort of the negated values
    (negation is exact for int64 and float64, and the two compare alike: -0.0 ties with 0.0 in both).  Floats
    only below 2^53 in magnitude, where an int among them converts exactly (Python compares int and float
    exactly; a rounded conversion could tie two values the sort orders)."""
    if len(vals) > 64:
        a = np.array(vals)
        if a.dtype.kind == "i" or (a.dtype.kind == "f" and float(np.abs(a).max()) < 2.0 ** 53):  # never NaN
            return np.argsort(-a, kind="stable").tolist()
    return sorted(range(len(vals)), key=vals.__getitem__, reverse=True)


def pack(window: Sequence[Sizes], cost: CostModel, moments: list | None = None) -> list[Group]:
    """Greedy groups of `window` (see the module docstring); every group fits
    unless it is one over-budget sample; closed groups first, in longest-first order.

    :param moments: a list that, under a one-resource packed or quadratic budget, receives
        ``(sum, sum of squares)`` of each group's single-sample costs, one pair per group in
        order, computed in the packing pass (the policy's attention-aware fill reads them
        instead of a second pass over the samples); left empty for every other cost."""
    if not window:
        return []
    vals = _weights(window, cost)  # once: ordering and packing read the same single-sample costs
    order = _longest_first(vals)
    if isinstance(cost, BudgetCost) and len(cost.resources) == 1:
        r = cost.resources[0]
        if r.kind == "padded":
            return _pack_padded(order, vals, r.budget)
        return _pack_additive(order, vals, r.budget, moments)
    return _pack_generic(order, window, cost)


def _pack_padded(order: list[int], vals: list[float], B: float) -> list[Group]:
    out: list[Group] = []
    i, n = 0, len(order)
    while i < n:
        top = vals[order[i]]
        cap = int(B // top) if top > 0 else n
        cap = max(cap, 1)
        g = tuple(order[i:i + cap])
        i += len(g)
        closed = i < n or len(g) == cap
        out.append(_group(Group, (g, closed, len(g) * top / B)))
    return out


_group = tuple.__new__  # a `Group` from its three fields, without NamedTuple's Python-level __new__


def _pack_additive(order: list[int], vals: list[float], B: float, moments: list | None) -> list[Group]:
    out: list[Group] = []
    i, j = 0, len(order) - 1
    while i <= j:
        first = order[i]
        g = [first]
        tot = vals[first]
        sq = tot * tot
        i += 1
        closed = tot > B
        while not closed and i <= j:
            v = vals[order[i]]
            if tot + v <= B:
                g.append(order[i])
                tot += v
                sq += v * v
                i += 1
                continue
            while i <= j and tot + vals[order[j]] <= B:
                v = vals[order[j]]
                g.append(order[j])
                tot += v
                sq += v * v
                j -= 1
            closed = i <= j
            break
        out.append(Group(tuple(g), closed, tot / B))
        if moments is not None:
            moments.append((tot, sq))
    return out


def _pack_generic(order: list[int], window: Sequence[Sizes], cost: CostModel) -> list[Group]:
    out: list[Group] = []
    i, j = 0, len(order) - 1
    while i <= j:
        g = [order[i]]
        i += 1
        closed = not cost.fits([window[p] for p in g])
        while not closed and i <= j:
            if cost.fits([window[p] for p in g] + [window[order[i]]]):
                g.append(order[i])
                i += 1
                continue
            while i <= j and cost.fits([window[p] for p in g] + [window[order[j]]]):
                g.append(order[j])
                j -= 1
            closed = i <= j
            break
        out.append(Group(tuple(g), closed, cost.utilisation([window[p] for p in g])))
    return out
