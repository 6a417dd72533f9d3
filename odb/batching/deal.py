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
    class r  the positions ``total - 1 - (N k + r)``, k = 0, 1, ...: rank r's own
             reserve, counted from the end of the order
    stolen_r positions of class r that rank r took itself (cumulative)

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
* a rank that has consumed every position dealt to it before the next deal
  (possible only through drops) does not stop: between deals it takes the
  next position of its own class from the end of the order, as long as that
  position lies at or past the dealer's cursor (so nobody was dealt it and no
  other rank can take it: classes are disjoint), and reports ``stolen_r`` in
  its next header; every replica then skips those positions.  A rank whose
  class is used up too is *dry*: its source ends and it is dealt nothing more.
  If every rank is dry, every class is used up past the cursor, so nothing is
  left: no position is ever lost or given twice.

What is left uneven at the end is the unknown cost of the ``lead`` positions
each rank holds dealt but not yet measured at the end game, about
``sqrt(lead) * CV`` samples' worth, instead of ``sqrt(shard) * CV`` with fixed
shards: dealing helps when shards are much longer than the window (measured
in ``paper_repro/results/quality_sim_*.md``).

Why the lead is a whole window.  A shorter lead leaves less unmeasured at the
end game but makes ranks take their reserve in steady state, and reserve
positions come from the end of the order, unmeasured and not levelled.
Measured (2026-11, the benchmark grid's 180 points, a simulation that takes the
reserve as the runtime does; not kept): a lead of W/2 for windows of 256 and
more cut the dealt straggler misses from 89 to 76, but single points moved by
-0.050 to +0.034.  At the worst one (mmmix, 16 ranks, W = 1024, 16384 padded)
the ranks took 8,457 of 32,768 positions from their reserves before the end
game, which then had 250 positions left to level, and the ceiling mean/max of
the ranks' total cost fell from 0.975 to 0.917.  What would help is a lead
that bounds each rank's next intake without the reserve: ``W - n_r`` plus the
samples in the rank's T largest groups, once the round's target T is known.
Every rank would then post in its header the number of samples in its T
largest groups for T = 1, 2, 3, 4, 6, 8, 12, ... (the dealer rounds the round's
T up to the next of them).  Simulated that
way on the 120 grid points with W >= 256, the mean straggler efficiency rose by
0.005, and the points whose dealt ceiling is below 0.97 fell from 25 to 14.

`Dealer` is pure (no torch): the runtime feeds it the gathered ``taken``,
``cost``, ``dry`` and ``stolen`` of each round; the benchmark's simulation
feeds ``taken`` and ``cost`` (its ranks drop nothing).
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence

from .base import CostModel, Sizes
from .cost import BudgetCost

__all__ = ["Dealer", "COST_SCALE", "sample_cost"]

COST_SCALE = 1_000_000  # per-sample costs travel in headers as ints: round(cost * COST_SCALE)


def sample_cost(cost: CostModel) -> Callable[[Sizes], int]:
    """``sizes -> round(cost.utilisation([sizes]) * COST_SCALE)``: one sample's cost as the header
    carries it; for a one-resource padded or packed cost, the same without the generic call."""
    if isinstance(cost, BudgetCost) and len(cost.resources) == 1 and cost.resources[0].kind != "quadratic":
        r = cost.resources[0]
        i, k = r.index, COST_SCALE / r.budget
        return lambda s: round((s[i] if i < len(s) else 0) * k)
    return lambda s: round(cost.utilisation([s]) * COST_SCALE)


class Dealer:
    """Deals positions ``0 .. total-1`` to ``world`` ranks; identical on every rank given identical inputs."""

    def __init__(self, total: int, world: int, lead: int):
        if total < 0 or world < 1 or lead < 1:
            raise ValueError(f"Dealer needs total >= 0, world >= 1, lead >= 1 (got {total}, {world}, {lead})")
        self.total, self.world, self.lead = int(total), int(world), int(lead)
        self.cursor = 0                               # every position before it is dealt or stolen
        self.dealt = [0] * self.world                 # positions given to each rank so far (stolen included)
        self.stolen = [0] * self.world                # class positions each rank took itself (as gathered)
        self.closed = [False] * self.world            # the rank ran dry: deal it nothing more
        self.rounds = 0

    # -- positions ---------------------------------------------------------------
    def _stolen_at(self, p: int) -> bool:
        k = self.total - 1 - p
        return k // self.world < self.stolen[k % self.world]

    def _skip(self) -> None:
        while self.cursor < self.total and self._stolen_at(self.cursor):
            self.cursor += 1

    @property
    def left(self) -> int:
        """Positions neither dealt nor stolen."""
        span = self.total - 1 - self.cursor  # class positions at or past the cursor: N k + r <= span
        taken_back = sum(min(s, (span - r) // self.world + 1) for r, s in enumerate(self.stolen) if span >= r)
        return self.total - self.cursor - taken_back

    def undealt(self) -> list[int]:
        """The positions neither dealt nor stolen, in order."""
        return [p for p in range(self.cursor, self.total) if not self._stolen_at(p)]

    @property
    def done(self) -> bool:
        """Every position has been dealt or stolen."""
        return self.left == 0

    def steal_position(self, rank: int, k: int) -> int | None:
        """The position of rank `rank`'s k-th steal (its class, from the end), or None if that one was
        already dealt (it lies before the cursor): the rank is then dry."""
        p = self.total - 1 - (self.world * k + rank)
        return p if p >= self.cursor else None

    # -- deals ---------------------------------------------------------------------
    def start(self) -> list[list[int]]:
        """The first deal, before any cost is known: ``lead`` each, round robin (fewer if short)."""
        out: list[list[int]] = [[] for _ in range(self.world)]
        for _ in range(self.lead):
            for r in range(self.world):
                if self.cursor < self.total:  # nothing is stolen before the first deal
                    out[r].append(self._give(r))
        return out

    def deal(self, taken: Sequence[int], cost: Sequence[int], dry: Sequence[int] | None = None,
             stolen: Sequence[int] | None = None) -> list[list[int]]:
        """One round's deal from the gathered ``taken`` counts, ``cost`` sums (ints, `COST_SCALE`),
        ``dry`` flags (a rank whose source ended early gets nothing more, ever) and ``stolen``
        counts (cumulative; module docstring)."""
        dry = [0] * self.world if dry is None else list(dry)
        stolen = self.stolen if stolen is None else list(stolen)
        if not len(taken) == len(cost) == len(dry) == len(stolen) == self.world:
            raise ValueError(f"deal needs {self.world} taken, cost, dry and stolen values, got "
                             f"{len(taken)}, {len(cost)}, {len(dry)} and {len(stolen)}")
        for r in range(self.world):
            if stolen[r] < self.stolen[r]:
                raise ValueError(f"rank {r} reports {stolen[r]} stolen after {self.stolen[r]}")
            self.dealt[r] += stolen[r] - self.stolen[r]
            if not 0 <= taken[r] <= self.dealt[r]:
                raise ValueError(f"rank {r} reports {taken[r]} taken of {self.dealt[r]} given")
            if dry[r]:
                self.closed[r] = True
        self.stolen = [int(v) for v in stolen]
        self._skip()
        self.rounds += 1
        out: list[list[int]] = [[] for _ in range(self.world)]
        left = self.left
        live = [r for r in range(self.world) if not self.closed[r]]
        if left == 0 or not live:
            return out
        pend = [self.dealt[r] - taken[r] for r in range(self.world)]
        need = {r: max(0, self.lead - pend[r]) for r in live}
        if left > sum(need.values()):
            for r in live:
                out[r] = self._give_many(r, need[r])
            return out
        n_taken = sum(taken)
        mu = sum(cost) / n_taken if n_taken else float(COST_SCALE)
        heap = [(cost[r] + pend[r] * mu, r) for r in live]
        heapq.heapify(heap)
        for _ in range(left):  # each give takes one position neither dealt nor stolen
            est, r = heapq.heappop(heap)
            out[r].append(self._give(r))
            heapq.heappush(heap, (est + mu, r))
        return out

    def _give_many(self, r: int, k: int) -> list[int]:
        if not any(self.stolen):  # nothing taken from the end yet: the next k positions in one piece
            out = list(range(self.cursor, self.cursor + k))
            self.cursor += k
            self.dealt[r] += k
            return out
        return [self._give(r) for _ in range(k)]

    def _give(self, r: int) -> int:
        p = self.cursor
        self.cursor += 1
        self.dealt[r] += 1
        self._skip()
        return p

    def state_dict(self) -> dict:
        return {"total": self.total, "world": self.world, "lead": self.lead, "cursor": self.cursor,
                "dealt": list(self.dealt), "stolen": list(self.stolen), "closed": list(self.closed),
                "rounds": self.rounds}

    def load_state_dict(self, state: dict) -> None:
        if (state["total"], state["world"]) != (self.total, self.world):
            raise ValueError(f"dealer state is for total={state['total']} world={state['world']}, "
                             f"not total={self.total} world={self.world}")
        self.lead, self.cursor, self.rounds = int(state["lead"]), int(state["cursor"]), int(state["rounds"])
        self.dealt = [int(v) for v in state["dealt"]]
        self.stolen = [int(v) for v in state["stolen"]]
        self.closed = [bool(v) for v in state["closed"]]
