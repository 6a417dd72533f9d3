"""The named properties of dealt sharding in the checked model (`models.dealt`), for the explicit engine.

Kinds as in `models.properties`: ``always`` (a state invariant; a reachable state that violates it
is a counterexample) and ``sometimes`` (a witness the engine must reach in some scope).  Each
``always`` property names its witnesses, and each witness is about the property's premise (stated
beside it).  The predicates read a state only through `models.dealt.RankView` (one per rank) and
the replica information of `models.dealt.Replicas`, so they see what the real `DealtOrder`
objects hold.  A ``per_rank`` predicate reads one rank (``holds(view, total)``): an ``always`` one
must hold of every rank, a ``sometimes`` one of some rank (the engine memoises it per view); the
others read every rank (``holds(views, total)``).

Legend (per rank r of a state)
    keys_r      positions dealt to r or taken from its reserve (``DealtOrder.keys``)
    emitted_r   positions r handed out in batches; dropped_r the drops its source returned
    held_r      keys_r not emitted or dropped (window, prefetched, dealt and unread)
    undealt     positions neither dealt nor reserve-taken (``Dealer.undealt()`` of a replica)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from odb.protocol.table import DONE, JOIN, PAD, QUOTA, WAIT

__all__ = ["DealtProperty", "DEALT_PROPERTIES", "DEALT_ENGINE_PROPERTIES", "for_mode", "by_name"]

ALL_MODES = (PAD, JOIN, QUOTA)


@dataclass(frozen=True)
class DealtProperty:
    name: str
    kind: str                                   # "always" | "sometimes"
    holds: Callable[[list, int], bool]          # (rank views, total positions) -> bool
    doc: str
    modes: tuple[int, ...] = ALL_MODES
    witness: tuple[str, ...] = ()               # for "always": the witnesses of its premise
    per_rank: bool = False                      # holds(view, total) of one rank (module docstring)


def _done(vs) -> bool:
    return all(v.local["ph"] == DONE for v in vs)


def _once(vs, total: int) -> bool:
    keys = [p for v in vs for p in v.replica["keys"]]
    return len(keys) == len(set(keys))


def _agree(vs, total: int) -> bool:
    by_round: dict = {}
    for v in vs:
        st = v.replica["state"]
        if by_round.setdefault(st["rounds"], st) != st:
            return False
    return True


def _caused(v, total: int) -> bool:
    return bool(v.drops or v.over or not (v.replica["reserve_taken"] or v.replica["dry"]))


def _ended_gets_nothing(v, total: int) -> bool:
    return not v.ended or len(v.replica["keys"]) == v.reads


def _window(v, total: int) -> bool:
    return v.local["buf"] == v.ret - v.drops - v.local["em"] and 0 <= v.ret <= v.reads <= len(v.replica["keys"]) \
        and v.reads - v.ret <= max(v.ahead, 1)


def _left(v, total: int) -> bool:
    return v.replica["left"] == len(v.replica["undealt"])


def _emitted_once(vs, total: int) -> bool:
    if not _done(vs):
        return True
    return sorted(p for v in vs for p in v.emitted + v.dropped) == list(range(total))


def _accounted_once(vs, total: int) -> bool:
    if not _done(vs):
        return True
    return sorted([p for v in vs for p in v.emitted + v.dropped + v.held] + list(vs[0].replica["undealt"])) == \
        list(range(total))


def _reported_reserve(vs, total: int) -> bool:
    rounds = [v.replica["rounds"] for v in vs]
    return any(sum(v.replica["state"]["reserve"]) and rounds.count(v.replica["rounds"]) >= 2 for v in vs)


DEALT_PROPERTIES: tuple[DealtProperty, ...] = (
    # -- always -------------------------------------------------------------------------------
    DealtProperty(
        "the_dealer_never_raises", "always", lambda v, t: "error" not in v.replica,
        "no DealtOrder.key or Dealer.deal call raises (its own consistency checks included: taken <= dealt, "
        "reserve counts never decrease)",
        witness=("a_deal_follows_a_reported_reserve_take",), per_rank=True),
    DealtProperty(
        "no_position_held_twice", "always", _once,
        "no position is ever dealt to, or taken from a reserve by, two ranks (or twice by one)",
        witness=("a_deal_follows_a_reported_reserve_take",)),
    DealtProperty(
        "replicas_agree", "always", _agree,
        "two replicas that have applied the same number of deals have the same Dealer.state_dict(): "
        "every deal is a function of gathered values only",
        witness=("a_deal_follows_a_reported_reserve_take",)),
    DealtProperty(
        "reserve_only_after_a_drop_or_overrun", "always", _caused,
        "a rank takes from its reserve or runs dry only if it dropped a sample or its policy emitted "
        "more than its posted intake bound (W - n + use > intake_bound) in some round",
        witness=("a_rank_runs_dry", "a_rank_takes_its_reserve_without_a_drop"), per_rank=True),
    DealtProperty(
        "an_ended_source_is_dealt_nothing_more", "always", _ended_gets_nothing,
        "once a rank's key iterator has ended (key() returned None) no key is dealt to it any more "
        "(it would never be read: lost)",
        witness=("a_source_ends_while_another_reads",), per_rank=True),
    DealtProperty(
        "window_is_the_sources_usable_items", "always", _window,
        "the table's window is the usable items the source returned minus those emitted, and the source "
        "reads at most its prefetch ahead (max(ahead, 1): one on demand) of the items it returned",
        witness=("a_prefetched_key_waits_across_a_collective",), per_rank=True),
    DealtProperty(
        "left_counts_the_undealt_positions", "always", _left,
        "Dealer.left (a closed form over the reserve classes) equals len(Dealer.undealt()) on every replica",
        witness=("left_subtracts_a_reserve_take_ahead_of_the_cursor",), per_rank=True),
    DealtProperty(
        "every_position_emitted_or_dropped_once", "always", _emitted_once,
        "PAD and JOIN: when every rank is DONE, each position has been emitted or dropped by exactly one rank",
        modes=(PAD, JOIN), witness=("all_done_after_drops_and_reserve_takes",)),
    DealtProperty(
        "every_position_accounted_once", "always", _accounted_once,
        "QUOTA: when every rank is DONE, each position is exactly once emitted, dropped, held unemitted by "
        "a rank, or undealt (what the runtime reports as unemitted)",
        modes=(QUOTA,), witness=("all_done_after_drops_and_reserve_takes", "quota_ends_with_positions_undealt")),
    # -- sometimes (premise of the always property named beside each) --------------------------
    DealtProperty(
        "a_deal_follows_a_reported_reserve_take", "sometimes", _reported_reserve,
        "no_position_held_twice, replicas_agree: two replicas have applied the same deal, which skipped "
        "reserve positions a rank reported"),
    DealtProperty(
        "a_rank_runs_dry", "sometimes", lambda v, t: v.replica["dry"],
        "reserve_only_after_a_drop_or_overrun: a rank's source ends early (its reserve class is used up)",
        per_rank=True),
    DealtProperty(
        "a_rank_takes_its_reserve_without_a_drop", "sometimes",
        lambda v, t: bool(v.replica["reserve_taken"] and not v.drops),
        "reserve_only_after_a_drop_or_overrun: a policy over its bound makes a rank take its reserve",
        per_rank=True),
    DealtProperty(
        "a_source_ends_while_another_reads", "sometimes",
        lambda vs, t: any(v.ended for v in vs) and any(not v.ended and v.local["ph"] != DONE for v in vs),
        "an_ended_source_is_dealt_nothing_more: a rank's source has ended while another rank still reads"),
    DealtProperty(
        "a_prefetched_key_waits_across_a_collective", "sometimes",
        lambda v, t: v.local["ph"] == WAIT and v.reads > v.ret,
        "window_is_the_sources_usable_items: a rank posts with keys read ahead (prefetch across a deal)",
        per_rank=True),
    DealtProperty(
        "left_subtracts_a_reserve_take_ahead_of_the_cursor", "sometimes",
        lambda v, t: t - v.replica["state"]["cursor"] > v.replica["left"],
        "left_counts_the_undealt_positions: a reported reserve take lies at or past a replica's cursor",
        per_rank=True),
    DealtProperty(
        "all_done_after_drops_and_reserve_takes", "sometimes",
        lambda vs, t: _done(vs) and any(v.drops for v in vs) and any(v.replica["reserve_taken"] for v in vs),
        "every_position_*_once: every rank is DONE after drops and reserve takes"),
    DealtProperty(
        "quota_ends_with_positions_undealt", "sometimes",
        lambda vs, t: _done(vs) and len(vs[0].replica["undealt"]) > 0,
        "every_position_accounted_once: QUOTA ends with positions nobody was dealt", modes=(QUOTA,)),
    DealtProperty(
        "the_end_game_deals_by_cost", "sometimes", lambda v, t: v.eg,
        "the last positions were dealt unevenly between live ranks whose measured costs differ", per_rank=True),
)

DEALT_ENGINE_PROPERTIES = {
    "deadlock_free": "every reachable state without a successor is all-DONE",
    "bounded_termination": "the reachable graph is finite (no truncation) and acyclic: every run ends",
    "every_step_fires": "every table row (bar the waived ones) and every environment step (read, drop, "
                        "complete) fires in some run",
}


def for_mode(mode: int) -> list[DealtProperty]:
    return [p for p in DEALT_PROPERTIES if mode in p.modes]


def by_name(name: str) -> DealtProperty:
    for p in DEALT_PROPERTIES:
        if p.name == name:
            return p
    raise KeyError(f"no dealt property {name!r}; properties: {[p.name for p in DEALT_PROPERTIES]}")
