"""The named properties of the DGAP protocol, written once for every engine.

Kinds (stateright's vocabulary):
    always     a state invariant; an engine looks for a counterexample
    sometimes  a reachability witness; an engine must find an example (non-vacuity)
Engine-level properties that are not state formulas (deadlock freedom, bounded
termination, confluence, possibility of completion, collective-sequence
alignment over whole runs) are named in `ENGINE_PROPERTIES`; each engine
implements them from the table and the environment model, never from a copy.

Every ``always`` property names the ``sometimes`` witness that shows its
antecedent is reachable, so no property holds vacuously: `witness_for` gives the
witness of each mode, `antecedent` the property's premise (the existential
closure of ``A`` in ``forall i... A => B``).  The z3 engine checks, for every
mode, that the witness implies the antecedent over unconstrained states, and
that the property itself is violated by some unconstrained state (it is not a
tautology); the explicit engine finds the witness in a reachable state, so the
antecedent is reachable (`proofs.symbolic.prove`).
"""

from __future__ import annotations

from dataclasses import dataclass

from odb.protocol.expr import Expr, Op, and_, eq, ge, implies, le, ne, not_, or_
from odb.protocol.table import DONE, EMIT, FILL, JOIN, PAD, QUOTA, WAIT

from .logic import GV, RF, Exists, Forall

__all__ = ["Property", "PROPERTIES", "ENGINE_PROPERTIES", "by_name", "for_mode", "witness_for", "antecedent"]

ALL_MODES = (PAD, JOIN, QUOTA)


@dataclass(frozen=True)
class Property:
    name: str
    kind: str                  # "always" | "sometimes"
    formula: Expr
    doc: str
    modes: tuple[int, ...] = ALL_MODES
    # for "always": the "sometimes" property that makes it non-vacuous, or several (one per mode; see
    # `witness_for`)
    witness: str | tuple[str, ...] | None = None


def f(i: str, name: str) -> RF:
    return RF(i, name)


def ph_is(i: str, phase: int) -> Expr:
    return eq(f(i, "ph"), phase)


MODE = GV("mode")

PROPERTIES: tuple[Property, ...] = (
    # -- agreement and alignment ------------------------------------------------
    Property(
        "ranks_agree_on_target", "always",
        Forall("i", Forall("j", implies(and_(ph_is("i", EMIT), ph_is("j", EMIT)), eq(f("i", "T"), f("j", "T"))))),
        "two ranks emitting at the same time work to the same target T",
        witness="two_ranks_emit_together"),
    Property(
        "ranks_within_one_round", "always",
        Forall("i", Forall("j", le(f("i", "rd"), f("j", "rd") + 1))),
        "no rank is more than one round (one collective) ahead of another",
        witness="a_rank_is_a_round_ahead"),
    Property(
        "posted_headers_match", "always",
        Forall("i", Forall("j", implies(
            and_(eq(f("i", "posted"), 1), eq(f("j", "posted"), 1)),
            and_(eq(f("i", "pshape"), f("j", "pshape")), eq(f("i", "rd"), f("j", "rd")))))),
        "headers in the mailbox at the same time belong to the same round and have the same shape "
        "(collective alignment: every rank issues the same collective sequence)",
        witness="two_headers_posted"),
    Property(
        "round_emits_target", "always",
        Forall("i", implies(ph_is("i", EMIT), eq(f("i", "kb") + f("i", "nreal") + f("i", "nfill"), f("i", "T")))),
        "PAD and QUOTA: every rank emits exactly T batches in every round (fillers included)",
        modes=(PAD, QUOTA), witness=("a_filler_is_emitted", "quota_rounds_are_full")),
    Property(
        "join_round_emits_target_or_nothing", "always",
        Forall("i", implies(ph_is("i", EMIT), or_(
            eq(f("i", "kb") + f("i", "nreal") + f("i", "nfill"), f("i", "T")),
            and_(eq(f("i", "kb"), 0), eq(f("i", "nreal"), 0), eq(f("i", "nfill"), 0), eq(f("i", "buf"), 0))))),
        "JOIN: in every round a rank with data emits exactly T batches, a rank without data none",
        modes=(JOIN,), witness="join_rank_idles_while_another_emits"),
    Property(
        "equal_steps_at_end", "always",
        Forall("i", Forall("j", implies(and_(ph_is("i", DONE), ph_is("j", DONE)), eq(f("i", "nb"), f("j", "nb"))))),
        "PAD and QUOTA: finished ranks have emitted the same number of batches (also after an abort)",
        modes=(PAD, QUOTA), witness="all_done_with_uneven_data"),
    Property(
        "ranks_agree_on_abort", "always",
        Forall("i", Forall("j", implies(and_(ph_is("i", DONE), ph_is("j", DONE)),
                                        eq(f("i", "aborted"), f("j", "aborted"))))),
        "finished ranks agree on whether the epoch completed or was aborted (a stopping rank takes every rank "
        "with it in the same round; nobody is left in a collective)",
        witness="an_abort_reaches_a_healthy_rank"),
    # -- data accounting ---------------------------------------------------------
    Property(
        "samples_accounted", "always",
        Forall("i", eq(f("i", "em") + f("i", "buf") + f("i", "src"), f("i", "d"))),
        "received = emitted + buffered: every sample taken from the source is emitted or held",
        witness="carry_is_held_across_rounds"),
    Property(
        "window_bounded", "always",
        Forall("i", and_(le(f("i", "buf"), GV("W")), ge(f("i", "buf"), 0), le(f("i", "pend"), f("i", "buf")),
                         ge(f("i", "pend"), 0))),
        "the window (carry included) never exceeds W; the round's pending samples are held",
        witness="carry_is_held_across_rounds"),
    Property(
        "nothing_left_at_end", "always",
        Forall("i", implies(and_(ph_is("i", DONE), not_(f("i", "aborted"))),
                            and_(eq(f("i", "buf"), 0), eq(f("i", "src"), 0)))),
        "PAD and JOIN: a rank that finished without an abort has emitted every sample of its shard "
        "(exactly once, with samples_accounted)",
        modes=(PAD, JOIN), witness="all_done_with_uneven_data"),
    Property(
        "quota_closure", "always",
        implies(Forall("i", and_(ph_is("i", DONE), not_(f("i", "aborted")))), and_(
            Exists("j", eq(f("j", "em"), f("j", "d"))),
            Forall("i", ge(f("i", "em"), f("i", "nb"))))),
        "QUOTA: at the end some rank has emitted its whole shard, and every rank i has "
        "unemitted_i = d_i - em_i <= d_i - S, where S is the common step count",
        modes=(QUOTA,), witness="all_done_with_uneven_data"),
    # -- witnesses ---------------------------------------------------------------
    Property("two_ranks_emit_together", "sometimes",
             Exists("i", Exists("j", and_(ne(f("i", "d"), f("j", "d")), ph_is("i", EMIT), ph_is("j", EMIT)))),
             "two ranks with different shards emit in the same round"),
    Property("a_rank_is_a_round_ahead", "sometimes",
             Exists("i", Exists("j", eq(f("i", "rd"), f("j", "rd") + 1))),
             "one rank has left a collective that another has not"),
    Property("two_headers_posted", "sometimes",
             Exists("i", Exists("j", and_(ne(f("i", "pn"), f("j", "pn")), eq(f("i", "posted"), 1),
                                          eq(f("j", "posted"), 1)))),
             "two different headers wait in the mailbox"),
    Property("a_filler_is_emitted", "sometimes",
             Exists("i", and_(ph_is("i", EMIT), ge(f("i", "nfill"), 1))),
             "PAD: a rank short of samples owes filler batches", modes=(PAD,)),
    Property("quota_rounds_are_full", "sometimes",
             Exists("i", and_(ph_is("i", EMIT), ge(f("i", "T"), 1), eq(f("i", "kb"), 0))),
             "QUOTA: a round with a positive target starts", modes=(QUOTA,)),
    Property("join_rank_idles_while_another_emits", "sometimes",
             Exists("i", Exists("j", and_(ph_is("i", EMIT), ph_is("j", EMIT), eq(f("i", "T"), f("j", "T")),
                                          eq(f("i", "nreal"), 0), eq(f("i", "kb"), 0), ge(f("j", "nreal"), 1)))),
             "JOIN: a rank with no data sits out a round in which another emits", modes=(JOIN,)),
    Property("all_done_with_uneven_data", "sometimes",
             and_(Forall("i", and_(ph_is("i", DONE), not_(f("i", "aborted")))),
                  Exists("i", Exists("j", ne(f("i", "d"), f("j", "d"))))),
             "every rank finishes the epoch (no abort) although the shards differ"),
    Property("carry_is_held_across_rounds", "sometimes",
             Exists("i", and_(ph_is("i", EMIT), eq(f("i", "nreal"), 0), eq(f("i", "nfill"), 0), ge(f("i", "buf"), 1))),
             "a rank ends a round with its batches out and samples still held: the carry into the next round "
             "(a refilling rank, FILL with buf >= 1 after round 1, is not one: it may have carried nothing)"),
    Property("an_abort_reaches_a_healthy_rank", "sometimes",
             Exists("i", Exists("j", and_(ph_is("i", DONE), f("i", "aborted"), eq(f("i", "qt"), 0),
                                          eq(f("j", "qt"), 1)))),
             "a rank that did not stop itself ends the epoch by an abort another rank posted"),
    Property("a_rank_waits_for_a_slow_peer", "sometimes",
             Exists("i", Exists("j", and_(ph_is("i", WAIT), ph_is("j", FILL), eq(f("i", "rd"), f("j", "rd"))))),
             "a rank has posted while another still fills its window"),
)

ENGINE_PROPERTIES = {
    "deadlock_free": "every reachable state that is not all-DONE has an enabled transition",
    "bounded_termination": "every run reaches all-DONE within the bound of the ranking function",
    "completion_possible": "from every reachable state all-DONE is reachable (no trap)",
    "confluent": "for a deterministic policy, one outcome (per-rank em, nb) per data vector, whatever the interleaving",
    "local_determinism": "in every reachable state, for the inputs it gets, a rank has at most one enabled row",
    "every_row_fires": "every row of the table fires in some run (coverage)",
}


def by_name(name: str) -> Property:
    for p in PROPERTIES:
        if p.name == name:
            return p
    raise KeyError(f"no property {name!r}; properties: {[p.name for p in PROPERTIES]}")


def for_mode(mode: int) -> list[Property]:
    return [p for p in PROPERTIES if mode in p.modes]


def witness_for(p: Property, mode: int, properties: tuple[Property, ...] = PROPERTIES) -> Property | None:
    """The ``sometimes`` property that witnesses always-property `p` in `mode`: the first of its
    named witnesses that applies to `mode` (None if none does, or a name is unknown)."""
    names = (p.witness,) if isinstance(p.witness, str) else tuple(p.witness or ())
    known = {q.name: q for q in properties}
    for name in names:
        w = known.get(name)
        if w is not None and w.kind == "sometimes" and mode in w.modes:
            return w
    return None


def antecedent(formula: Expr) -> Expr | None:
    """The premise of ``forall v1.. vk. A => B`` as ``exists v1.. vk. A`` (what a witness must reach);
    None for a formula that is not an implication under its leading quantifiers (no premise)."""
    bound, e = [], formula
    while isinstance(e, Forall):
        bound.append(e.var)
        e = e.body
    if not (isinstance(e, Op) and e.op == "or" and isinstance(e.args[0], Op) and e.args[0].op == "not"):
        return None  # `implies(a, b)` is built as `or_(not_(a), b)`
    out = e.args[0].args[0]
    for v in reversed(bound):
        out = Exists(v, out)
    return out
