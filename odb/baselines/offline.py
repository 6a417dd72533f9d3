"""Standard, GMT, BMT and the step lower bound (see the package docstring).

Legend
    sizes   the dataset's samples as sizes tuples (``sizes[i][0]`` = tokens), i.e.
            the exact post-pipeline lengths an offline method reads from a cache
    N       world size; B a resource's budget
    step    one optimizer step: one batch per rank
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

from ..batching.base import CostModel, Sizes
from ..batching.cost import BudgetCost
from ..batching.grouping import order_longest_first
from ..errors import ConfigError

__all__ = ["Schedule", "ScheduleSampler", "standard", "memory_equivalent_batch_size", "global_max_tokens",
           "bucketed_max_tokens", "step_lower_bound", "batch_lower_bound", "deal", "greedy_batches", "checked_world"]

Schedule = list[list[list[int] | None]]  # schedule[rank][step] -> dataset indices, or None (filler)


def checked_world(world_size: int) -> int:
    """`world_size`, checked: a positive int (ConfigError otherwise)."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be a positive int, got {world_size!r}")
    return world_size


def deal(batches: Sequence[list[int]], world_size: int) -> Schedule:
    """Deal `batches` to ranks in order: step s holds batches ``s*N .. s*N+N-1``
    (consecutive batches of a sorted packing have similar costs, which is the
    best case for stragglers); the last step is topped up with fillers."""
    n = checked_world(world_size)
    steps = math.ceil(len(batches) / n)
    return [[list(batches[s * n + r]) if s * n + r < len(batches) else None for s in range(steps)]
            for r in range(n)]


def standard(num_samples: int, world_size: int, batch_size: int = 1) -> Schedule:
    """Fixed batch size over a strided shard (rank r takes indices r, r+N, ...,
    as ``DistributedSampler(shuffle=False, drop_last=False)`` does on pre-shuffled
    data, except that a short rank gets fillers instead of repeated samples)."""
    n = checked_world(world_size)
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    shards = [list(range(r, num_samples, n)) for r in range(n)]
    rows = [[s[i:i + batch_size] for i in range(0, len(s), batch_size)] for s in shards]
    steps = max(len(r) for r in rows) if rows else 0
    return [r + [None] * (steps - len(r)) for r in rows]


def memory_equivalent_batch_size(sizes: Sequence[Sizes], cost: CostModel) -> int:
    """Largest fixed batch size b whose worst case (b copies of the costliest
    sample) fits the budget; 1 if even one does not fit."""
    if not sizes:
        return 1
    worst = max(sizes, key=lambda s: cost.utilisation([s]))
    lo, hi = 1, 1
    while cost.fits([worst] * (hi * 2)) and hi < 1 << 20:
        hi *= 2
    hi *= 2
    while lo + 1 < hi:  # invariant: lo fits (or is 1), hi does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost.fits([worst] * mid) else (lo, mid)
    return lo


def greedy_batches(indices: Sequence[int], sizes: Sequence[Sizes], cost: CostModel) -> list[list[int]]:
    """Sort `indices` longest first, then next-fit: close a batch when the next sample does not fit."""
    sub = [sizes[i] for i in indices]
    order = [indices[p] for p in order_longest_first(sub, cost)]
    out: list[list[int]] = []
    cur: list[int] = []
    if isinstance(cost, BudgetCost):
        res = cost.resources
        cnt, mx, tot = 0, [0.0] * len(res), [0.0] * len(res)
        for i in order:
            s = sizes[i]
            ok = True
            for k, r in enumerate(res):
                L = s[r.index] if r.index < len(s) else 0
                c = (cnt + 1) * max(mx[k], L) if r.kind == "padded" else tot[k] + r.item(s)
                ok = ok and c <= r.budget
            if cur and not ok:
                out.append(cur)
                cur, cnt, mx, tot = [], 0, [0.0] * len(res), [0.0] * len(res)
            cur.append(i)
            cnt += 1
            for k, r in enumerate(res):
                mx[k] = max(mx[k], s[r.index] if r.index < len(s) else 0)
                tot[k] += r.item(s)
    else:
        for i in order:
            if cur and not cost.fits([sizes[j] for j in cur] + [sizes[i]]):
                out.append(cur)
                cur = []
            cur.append(i)
    if cur:
        out.append(cur)
    return out


def global_max_tokens(sizes: Sequence[Sizes], cost: CostModel, world_size: int) -> Schedule:
    """GMT: sort the whole dataset by cost, pack greedily under the budget, deal to ranks."""
    return deal(greedy_batches(range(len(sizes)), sizes, cost), world_size)


def bucketed_max_tokens(sizes: Sequence[Sizes], cost: CostModel, world_size: int,
                        bucket: int = 4096) -> Schedule:
    """BMT: GMT inside consecutive buckets of `bucket` samples (dataset order), batches concatenated."""
    if bucket < 1:
        raise ConfigError(f"bucket must be >= 1, got {bucket}")
    batches: list[list[int]] = []
    for b0 in range(0, len(sizes), bucket):
        batches += greedy_batches(range(b0, min(b0 + bucket, len(sizes))), sizes, cost)
    return deal(batches, world_size)


def batch_lower_bound(sizes: Sequence[Sizes], cost: CostModel) -> int:
    """No partition of `sizes` into budget-respecting batches has fewer batches.

    A sample that cannot share a batch even with the elementwise-smallest sample
    (over budget, or e.g. longer than B/2 under a padded cost) needs a batch of
    its own; the rest need at least ``ceil(sum of single-sample costs / B)``
    batches per resource when the cost is additive-bounded (every built-in
    kind: a batch never costs less than the sum of its samples' costs).
    """
    if not sizes:
        return 0
    width = max(len(s) for s in sizes)
    smallest = tuple(min((s[k] if k < len(s) else 0) for s in sizes) for k in range(width))
    alone = [not cost.fits([s, smallest]) for s in sizes]
    rest = [s for s, a in zip(sizes, alone) if not a]
    lb = sum(alone)
    if not rest:
        return lb
    additive = getattr(cost, "additive_lower_bound", lambda: False)()
    if not additive:
        return lb + 1
    per = [sum(r.cost([s]) for s in rest) / r.budget for r in cost.resources]
    return lb + max(1, math.ceil(max(per) - 1e-9))


def step_lower_bound(sizes: Sequence[Sizes], cost: CostModel, world_size: int) -> int:
    """``ceil(batch_lower_bound / N)``: no schedule on N ranks has fewer steps."""
    return math.ceil(batch_lower_bound(sizes, cost) / checked_world(world_size))


class ScheduleSampler:
    """One rank's row of a `Schedule` as a ``batch_sampler`` (fillers skipped; they
    exist only to keep step counts equal, which a DataLoader cannot express)."""

    def __init__(self, schedule: Schedule, rank: int):
        if not 0 <= rank < len(schedule):
            raise ConfigError(f"rank {rank} is outside the schedule's {len(schedule)} ranks")
        self._row = [b for b in schedule[rank] if b is not None]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(list(b) for b in self._row)

    def __len__(self) -> int:
        return len(self._row)
