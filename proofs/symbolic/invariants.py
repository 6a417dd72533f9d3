"""Auxiliary inductive invariant and ranking measures of the DGAP proofs (all N).

These formulas are proof artefacts, not protocol properties: the properties are
`models.properties.PROPERTIES`; the conjuncts below are what makes them provable
by induction.  They are written in the same formula language (`models.logic`
over `odb.protocol.expr`), so the explicit engine can evaluate them too, and
every conjunct must hold on every reachable state (checked at small N by
`tests/test_interpreters_agree.py`).

Extra symbol: ``GV("R")`` is the rounds bound, a rigid symbol constrained by
`rounds_axiom`: R >= d_j + 1 + xchg for every rank (pad, join) or for some rank
(quota), ``xchg`` (0 or 1) counting the round exchange's flush round.  A conjunct that holds for
every such R holds for the smallest one, R = max_i d_i + 1 + xchg (pad, join) or min_i d_i + 1 + xchg
(quota).

The flush round (cfg ``xchg = 1``): the first stop sends every rank through ``return_flush`` into one
more round that takes no sample, posts the same windows and so stops again (``flush_*`` below).

Names used below: `TGT`, `STOP`, `ABORT` and `GO` restate the table's decision
over the mailbox of the last completed collective (an auxiliary fact the
invariant carries about the rounds; the transitions themselves always come from
the table).

Aborts: the environment may turn any rank's status ``qt`` from 0 to 1 before it
is DONE (any number of ranks, any time).  A stopping rank posts ``st = qt``; the
round's collective then has ``max_st > 0`` (ABORT) and every rank returns to DONE
with ``aborted``.  The invariant carries: ``qt`` and the posted/mailbox status are 0
or 1; a go round's headers were all healthy, so the windows of the go round were
full or exhausted exactly as without aborts; after an ABORT nobody is in FILL,
EMIT or posted (so no further collective); ``aborted`` only at DONE and equal to
ABORT there.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.logic import GV, RF, Exists, Forall
from odb.protocol.expr import (
    Const,
    Expr,
    and_,
    eq,
    ge,
    gt,
    implies,
    ite,
    le,
    mn,
    mx,
    ne,
    not_,
    or_,
)
from odb.protocol.table import DONE, EMIT, FILL, JOIN, PAD, QUOTA, WAIT

__all__ = ["Conjunct", "INVARIANT", "for_mode", "MEASURE", "FETCH_BUDGET", "ROUND_INDEX", "ROUND_BUDGET",
           "QUIT_BUDGET", "TGT", "STOP", "ABORT", "GO", "NEVER_FIRES", "rounds_bound_value"]

ALL = (PAD, JOIN, QUOTA)


@dataclass(frozen=True)
class Conjunct:
    name: str
    formula: Expr
    doc: str
    modes: tuple[int, ...] = ALL


def f(name: str, i: str = "i") -> RF:
    return RF(i, name)


def at(phase: int, i: str = "i") -> Expr:
    return eq(f("ph", i), phase)


def every(body: Expr, i: str = "i") -> Forall:
    return Forall(i, body)


W, K, MODE, R, X = GV("W"), GV("k"), GV("mode"), GV("R"), GV("xchg")
MAX_ST, MAX_N, MIN_N, MIN_POS_N, PROPOSAL = GV("max_st"), GV("max_n"), GV("min_n"), GV("min_pos_n"), GV("proposal")
HI = ite(eq(MODE, PAD), MAX_N, ite(eq(MODE, JOIN), MIN_POS_N, MIN_N))
TGT = mx(Const(1), mn(PROPOSAL, HI))
"""The target every rank decided in the last completed collective."""
STOP = ite(eq(MODE, QUOTA), eq(MIN_N, 0), eq(MAX_N, 0))
"""The last completed collective's stop condition (it sends ranks to DONE unless ABORT does first)."""
ABORT = gt(MAX_ST, 0)
"""The last completed collective carried a non-zero status: every rank returns with ``aborted``."""
GO = and_(not_(ABORT), not_(STOP))
"""The last completed collective said go (return_go)."""


def posted(i: str = "i") -> Expr:
    return and_(at(WAIT, i), eq(f("posted", i), 1))


def pending(i: str = "i") -> Expr:
    """In WAIT, its collective completed, not yet returned."""
    return and_(at(WAIT, i), eq(f("posted", i), 0))


def drained(i: str = "i") -> Expr:
    return and_(f("exhausted", i), eq(f("buf", i), 0))


def base(i: str) -> Expr:
    """Batches of rank i in the rounds every rank has finished emitting (pad, quota)."""
    in_round = ite(at(EMIT, i), f("kb", i), Const(0))
    last = ite(and_(or_(at(FILL, i), posted(i)), ge(K, 1), not_(f("fl", i))), TGT, Const(0))
    return f("nb", i) - in_round - last


INVARIANT: tuple[Conjunct, ...] = (
    # -- shape of a round ------------------------------------------------------
    Conjunct("k_nonneg", ge(K, 0), "collectives completed"),
    Conjunct("counters_nonneg", every(and_(ge(f("rd"), 0), ge(f("em"), 0), ge(f("nb"), 0), ge(f("d"), 0))),
             "rounds, emitted samples and batches, and shard sizes are never negative"),
    Conjunct("phase_domain", every(or_(at(FILL), at(WAIT), at(EMIT), at(DONE))), "ph is a phase"),
    Conjunct("fill_at_round_k", every(implies(at(FILL), and_(eq(f("rd"), K), eq(f("posted"), 0)))),
             "a filling rank is at the current round and has not posted"),
    Conjunct("wait_posted_or_pending", every(implies(at(WAIT), or_(
        and_(eq(f("rd"), K), eq(f("posted"), 1)), and_(eq(f("rd") + 1, K), eq(f("posted"), 0))))),
        "a waiting rank has posted for round k, or round rd has completed and it has not returned"),
    Conjunct("emit_at_round_k", every(implies(at(EMIT), and_(eq(f("rd"), K), eq(f("posted"), 0), ge(K, 1)))),
             "an emitting rank has returned from the last collective"),
    Conjunct("done_at_round_k", every(implies(at(DONE), and_(eq(f("rd"), K), eq(f("posted"), 0), ge(K, 1)))),
             "a finished rank has returned from the last collective"),
    Conjunct("posted_header", every(implies(eq(f("posted"), 1), and_(
        eq(f("pn"), f("buf")), eq(f("pshape"), GV("header_len"))))),
        "a header in the mailbox is the rank's window, in the fixed shape"),
    Conjunct("status_domain", every(and_(
        or_(eq(f("qt"), 0), eq(f("qt"), 1)), ge(f("pst"), 0), le(f("pst"), f("qt")),
        implies(eq(f("posted"), 0), eq(f("pst"), 0)))),
        "the stop status is 0 or 1 and never reverts; a posted status is 0 or the rank's own 1"),
    Conjunct("wait_full_or_exhausted", every(implies(at(WAIT), and_(
        implies(eq(f("posted"), 1), or_(eq(f("buf"), f("cap")), f("exhausted"), gt(f("pst"), 0))),
        implies(and_(eq(f("posted"), 0), not_(ABORT)), or_(eq(f("buf"), f("cap")), f("exhausted")))))),
        "a rank posts a full window (its round's cap), an exhausted one, or a stop; a round without a stop had "
        "only full or exhausted windows"),
    # -- the decision ---------------------------------------------------------
    Conjunct("mailbox_proposal", implies(ge(K, 1), and_(ge(PROPOSAL, 1), le(PROPOSAL, W))),
             "the last proposal is within the table's bounds"),
    Conjunct("mailbox_aggregates", implies(ge(K, 1), and_(ge(MIN_N, 0), le(MIN_N, MAX_N))),
             "the last aggregates come from real windows (never negative)"),
    Conjunct("mailbox_status", and_(ge(MAX_ST, 0), le(MAX_ST, 1), implies(eq(K, 0), eq(MAX_ST, 0))),
             "the last collective's status is 0 or 1 (0 before the first collective)"),
    Conjunct("abort_has_a_cause", implies(ABORT, Exists("j", eq(f("qt", "j"), 1))),
             "an abort was posted by a rank that was told to stop"),
    Conjunct("pending_in_mailbox", every(implies(pending(), and_(
        le(MIN_N, f("buf")), le(f("buf"), MAX_N), implies(gt(f("buf"), 0), le(MIN_POS_N, f("buf")))))),
        "a rank that has not returned holds the window it posted, so the aggregates bound it"),
    Conjunct("emit_target", every(implies(at(EMIT), and_(eq(f("T"), TGT), GO))),
             "an emitting rank works to the decided target of the last collective"),
    Conjunct("go_before_fill", every(implies(and_(or_(at(FILL), posted()), ge(K, 1)),
                                             ite(f("fl"), and_(not_(ABORT), STOP), GO))),
             "a rank past the last collective into a new round saw a go, or (the exchange's flush round) a stop "
             "(so after an abort every rank is DONE or about to return: no further collective)"),
    Conjunct("flush_only_with_exchange", every(implies(f("fl"), and_(eq(X, 1), not_(at(EMIT))))),
             "fl is set only with the exchange, and a rank in the flush round emits nothing"),
    Conjunct("flush_agreed", Forall("i", Forall("j", implies(
        and_(f("fl", "i"), not_(f("fl", "j"))), and_(pending("j"), or_(at(FILL, "i"), posted("i")))))),
        "while some rank is in the flush round, a rank without fl has not yet returned from the stop"),
    Conjunct("done_flushed", every(implies(and_(at(DONE), not_(f("aborted")), eq(X, 1)), f("fl"))),
             "with the exchange, a rank finishes without an abort only after the flush round"),
    Conjunct("done_after_flush_ends_it", Forall("i", Forall("j", implies(
        and_(or_(at(DONE, "i"), pending("i")), f("fl", "i")), not_(or_(at(FILL, "j"), posted("j")))))),
        "once the flush round's collective completed, no rank is in a later round"),
    Conjunct("flush_after_stop", every(implies(and_(pending(), not_(f("fl"))), ge(K, 1))),
             "a pending rank has a completed collective to return from"),
    Conjunct("flush_windows", every(implies(f("fl"), and_(
        or_(eq(f("buf"), f("cap")), f("exhausted"), gt(f("qt"), 0)),
        implies(ne(MODE, QUOTA), eq(f("buf"), 0))))),
        "in the flush round a window is as it was posted at the stop: full or exhausted (or stopping), and "
        "empty unless quota"),
    Conjunct("flush_stop_recurs", implies(and_(Exists("j", f("fl", "j")), eq(MODE, QUOTA)),
                                          Exists("j", drained("j"))),
             "quota: the flush round holds the drained rank that caused the stop"),
    Conjunct("flush_collective_stops", every(implies(and_(pending(), f("fl")), or_(ABORT, STOP))),
             "the flush round's collective is a stop (or an abort): no rank goes on from it"),
    Conjunct("done_after_stop_or_abort", every(implies(at(DONE), ite(f("aborted"), ABORT, and_(not_(ABORT), STOP)))),
             "a finished rank saw an abort (and has ab) or a stop without abort (and has not)"),
    Conjunct("abort_flag_only_at_done", every(implies(not_(at(DONE)), not_(f("aborted")))),
             "ab is set only by the return to DONE"),
    # -- a round's batches ----------------------------------------------------
    Conjunct("emit_counts", every(implies(at(EMIT), and_(
        ge(f("nreal"), 0), ge(f("nfill"), 0), ge(f("kb"), 0), le(f("nreal"), f("pend")),
        implies(eq(f("nreal"), 0), eq(f("pend"), 0)), le(f("T"), W)))),
        "pending samples fill the remaining real batches; T <= W"),
    Conjunct("idle_counts", every(implies(not_(at(EMIT)), and_(
        eq(f("pend"), 0), eq(f("nreal"), 0), eq(f("nfill"), 0)))),
        "outside EMIT nothing is owed"),
    Conjunct("no_fillers_unless_pad", implies(ne(MODE, PAD), every(eq(f("nfill"), 0))),
             "join and quota never owe fillers"),
    Conjunct("emit_sum", every(implies(at(EMIT), eq(f("kb") + f("nreal") + f("nfill"), f("T")))),
             "pad, quota: the round's batches add up to T", modes=(PAD, QUOTA)),
    Conjunct("emit_sum_join", every(implies(at(EMIT), or_(
        eq(f("kb") + f("nreal") + f("nfill"), f("T")),
        and_(eq(f("kb"), 0), eq(f("nreal"), 0), eq(f("nfill"), 0), eq(f("buf"), 0))))),
        "join: T batches, or none from an empty window", modes=(JOIN,)),
    Conjunct("equal_base", Forall("i", Forall("j", eq(base("i"), base("j")))),
             "pad, quota: every rank has emitted the same batches in every finished round",
             modes=(PAD, QUOTA)),
    # -- samples --------------------------------------------------------------
    Conjunct("window", every(and_(ge(f("buf"), 0), le(f("buf"), f("cap")), ge(f("pend"), 0), le(f("pend"), f("buf")))),
             "0 <= pend <= buf <= cap"),
    Conjunct("cap", every(and_(ge(f("cap"), 1), le(f("cap"), W))),
             "1 <= cap <= W: the round's window is never empty nor above W"),
    Conjunct("source", every(and_(ge(f("src"), 0), implies(f("exhausted"), eq(f("src"), 0)))),
             "a source never goes negative and is empty once it said so"),
    Conjunct("accounting", every(eq(f("em") + f("buf") + f("src"), f("d"))), "emitted + held + left = shard"),
    Conjunct("samples_per_batch", implies(ne(MODE, PAD), every(ge(f("em"), f("nb")))),
             "join, quota: every batch is real and holds a sample"),
    Conjunct("done_drained", every(implies(and_(at(DONE), not_(f("aborted"))), drained())),
             "pad, join: a rank that finished without an abort holds nothing and its source is empty",
             modes=(PAD, JOIN)),
    Conjunct("quota_stop_witness", implies(and_(ge(K, 1), eq(MIN_N, 0), not_(ABORT)), Exists("j", drained("j"))),
             "quota: a stop without an abort was caused by a drained rank", modes=(QUOTA,)),
    # -- progress (rounds bound) ------------------------------------------------
    Conjunct("progress_between_rounds", every(implies(or_(at(FILL), at(WAIT)),
                                                      or_(drained(), ge(f("em"), f("rd")),
                                                          and_(f("fl"), ge(f("em") + 1, f("rd")))))),
             "a rank with data has emitted at least one sample in every round it finished"),
    Conjunct("progress_in_round", every(implies(at(EMIT), or_(
        and_(drained(), eq(f("pend"), 0)), ge(f("em") + f("pend"), f("rd"))))),
        "a rank with data emits at least one sample in every go round"),
    Conjunct("rounds_bounded", and_(le(K, R), implies(and_(ge(K, 1), GO), le(K + 1 + X, R)),
                                    implies(and_(ge(K, 1), not_(ABORT), STOP, not_(Exists("j", f("fl", "j")))),
                                            le(K + X, R)),
                                    implies(Exists("j", and_(f("fl", "j"), or_(at(FILL, "j"), posted("j")))),
                                            le(K + 1, R))),
             "at most R collectives (the rounds axiom counts the exchange's flush); a go at collective k leaves "
             "room for one more, and for the flush"),
)


def for_mode(mode: int) -> list[Conjunct]:
    return [c for c in INVARIANT if mode in c.modes]


# -- ranking (termination) and transition budgets, per rank "i" ------------------
MEASURE: tuple[tuple[str, Expr], ...] = (
    ("rounds_left", R - f("rd")),
    ("phase", ite(at(EMIT), Const(3), ite(at(FILL), Const(2), ite(at(WAIT), Const(1), Const(0))))),
    ("in_phase", ite(at(FILL), (W - f("buf")) + ite(f("exhausted"), Const(0), Const(1)),
                     ite(at(EMIT), f("nreal") + f("nfill"), Const(0)))),
)
"""Lexicographic measure of rank i: every local row at i decreases it, complete and quit leave it."""

QUIT_BUDGET = Const(1) - f("qt")
"""Quit transitions rank i can still undergo: 1 at Init, lowered by its quit, untouched otherwise."""

FETCH_BUDGET = f("src") + ite(f("exhausted"), Const(0), Const(1))
"""Fetches rank i can still make: each fetch row lowers it by one; d_i + 1 initially."""

ROUND_INDEX = ite(or_(at(EMIT), at(DONE)), f("rd") - 1, f("rd"))
"""The round rank i is in: a round runs FILL, WAIT, return, EMIT, end_round."""

ROUND_BUDGET = ite(at(FILL), W + 3, ite(at(WAIT), W + 2, ite(at(EMIT), f("nreal") + f("nfill") + 1, Const(0))))
"""Non-fetch rows rank i may still fire in its round (W + 3 at the round's start)."""

NEVER_FIRES: dict[int, dict[str, str]] = {
    JOIN: {"emit_filler": "fillers are a pad-only device (nfill = 0 in join)"},
    QUOTA: {"emit_filler": "fillers are a pad-only device (nfill = 0 in quota)"},
}
"""Rows that cannot fire in a mode, by design; non-vacuity checks that they indeed cannot."""


def rounds_bound_value(mode: int, data: tuple[int, ...], xchg: int = 0) -> int:
    """The tight R for a concrete data vector: max d + 1 (pad, join), min d + 1 (quota), plus the exchange's
    flush round."""
    return (min(data) if mode == QUOTA else max(data)) + 1 + xchg
