"""Dynamic sharding: deal one global sample order to the ranks online, by measured cost.

Legend
    N        ranks; ``total`` positions ``0 .. total-1`` of the epoch's global order
    lead     how many dealt-but-not-taken positions every rank must hold after a
             deal while the order is not used up: ``W + P`` (window + the inner
             DataLoader's prefetch), the most a rank can pull before the next deal
    taken_r  positions rank r has pulled into its window so far (cumulative)
    cost_r   their summed per-sample cost (measured after preprocessing)
    pend_r   dealt to rank r and not yet taken: ``dealt_r - taken_r``
    mu       the mean measured cost per sample so far, over all ranks
    est_r    rank r's expected total intake: ``cost_r + pend_r * mu``

Why.  With fixed shards (DistributedSampler) every rank must process its own
shard, so the epoch's steps are set by the costliest shard and no alignment can
beat the *shard ceiling* mean/max of the shards' total costs (e.g. 0.95 at 16
ranks, 1024 samples each, CV 1.0).  Dealing positions of one shared order as
ranks consume them removes that ceiling without moving a sample between ranks:
each rank still preprocesses what it is dealt, and only positions travel (as
arithmetic every rank repeats, not as messages).

The rule, a function of globally gathered numbers only (so every rank computes
the same deal and every position goes to exactly one rank):

* while more positions are left than the ranks need, every rank is topped up
  to ``pend_r = lead``, so no rank runs dry before the order is used up (its
  source never reports a false end) unless it drops samples (None, empty,
  skipped oversize), which do not fill its window;
* otherwise (the end game) everything left is dealt now, one position at a
  time to the rank with the lowest ``est_r``, so the ranks' expected totals end
  level; a rank dealt nothing more drains its window and ends, as with a
  short shard;
* a rank whose source did end early (``dry``: it consumed every position dealt
  to it, through drops) is dealt nothing more; the others take the rest.

What is left uneven at the end is the unknown cost of the ``lead`` positions
each rank holds dealt but not yet measured at the end game, about
``sqrt(lead) * CV`` samples' worth, instead of ``sqrt(shard) * CV`` with fixed
shards: dealing helps when shards are much longer than the window (measured
in ``paper_repro/results/quality_sim_*.md``).

`Dealer` is pure (no torch): the runtime feeds it the gathered ``taken`` and
``cost`` of each round; the benchmark's simulation does the same.
"""

from __future__ import annotations

import heapq
from typing import Sequence

__all__ = ["Dealer", "COST_SCALE"]

COST_SCALE = 1_000_000  # per-sample costs travel in headers as ints: round(cost * COST_SCALE)


class Dealer:
    """Deals positions ``0 .. total-1`` to ``world`` ranks; identical on every rank given identical inputs."""

    def __init__(self, total: int, world: int, lead: int):
        if total < 0 or world < 1 or lead < 1:
            raise ValueError(f"Dealer needs total >= 0, world >= 1, lead >= 1 (got {total}, {world}, {lead})")
        self.total, self.world, self.lead = int(total), int(world), int(lead)
        self.cursor = 0                               # next undealt position
        self.dealt = [0] * self.world                 # positions dealt to each rank so far
        self.closed = [False] * self.world            # the rank's source ended early: deal it nothing more
        self.rounds = 0

    @property
    def done(self) -> bool:
        """Every position has been dealt."""
        return self.cursor >= self.total

    def start(self) -> list[list[int]]:
        """The first deal, before any cost is known: ``lead`` each, round robin (fewer if short)."""
        out: list[list[int]] = [[] for _ in range(self.world)]
        for _ in range(self.lead):
            for r in range(self.world):
                if self.cursor < self.total:
                    out[r].append(self._give(r))
        return out

    def deal(self, taken: Sequence[int], cost: Sequence[int], dry: Sequence[int] | None = None) -> list[list[int]]:
        """One round's deal from the gathered ``taken`` counts, ``cost`` sums (ints, `COST_SCALE`)
        and ``dry`` flags (a rank whose source already ended gets nothing more, ever)."""
        dry = [0] * self.world if dry is None else list(dry)
        if len(taken) != self.world or len(cost) != self.world or len(dry) != self.world:
            raise ValueError(f"deal needs {self.world} taken, cost and dry values, got "
                             f"{len(taken)}, {len(cost)} and {len(dry)}")
        for r in range(self.world):
            if not 0 <= taken[r] <= self.dealt[r]:
                raise ValueError(f"rank {r} reports {taken[r]} taken of {self.dealt[r]} dealt")
            if dry[r]:
                self.closed[r] = True
        self.rounds += 1
        out: list[list[int]] = [[] for _ in range(self.world)]
        left = self.total - self.cursor
        live = [r for r in range(self.world) if not self.closed[r]]
        if left == 0 or not live:
            return out
        pend = [self.dealt[r] - taken[r] for r in range(self.world)]
        need = {r: max(0, self.lead - pend[r]) for r in live}
        if left > sum(need.values()):
            for r in live:
                for _ in range(need[r]):
                    out[r].append(self._give(r))
            return out
        n_taken = sum(taken)
        mu = sum(cost) / n_taken if n_taken else float(COST_SCALE)
        heap = [(cost[r] + pend[r] * mu, r) for r in live]
        heapq.heapify(heap)
        while self.cursor < self.total:
            est, r = heapq.heappop(heap)
            out[r].append(self._give(r))
            heapq.heappush(heap, (est + mu, r))
        return out

    def _give(self, r: int) -> int:
        p = self.cursor
        self.cursor += 1
        self.dealt[r] += 1
        return p

    def state_dict(self) -> dict:
        return {"total": self.total, "world": self.world, "lead": self.lead, "cursor": self.cursor,
                "dealt": list(self.dealt), "closed": list(self.closed), "rounds": self.rounds}

    def load_state_dict(self, state: dict) -> None:
        if (state["total"], state["world"]) != (self.total, self.world):
            raise ValueError(f"dealer state is for total={state['total']} world={state['world']}, "
                             f"not total={self.total} world={self.world}")
        self.lead, self.cursor, self.rounds = int(state["lead"]), int(state["cursor"]), int(state["rounds"])
        self.dealt = [int(v) for v in state["dealt"]]
        self.closed = [bool(v) for v in state["closed"]]
