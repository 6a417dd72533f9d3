"""Pooled windows: the G ranks of a pool run one window of G x W samples and share its batches.

Legend
    N, G, P   ranks in the loader's group, ranks per pool (``pool_size``), pools (``P = N / G``);
              pool p holds the ranks ``p G .. p G + G - 1`` (consecutive ranks: under torchrun, a host's)
    lane j    the j-th rank of its pool (``rank mod G``)
    T         a round's target, in pool batches; the table runs with P participants and ``W_pool = G W``
    k         a pool batch's index in its round (decreasing fill, `odb.batching.policy` rule 5)

Every rank of a pool runs the same `odb.core.rank.RankCore` replica on the same dealt positions
(dealt sharding deals to the P pools), so each preprocesses and measures every sample of its pool;
no sample moves between processes.  Pool batch k goes to lane ``k mod G`` as that lane's batch
``k div G`` of the round (`lane_of`), so one step's batches on a pool's ranks are neighbours in fill,
and only pools align through the round collective.  A lane left one batch short in a round
(``T mod G`` lanes get one more) runs a zero-weight filler there (`odb.core.rank.RankCore`), so every rank runs
``ceil(T / G)`` steps a round; `lane_proposal` makes T a multiple of G wherever the table allows it.

The round collective still runs over all N ranks.  `pool_rows` turns the N gathered headers into the
P rows the table and the replicated decision read: a pool's lanes must post identical headers (same
positions, same measured sizes), except that any lane's stop status stops its pool.  A difference is a
`ProtocolError` on every rank in that round (every rank gathered the same rows), before any batch the
diverged replicas placed is released: preprocessing that is not deterministic (a random crop that
changes the token count) cannot be pooled.  Each lane posts the loss counts of its own batches only,
at its own step index, so their sum over the N ranks is each step's global count, in ``3 W`` ints.

A rank's counters (``loader.stats``: drops, empty and over-budget samples, budget use, rounds) count its
pool's samples and batches, so each of a pool's ranks reports the same; its steps, samples and tokens are
its own batches'.

Cost against the gain (measured in ``docs/decisions/2026-12-02-pooled-windows.md``): each rank
preprocesses G times the samples it trains on, and holds a window of G W samples.  Pure: no torch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ConfigError, ProtocolError
from .header import Header, Headers

__all__ = ["check_pool", "pool_rows", "pool_aheads", "lane_of", "lane_proposal", "lane_steps"]


def check_pool(world_size: int, lanes: int, mode: str, sharding: str, aheads: Sequence[int] = ()) -> None:
    """ConfigError unless `lanes` ranks per pool can run here: they divide the world, PAD mode (every
    lane runs the same steps a round), dealt sharding (the pool's lanes read one dealt order), and the
    lanes of a pool read ahead alike (`aheads`, every rank's prefetch as gathered: a source reads its
    i-th key when its core takes item ``i - ahead``, so a lane that reads further ahead would take a
    reserve position in another round than its pool's other lanes)."""
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
        raise ConfigError(f"pool_size={lanes!r} is not valid: it must be an int >= 1 (ranks sharing one window)")
    if lanes == 1:
        return
    if world_size % lanes:
        raise ConfigError(f"pool_size={lanes} does not divide the {world_size} ranks of the loader's group; use "
                          "the ranks per host (torchrun's --nproc-per-node) or 1")
    if mode != "pad":
        raise ConfigError(f"pool_size={lanes} needs mode='pad' (got {mode!r}): a pool's ranks split each round's "
                          "batches and run zero-weight fillers where the split is uneven")
    if sharding != "dealt":
        raise ConfigError(f"pool_size={lanes} needs dealt sharding (got {sharding!r}): every rank of a pool reads "
                          "the pool's dealt positions; a sampler or an IterableDataset decides each rank's own")
    for p in range(len(aheads) // lanes):
        mine = list(aheads[p * lanes:(p + 1) * lanes])
        if len(set(mine)) > 1:
            raise ConfigError(f"pool_size={lanes}: ranks {p * lanes}..{p * lanes + lanes - 1} read ahead "
                              f"{mine} samples (num_workers x prefetch_factor); a pool's ranks must read its "
                              "samples in step, so give them the same num_workers and prefetch_factor")


def pool_aheads(aheads: Sequence[int], lanes: int) -> tuple[int, ...]:
    """Each pool's prefetch for the dealer: the largest of its lanes' (gathered at construction)."""
    return tuple(max(aheads[p * lanes:(p + 1) * lanes]) for p in range(len(aheads) // lanes))


def pool_rows(rows: Headers, lanes: int, round_index: int, fills_read: int | None = None) -> Headers:
    """The P pool rows of N gathered headers (module docstring): lane 0's header with the largest stop
    status of its lanes.  ProtocolError, on every rank alike, if a pool's lanes posted different headers
    while none of them stops.  ``fills_read`` (the round exchange): how many of the header's fill slots the
    plan reads (the held round's target; the rest hold `NO_FILL`); only those are compared, with every other
    field: a pool window's G W fills are most of the header (1,024 of 1,087 ints at W = 128, G = 8), and
    comparing them all read 9 MB a round at 1,024 ranks (docs/decisions/2026-12-05-exchange-decision-time.md)."""
    if lanes == 1:
        return rows
    if len(rows) % lanes:
        raise ProtocolError(f"round {round_index}: {len(rows)} headers do not make pools of {lanes}")
    a = rows.array.reshape(len(rows) // lanes, lanes, -1)  # pool, lane, field
    st = a[:, :, rows.layout.index["st"]].max(axis=1)
    live = st == 0
    if live.any():  # a pool none of whose lanes stops: every lane must have posted lane 0's header
        read = a if fills_read is None else a[:, :, :rows.layout._fills + fills_read]
        b = read if live.all() else read[live]  # (every pool runs but at the end: no copy)
        if (b[:, 1:] != b[:, :1]).any():  # one pass; the pool and lane at fault are found only then
            p, j = np.nonzero((b != b[:, :1]).any(axis=2))
            p, j = int(np.flatnonzero(live)[p[0]]), int(j[0])
            h, h0 = rows[p * lanes + j], rows[p * lanes]
            bad = [f for f in Header._fields if getattr(h, f) != getattr(h0, f)]
            raise ProtocolError(
                f"pooled ranks diverged in round {round_index}: rank {p * lanes + j} posted other "
                f"{bad} than rank {p * lanes} of its pool. A pool's ranks must preprocess and measure "
                "its samples alike (deterministic preprocessing, the same length_fn and oversize); "
                "every rank stops in this round. Use pool_size=1 for preprocessing that is random")
    at = rows.layout.index["st"]
    if (a[:, 0, at] == st).all():  # lane 0's headers are the pools' as they are: a view, not a copy of the
        return Headers(rows.layout, a[:, 0])  # unread fill slots (most of a pooled header, cold from the gather)
    out = a[:, 0].copy()
    out[:, at] = st
    return Headers(rows.layout, out)


def lane_proposal(proposal: int, lanes: int, hi: int) -> int:
    """The round's proposal as a multiple of `lanes` (the nearest, ties up, at least `lanes`), within the
    table's upper bound `hi` (the pool window, itself a multiple): a replicated decision that reads the
    policy's proposal and the compared pool size only."""
    if lanes == 1:
        return proposal
    return min(hi, lanes * max(1, (2 * proposal + lanes) // (2 * lanes)))


def lane_of(k: int, lanes: int) -> tuple[int, int]:
    """(lane, its step in the round) of pool batch `k`."""
    return k % lanes, k // lanes


def lane_steps(batches: int, lanes: int) -> int:
    """Steps every lane runs in a round of `batches` pool batches."""
    return -(-batches // lanes)
