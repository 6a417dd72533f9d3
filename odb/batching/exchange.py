"""The round exchange's replicated decision: which rank runs which of a round's batches, at which step.

Legend
    N         ranks (the participants of one round; under pooled windows, every rank of every pool)
    S         steps in the round: every rank runs exactly S batches (PAD: fillers included)
    fill      a batch's fill as its rank posted it (any totally ordered numbers; the runtime would post
              ints), or None for a zero-weight filler
    slot      ``(rank, step)``: where a batch was formed (its origin) or where it runs (its place)

`exchange_plan(fills)` re-deals one round's real batches across the ranks by decreasing fill, so that
the batches of one step are neighbours in fill on every rank, not only within one rank's window:

1. the real batches of every rank, sorted by (decreasing fill, origin rank, origin step);
2. the first N go to step 0, the next N to step 1, and so on; the steps left over run fillers;
3. within a step, a batch stays on its origin rank when that rank is still free in the step (the first
   of its batches in the order of rule 1 stays), and the others go to the free ranks in increasing rank
   order, in the order of rule 1.  Whole batches move, never a part of one.

**Budget balance** (``slack`` > 0, in basis points; the loader's ``exchange_slack``): rule 1's order makes a
step's batches neighbours in step time (the fill), not in budget cost, so a step can hold one batch of a few long
samples and one of many short ones, alike in time and far apart in budget.  With a slack each fill is a key
(`pack_key`): the step-time fill and the budget fill (attention 0).  A round's cost is the sum over its steps of
the step's largest step-time fill.  The plan starts from rule 1's order and, for K = ``MAX_BLOCK`` down to 2:

    cuts rule 1's order into blocks of K N batches (K steps; the last may be shorter, and is left out if it is
    one step); each block none of whose steps was re-sorted at a larger K would cost some extra re-sorted by
    (decreasing budget fill, origin rank, origin step); those blocks are re-sorted so in increasing extra (ties:
    in order), each while the round's cost stays at most ``(1 + slack / 10,000)`` times rule 1's (integer
    arithmetic)

and runs rules 2 and 3 on the result.  So a round spends at most that share of its step time on budget balance,
on the blocks where it buys the most balance for the least time; a round whose every block would cost more keeps
rule 1.  (Until 2026-12-05 a round took one K for all its blocks, or none:
``docs/decisions/2026-12-05-exchange-budget-balance.md``.)

The plan reads the gathered fills and nothing else, so every rank that gathered the same fills computes
the same plan: a rank sends exactly the batches the others expect from it, and every batch runs exactly
once (`check_plan` checks both on any plan).  The rank core runs it (`odb.core.rank`, a layout with
``exchange``, the table's flush round for the pass's last round), in the simulation and in the loader
(``ODBDataLoader(exchange=True)``, its transfer in `odb.runtime.transport`).
`paper_repro.scale_grid.exchange_schedule` applies it to simulated rounds with float fills.
``docs/decisions/2026-12-05-exchange-design.md`` gives the design and its costs,
``docs/decisions/2026-12-05-exchange-budget-balance.md`` budget balance.

`batch_fill` is the fill a rank posts for one batch: the policy's (attention-aware) fill of the batch as a
group of its own, as an int (x ``COST_SCALE``); with budget balance it posts `batch_key`.  `rank_fills` turns the
P gathered pool rows of fills
(pool batch order) into the N ranks' rows of the plan (pool batch k is lane ``k mod G``'s step
``k div G``; a slot past the round's target, or a filler, is None).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .grouping import Group
from .intake import COST_SCALE
from .policy import aligned_fill

__all__ = ["exchange_plan", "plan_origins", "check_plan", "moved", "batch_fill", "batch_key", "pack_key",
           "unpack_key", "rank_fills", "rank_fill_array", "runs_on", "NO_FILL", "KEY_SHIFT", "MAX_BLOCK"]

NO_FILL = -1  # a header's fill for a filler or an absent slot
_KEY_BITS = 24
KEY_SHIFT = 1 << _KEY_BITS  # a key's budget fill takes the low bits: fills to 16.7 budgets (x COST_SCALE)
MAX_BLOCK = 4  # the largest block (in steps) budget balance re-sorts: 2-4 measured, docs/decisions
_MAX_FILL = 1 << 38  # a key's step-time fill is clamped below this (int64 with the shift): 274,877 budgets


def batch_fill(sizes: Sequence, cost, attention: float) -> int:
    """One batch's fill as posted: ``round(fill * COST_SCALE)`` of the batch (a list of sample sizes) packed as
    one group, with the policy's attention (`odb.batching.policy.aligned_fill`)."""
    sizes = list(sizes)
    g = Group(tuple(range(len(sizes))), True, cost.utilisation(sizes))
    return int(round(aligned_fill([g], sizes, cost, attention)[0].fill * COST_SCALE))


def pack_key(fill: int, budget_fill: int) -> int:
    """A budget-balance key: the step-time `fill` in the high bits, `budget_fill` in the low 24, each clamped
    (a batch that far over budget is an oversize sample run alone; clamped, such batches tie and go by origin)."""
    if fill < 0 or budget_fill < 0:
        raise ValueError(f"a key needs fills >= 0, got {fill} and {budget_fill}")
    return min(int(fill), _MAX_FILL - 1) * KEY_SHIFT + min(int(budget_fill), KEY_SHIFT - 1)


def unpack_key(key: int) -> tuple[int, int]:
    """`pack_key` undone: ``(fill, budget fill)``."""
    return divmod(int(key), KEY_SHIFT)


def batch_key(sizes: Sequence, cost, attention: float, slack: int) -> int:
    """What a rank posts for one batch: `batch_fill` without budget balance (``slack == 0``), else the
    `pack_key` of its step-time fill and its budget fill (module docstring)."""
    if not slack:
        return batch_fill(sizes, cost, attention)
    return pack_key(batch_fill(sizes, cost, attention), batch_fill(sizes, cost, 0.0))


def rank_fills(pool_fills: np.ndarray, lanes: int, target: int) -> list[list]:
    """The plan's ``fills[rank][step]`` from the pools' gathered fills (``(P, W)``, pool batch order) for a
    round of `target` pool batches: ``ceil(target / lanes)`` steps a rank (module docstring)."""
    return [[None if v < 0 else v for v in row] for row in rank_fill_array(pool_fills, lanes, target).tolist()]


def rank_fill_array(pool_fills: np.ndarray, lanes: int, target: int) -> np.ndarray:
    """`rank_fills` as the ``(N, steps)`` int64 array that `plan_origins` reads, `NO_FILL` for a filler."""
    P = pool_fills.shape[0]
    steps = -(-int(target) // lanes)
    a = np.full((P, steps * lanes), NO_FILL, dtype=np.int64)
    a[:, :target] = pool_fills[:, :target]
    return a.reshape(P, steps, lanes).transpose(0, 2, 1).reshape(P * lanes, steps)

Slot = tuple[int, int]


def exchange_plan(fills: Sequence[Sequence], slack: int = 0) -> list[list[Slot | None]]:
    """``plan[rank][step]``: the origin slot of the batch that `rank` runs at `step`, or None for a filler
    (module docstring).  `fills[rank][step]`: the fill of the batch formed there (with a `slack`, its
    `pack_key`), or None for a filler; every rank has the same number of steps.  Fills are ints (within int64)
    or floats; with a slack, the ints of `pack_key`.  `slack`: budget balance's share of step time, in basis
    points (0: none).  Raises ValueError on rows of different lengths, a fill that is not such a number, or a
    negative slack.  `plan_origins` is the same plan on an array, as the rank core reads it."""
    n = len(fills)
    if n == 0:
        return []
    steps = len(fills[0])
    if any(len(row) != steps for row in fills):
        raise ValueError(f"every rank runs the same number of steps in a round, got {[len(r) for r in fills]}")
    vals = [f for row in fills for f in row if f is not None]
    if not all(isinstance(f, (int, float, np.integer, np.floating)) for f in vals):
        raise ValueError(f"fills must be numbers or None: {sorted({type(f).__name__ for f in vals})}")
    ints = all(isinstance(f, (int, np.integer)) for f in vals)
    try:
        v = np.array(vals, dtype=np.int64 if ints else np.float64)
    except OverflowError as e:
        raise ValueError(f"fills must be numbers or None within int64: {e}") from None
    real = np.array([f is not None for row in fills for f in row], dtype=bool)
    origin = _origins(np.flatnonzero(real), v, n, steps, slack, ints)
    return [[None if o < 0 else divmod(o, steps) for o in row] for row in origin.tolist()]


def plan_origins(fills: np.ndarray, slack: int = 0) -> np.ndarray:
    """`exchange_plan` on an ``(N, S)`` int64 array (`rank_fill_array`; a fill < 0 is a filler): ``origin[rank,
    step]``, the origin slot of the batch run there as ``origin_rank * S + origin_step``, -1 for a filler."""
    n, steps = fills.shape
    flat = fills.ravel()
    real = np.flatnonzero(flat >= 0)
    return _origins(real, flat[real], n, steps, slack, True)


def runs_on(origins: np.ndarray) -> np.ndarray:
    """`plan_origins`' plan inverted: for each origin slot ``r * S + k``, the rank that runs its batch (-1: a
    filler slot, which runs nowhere)."""
    flat = origins.ravel()
    placed = flat >= 0
    out = np.full(flat.size, -1, dtype=np.int64)
    out[flat[placed]] = np.flatnonzero(placed) // origins.shape[1]
    return out


def _origins(real: np.ndarray, v: np.ndarray, n: int, steps: int, slack: int, ints: bool) -> np.ndarray:
    """The plan (module docstring) as ``origin[rank, step]`` (`plan_origins`): `real`, the origin slots of the
    real batches as ``rank * steps + step``, increasing; `v`, their fills."""
    if slack < 0:
        raise ValueError(f"the slack is a share of step time, >= 0; got {slack}")
    # rule 1: decreasing fill; a stable sort keeps ties in origin (rank, step) order (`real` is increasing), so
    # the order is total and the same on every rank
    by = _decreasing(v, ints)
    if slack:
        if not ints or (v < 0).any():
            raise ValueError("budget balance needs the keys of pack_key (ints >= 0)")
        by = _balanced(by, v, n, int(slack))
    order = real[by]
    plan = np.full(n * steps, -1, dtype=np.int64)  # flat: rank * steps + step
    L = len(order)
    if L == 0:
        return plan.reshape(n, steps)
    pos = np.arange(L)
    step, rank = pos // n, order // steps  # rule 2: the next N of the order run at the next step
    where = step * n + rank  # rule 3: a rank keeps the first of its own in the step
    first = np.full(steps * n, L, dtype=np.int64)
    np.minimum.at(first, where, pos)
    stay = first[where] == pos
    kept = np.flatnonzero(stay)
    plan[rank[kept] * steps + step[kept]] = order[kept]
    taken = np.zeros(steps * n, dtype=bool)  # step * n + rank
    taken[where[kept]] = True
    moving = np.flatnonzero(~stay)
    if len(moving):  # the others, in the order's order, to the free ranks of their step in increasing order
        go = step[moving]
        free = np.flatnonzero(~taken)  # by step, then rank
        nth = np.arange(len(go)) - np.searchsorted(go, go)
        slot = free[np.searchsorted(free // n, go) + nth]
        plan[(slot % n) * steps + go] = order[moving]
    return plan.reshape(n, steps)


def _stable_order(key: np.ndarray) -> np.ndarray:
    """The stable ascending permutation of `key` (int64 >= 0, or uint64): a least-significant-digit radix sort, a stable
    sort of 16-bit digits a pass (numpy sorts those in linear time); a few passes beat one comparison sort of
    int64 from a few thousand batches up (docs/decisions/2026-12-05-exchange-decision-time.md)."""
    bits = int(key.max()).bit_length() if len(key) else 0
    idx = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
    for shift in range(16, bits, 16):
        idx = idx[np.argsort(((key[idx] >> shift) & 0xFFFF).astype(np.uint16), kind="stable")]
    return idx


def _decreasing(v: np.ndarray, ints: bool) -> np.ndarray:
    """The stable permutation of `v` by decreasing value (rule 1): int64 fills by `_stable_order` on their
    distance below the largest, in uint64 (any two int64 are less than 2^64 apart); floats by numpy's stable sort."""
    if not ints:
        return np.argsort(-v, kind="stable")
    if len(v) == 0:
        return np.arange(0)
    return _stable_order(v.max().astype(np.uint64) - v.astype(np.uint64))


def _balanced(by: np.ndarray, keys: np.ndarray, n: int, slack: int) -> np.ndarray:
    """Budget balance (module docstring): `keys` in origin order and `by`, rule 1's permutation of them, to the
    permutation with rule 1's blocks re-sorted by budget, largest blocks first and the cheapest of each size
    first, while the round's step-time cost stays within the slack of rule 1's."""
    L = len(by)
    if L == 0:
        return by
    fill = keys >> _KEY_BITS
    starts = np.arange(0, L, n)
    steps = len(starts)
    # every block's re-sort at once: by (decreasing budget fill, origin) over the whole round, then for each K,
    # stably by block (the block of a batch: its place in rule 1's order, div K N)
    by_budget = _stable_order((KEY_SHIFT - 1) - (keys & (KEY_SHIFT - 1)))
    rank1 = np.empty(L, dtype=np.int64)
    rank1[by] = np.arange(L)
    place = rank1[by_budget]
    base = np.maximum.reduceat(fill[by], starts)  # each step's largest step-time fill under rule 1
    room = slack * int(base.sum())  # the step time budget balance may add to the round, x 10,000
    out, taken = by.copy(), np.zeros(steps, dtype=bool)
    for K in range(MAX_BLOCK, 1, -1):
        cand = by_budget[_stable_order(place // (K * n))]
        blocks = np.arange(0, steps, K)
        extra = np.add.reduceat(np.maximum.reduceat(fill[cand], starts) - base, blocks)
        free = np.flatnonzero(~np.logical_or.reduceat(taken, blocks))  # no step re-sorted at a larger K
        if steps % K == 1:  # a last block of one step: re-sorted, it runs the same batches at that step
            free = free[free != len(blocks) - 1]
        for b in free[np.argsort(extra[free], kind="stable")].tolist():  # the cheapest first; ties in order
            cost = 10_000 * int(extra[b])
            if cost > room:
                break  # the blocks left cost as much or more
            room -= cost
            out[b * K * n:(b + 1) * K * n] = cand[b * K * n:(b + 1) * K * n]
            taken[b * K:(b + 1) * K] = True
    return out


def check_plan(fills: Sequence[Sequence], plan: Sequence[Sequence[Slot | None]]) -> None:
    """Raise AssertionError unless `plan` runs every real batch of `fills` exactly once, one batch per rank
    and step, in as many steps, and fillers nowhere else."""
    n, steps = len(fills), len(fills[0]) if fills else 0
    assert len(plan) == n and all(len(row) == steps for row in plan), "the plan changes the ranks or the steps"
    real = sorted((r, k) for r, row in enumerate(fills) for k, f in enumerate(row) if f is not None)
    ran = sorted(s for row in plan for s in row if s is not None)
    assert ran == real, "a batch is lost, repeated or invented"


def moved(plan: Sequence[Sequence[Slot | None]]) -> list[list[Slot]]:
    """For each rank, the origin slots of the batches it runs and did not form: what it receives."""
    return [[s for s in row if s is not None and s[0] != r] for r, row in enumerate(plan)]
