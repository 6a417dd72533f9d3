"""k-way number partitioning: Karmarkar-Karp's largest differencing method, and LPT for reference (pure).

Legend
    values  one non-negative weight per item (a sample's workload); items are indexed 0..n-1
    k       the number of buckets; a *state* is k buckets, each a (sum, items) pair

`karmarkar_karp` (the largest differencing method, k-way, as verl and OpenRLHF describe it):

1. every item starts as a state of its own: its bucket holds it, the other k-1 are empty
   (``equal_size``: the items sorted by weight, largest first, are cut into runs of k and each run
   is one state with one item per bucket, so every bucket of every state holds as many items);
2. take the two states whose spread (largest bucket sum - smallest) is widest;
3. merge them bucket by bucket, the heaviest bucket of one with the lightest of the other;
4. repeat until one state is left: its buckets are the partition.

Ties are broken by item count (at equal sums, the bucket with fewer items is the lighter), then by
creation order, so the result is a pure function of its arguments, and with at least as many buckets
as items every item is alone, zero weights included.  LDM is a heuristic: it is usually better than
LPT, not always (`lpt` is here so tests can compare).
"""

from __future__ import annotations

import heapq
import math
import numbers
from typing import Sequence

from ..errors import ConfigError

__all__ = ["karmarkar_karp", "lpt", "bucket_sums"]


def _check(values: Sequence[float], k) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k must be a positive int, got {k!r}")
    bad = [i for i, v in enumerate(values)
           if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0]
    if bad:
        raise ConfigError(f"values must be finite non-negative numbers; item {bad[0]} is {values[bad[0]]!r}")


def _state(buckets: list[tuple[float, list[int]]]) -> list[tuple[float, list[int]]]:
    # heaviest first; at equal sums more items counts as heavier, so zero weights spread over the buckets too
    return sorted(buckets, key=lambda b: (-b[0], -len(b[1])))


def karmarkar_karp(values: Sequence[float], k: int, equal_size: bool = False) -> list[list[int]]:
    """`k` buckets of item indices (some empty when there are fewer than k items), heaviest first.

    With ``equal_size`` the bucket sizes differ by at most one (exactly equal when k divides
    the number of items: zero-weight placeholders pad the last run and are dropped after).
    """
    _check(values, k)
    n = len(values)
    heap: list[tuple[float, int, list[tuple[float, list[int]]]]] = []
    if equal_size:
        order = sorted(range(n), key=lambda i: (-values[i], i))
        order += [-1] * (-n % k)  # placeholders, so every run has k items
        runs = [order[j:j + k] for j in range(0, len(order), k)]
        states = [_state([(values[i] if i >= 0 else 0.0, [i] if i >= 0 else []) for i in run]) for run in runs]
    else:
        states = [_state([(float(values[i]), [i])] + [(0.0, []) for _ in range(k - 1)]) for i in range(n)]
    for seq, s in enumerate(states):
        heapq.heappush(heap, (-(s[0][0] - s[-1][0]), seq, s))
    seq = len(states)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = _state([(a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]) for j in range(k)])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), seq, merged))
        seq += 1
    if not heap:
        return [[] for _ in range(k)]
    return [sorted(items) for _, items in heap[0][2]]


def lpt(values: Sequence[float], k: int) -> list[list[int]]:
    """Longest processing time first: items by weight, largest first, each into the lightest bucket."""
    _check(values, k)
    heap = [(0.0, j) for j in range(k)]
    out: list[list[int]] = [[] for _ in range(k)]
    for i in sorted(range(len(values)), key=lambda i: (-values[i], i)):
        total, j = heapq.heappop(heap)
        out[j].append(i)
        heapq.heappush(heap, (total + values[i], j))
    return out


def bucket_sums(values: Sequence[float], buckets: Sequence[Sequence[int]]) -> list[float]:
    """Each bucket's total weight."""
    return [sum(values[i] for i in b) for b in buckets]
