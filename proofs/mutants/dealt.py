"""Seeded bugs of dealt sharding (the dealer and the glue around it), each with the property expected to catch it.

Legend
    DealtMutant.model   a `models.dealt.DealtModel` subclass: a glue bug overrides one of its
                        hooks (`lead`, `needs`, `posted_deal`); a dealer bug swaps `order_cls` for a
                        `DealtOrder` whose `Dealer` (or `key`) has the bug, derived from the real
                        class by overriding one method (never a copied dealer)
    expected            the dealt property (verdict name) that must fail
    scopes              `DEALT_MUTANT_SCOPES`, tried in order until the expected killer fails;
                        a kill is a verdict with result "failed" only (`proofs.mutants.check.KILL`)

Each is a bug a runtime could have; the first two are the one the runtime had (each replica fed
its own rank's prefetch instead of the gathered values, so replicas diverged).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from models.dealt import COST, RET, DealtModel
from models.scopes import DealtScope
from odb.batching.deal import Dealer
from odb.batching.dealt_order import DealtOrder
from odb.batching.intake import intake_bound, round_needs

from ..explicit.dealt import check_dealt_scope
from .check import KILL, MutantResult

__all__ = ["DealtMutant", "DEALT_MUTANTS", "DEALT_MUTANT_SCOPES", "check_dealt_mutant", "dealt_by_name"]

# Small: two ranks with different prefetch (the glue bugs), then three ranks (the reserve classes).
DEALT_MUTANT_SCOPES = (
    DealtScope(aheads=(0, 1), w=1, totals=tuple(range(0, 9)), modes=(0,)),
    DealtScope(aheads=(0, 0, 0), w=1, totals=tuple(range(0, 9)), modes=(0,)),
)


@dataclass(frozen=True)
class DealtMutant:
    name: str
    doc: str
    model: type
    expected: str


# -- glue bugs ------------------------------------------------------------------------------------
class _LeadFromOwnPrefetch(DealtModel):
    def lead(self, rank):
        return self.c.W + self.c.aheads[rank] + 1


class _NeedsFromOwnPrefetch(DealtModel):
    def needs(self, rank, target, posted):
        return round_needs(self.c.W, target, posted, [self.c.aheads[rank]] * self.c.n)


class _NeedsWithoutPrefetch(DealtModel):
    def needs(self, rank, target, posted):
        return [intake_bound(self.c.W, n, ladder, target) for n, ladder in posted]


class _DryNotPosted(DealtModel):
    def posted_deal(self, rk, replica):
        return rk[RET], rk[COST], 0, replica["reserve_taken"]


class _ReserveNotPosted(DealtModel):
    def posted_deal(self, rk, replica):
        return rk[RET], rk[COST], int(replica["dry"]), 0


# -- dealer bugs ----------------------------------------------------------------------------------
class _NoCursorCheckDealer(Dealer):
    def reserve_position(self, rank, k):  # the k-th position of the class, even one already dealt
        p = self.total - 1 - (self.world * k + rank)
        return p if p >= 0 else None


class _NoSkipDealer(Dealer):
    def _skip(self):  # reserve positions at the cursor are dealt again
        pass


class _LeftWithoutReserveDealer(Dealer):
    @property
    def left(self):  # forgets to subtract the reserve takes at or past the cursor
        return self.total - self.cursor


def _order_with(dealer_cls: type) -> type:
    class _Order(DealtOrder):
        def __init__(self, keys, world_size, rank, lead, stats=None):
            super().__init__(keys, world_size, rank, lead, stats)
            self.dealer = dealer_cls(len(self.order), world_size, lead)
    _Order.__name__ = f"DealtOrder[{dealer_cls.__name__}]"
    return _Order


class _ReserveBelowCursor(DealtModel):
    order_cls = _order_with(_NoCursorCheckDealer)


class _DealerForgetsToSkip(DealtModel):
    order_cls = _order_with(_NoSkipDealer)


class _LeftWithoutReserve(DealtModel):
    order_cls = _order_with(_LeftWithoutReserveDealer)


DEALT_MUTANTS: tuple[DealtMutant, ...] = (
    DealtMutant("lead_from_own_prefetch",
                "each replica's first lead uses its own rank's prefetch (W + ahead_r + 1), not the gathered "
                "maximum: replicas with different prefetch deal differently from the start",
                _LeadFromOwnPrefetch, "replicas_agree"),
    DealtMutant("needs_from_own_prefetch",
                "each replica computes every rank's need with its own rank's prefetch instead of the gathered "
                "values: the replicas' deals diverge, positions are given twice or never",
                _NeedsFromOwnPrefetch, "replicas_agree"),
    DealtMutant("needs_without_prefetch",
                "the need is the intake bound alone (no prefetch, no slack): a prefetching rank reads past "
                "its dealt keys and takes its reserve with nothing dropped",
                _NeedsWithoutPrefetch, "reserve_only_after_a_drop_or_overrun"),
    DealtMutant("dry_not_posted",
                "the header's dry flag is always 0: a rank whose source ended is still dealt keys it never reads",
                _DryNotPosted, "an_ended_source_is_dealt_nothing_more"),
    DealtMutant("reserve_not_posted",
                "the header's reserve count is always 0: the dealer never learns of reserve takes",
                _ReserveNotPosted, "no_position_held_twice"),
    DealtMutant("reserve_below_the_cursor",
                "Dealer.reserve_position forgets 'at or past the cursor': a rank takes a reserve position "
                "that was already dealt to another rank",
                _ReserveBelowCursor, "no_position_held_twice"),
    DealtMutant("dealer_forgets_to_skip_reserve",
                "Dealer._skip does nothing: the cursor deals positions that ranks took from their reserves",
                _DealerForgetsToSkip, "no_position_held_twice"),
    DealtMutant("left_ignores_reserve_takes",
                "Dealer.left is total - cursor: reserve takes ahead of the cursor are counted as left, so the "
                "end game deals past the end of the order",
                _LeftWithoutReserve, "left_counts_the_undealt_positions"),
)


def dealt_by_name(name: str) -> DealtMutant:
    for m in DEALT_MUTANTS:
        if m.name == name:
            return m
    raise KeyError(f"no dealt mutant {name!r}; mutants: {[m.name for m in DEALT_MUTANTS]}")


def check_dealt_mutant(m: DealtMutant, *, scopes: tuple[DealtScope, ...] = DEALT_MUTANT_SCOPES,
                       max_states: int = 1_000_000) -> MutantResult:
    """The dealt verdicts of `m` at `scopes`, the first scope that kills it as expected last."""
    t0 = time.perf_counter()
    out = MutantResult(m.name, m.doc, m.expected, symbolic="n/a (dealt model)")
    verdicts, cexs = [], []
    for scope in scopes:
        res = check_dealt_scope(scope, model_cls=m.model, max_states=max_states, max_cex=50, stop_at=m.expected)
        verdicts += res.verdicts
        cexs += res.counterexamples
        out.scopes.append(str(scope))
        if any(v.result == KILL and v.property == m.expected for v in res.verdicts):
            break
    out.killers = sorted({f"{v.property}/{v.mode}" for v in verdicts if v.result == KILL})
    out.counterexample = next((text for key, text in cexs if key.split("/")[0] == m.expected), "")
    out.seconds = time.perf_counter() - t0
    return out
