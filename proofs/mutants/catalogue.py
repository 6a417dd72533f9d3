"""Seeded mutants of the DGAP table, each with the check expected to kill it.

Legend
    Mutant.build   returns the mutated table, derived from `DGAP` by
                   `Table.replace_row`, by replacing lets, or by adding one row
                   built from an existing one (never a hand-copied table)
    expected       the property (verdict name) that must fail on the mutant: an
                   ``always`` property or an engine property (a counterexample), or
                   a ``sometimes`` witness (the mutant makes it unreachable where the
                   unmutated table reaches it; see `proofs.mutants.check`)
    validate       False when the mutant breaks a rule `Table.validate` enforces
                   (the check is bypassed on purpose: the engines must still catch it)

Each mutant is a bug a real implementation could have; the catalogue answers
"do the checks have teeth?".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from odb.protocol.expr import Cfg, Const, Expr, Field, Input, Let, and_, eq, gt, ite, lt, mn, mx, not_, or_
from odb.protocol.table import DGAP, DONE, JOIN, PAD, QUOTA, Effect, Table

__all__ = ["Mutant", "MUTANTS", "by_name"]

W, MODE = Cfg("W"), Cfg("mode")
buf, x, rd, nreal, pend = Field("buf"), Field("exhausted"), Field("rd"), Field("nreal"), Field("pend")
cap = Field("cap")
QUIT = Input("quit")


@dataclass(frozen=True)
class Mutant:
    name: str
    doc: str
    build: Callable[[], Table]
    expected: str
    validate: bool = True

    def table(self) -> Table:
        t = self.build()
        if t.hash == DGAP.hash:
            raise AssertionError(f"mutant {self.name} does not change the table")
        if self.validate:
            t.validate()
        return t


def _let(table: Table, name: str, e: Expr) -> Table:
    if name not in table.let_map:
        raise KeyError(f"no let {name!r}; lets: {list(table.let_map)}")
    return replace(table, lets=tuple((n, e if n == name else v) for n, v in table.lets))


def _updates(table: Table, row: str, **changes: Expr | None) -> Table:
    """Row `row` with some updates replaced (an Expr) or dropped (None)."""
    ups = []
    for n, e in table.row(row).updates:
        if n in changes:
            if changes[n] is not None:
                ups.append((n, changes[n]))
        else:
            ups.append((n, e))
    ups += [(n, e) for n, e in changes.items() if e is not None and n not in dict(table.row(row).updates)]
    return table.replace_row(row, updates=tuple(ups))


def _choice(table: Table, row: str, name: str, **bounds: Expr) -> Table:
    cs = tuple(replace(c, **bounds) if c.name == name else c for c in table.row(row).choices)
    return table.replace_row(row, choices=cs)


def _leave_early() -> Table:
    # a rank whose window is empty and whose source is exhausted returns before the next
    # round's collective (a rank-local branch before a collective whose condition is global)
    end = DGAP.row("end_round")
    early = and_(eq(buf, 0), x)
    t = DGAP.replace_row("end_round", guard=and_(end.guard, not_(early)))
    leave = replace(end, name="leave_early", guard=and_(end.guard, early), phase_to=DONE,
                    doc="mutant: return without posting when nothing is left locally")
    return replace(t, rows=t.rows + (leave,))


def _payload(**changes: Expr) -> Table:
    """post_header with some header fields replaced (the others, e.g. ``st``, kept)."""
    post = DGAP.row("post_header")
    payload = tuple((n, changes.get(n, e)) for n, e in post.effect.payload)
    return DGAP.replace_row("post_header", effect=replace(post.effect, payload=payload))


def _quit_leaves_without_posting() -> Table:
    # a stopping rank returns at once instead of posting its status: the others wait for it
    post = DGAP.row("post_header")
    t = DGAP.replace_row("post_header", guard=and_(post.guard, eq(QUIT, 0)))
    leave = replace(post, name="leave_on_quit", guard=gt(QUIT, 0), effect=Effect("none"), phase_to=DONE,
                    updates=(("aborted", Const(True)),), doc="mutant: a stopping rank leaves without posting")
    return replace(t, rows=t.rows + (leave,))


def _aggregate_op(name: str, op: str) -> Table:
    if name not in {a.name for a in DGAP.aggregates}:
        raise KeyError(f"no aggregate {name!r}; aggregates: {[a.name for a in DGAP.aggregates]}")
    return replace(DGAP, aggregates=tuple(replace(a, op=op) if a.name == name else a for a in DGAP.aggregates))


def _post_shape_local() -> Table:
    post = DGAP.row("post_header")
    return DGAP.replace_row("post_header", effect=replace(post.effect, shape=buf))


MUTANTS: tuple[Mutant, ...] = (
    Mutant("leave_when_source_exhausted",
           "see_exhausted moves to DONE: a rank leaves when its data runs out, without posting",
           lambda: DGAP.replace_row("see_exhausted", phase_to=DONE), "deadlock_free"),
    Mutant("leave_early_before_collective",
           "end_round -> DONE when buf == 0 and x: a local early return before a global collective",
           _leave_early, "deadlock_free"),
    Mutant("stop_from_all_exhausted",
           "the header posts 0 once the source is exhausted, so the stop reads 'all exhausted' "
           "instead of max_n == 0: carried samples are discarded when every rank finishes",
           lambda: _payload(n=ite(x, Const(0), buf)), "nothing_left_at_end"),
    Mutant("stop_clears_carry",
           "stop when some window is empty (min_n == 0) in every mode, and return_stop clears buf",
           lambda: _updates(_let(DGAP, "stop", eq(Input("min_n"), 0)), "return_stop", buf=Const(0)),
           "samples_accounted"),
    Mutant("target_from_own_window",
           "the target reads the rank's own buf instead of the gathered max_n/min_n (Table.validate bypassed)",
           lambda: _let(DGAP, "target", mx(Const(1), mn(Input("proposal"), buf))),
           "ranks_agree_on_target", validate=False),
    Mutant("round_counter_plus_two",
           "return_go advances the round counter by 2 (off by one)",
           lambda: _updates(DGAP, "return_go", rd=rd + 2), "ranks_within_one_round"),
    Mutant("header_shape_from_local_state",
           "the posted header's shape is buf instead of a cfg constant (Table.validate bypassed)",
           _post_shape_local, "posted_headers_match", validate=False),
    Mutant("take_allows_empty_batches",
           "emit_group's take lower bound is 0: a real batch may be empty and samples are never drained",
           lambda: _choice(DGAP, "emit_group", "take", lo=Const(0)), "bounded_termination"),
    Mutant("fillers_in_join",
           "return_go owes fillers in every mode (nfill := target - real), JOIN included",
           lambda: _updates(DGAP, "return_go", nfill=Let("target") - mn(Let("target"), buf)),
           "every_row_fires"),
    Mutant("quota_hi_is_max_n",
           "QUOTA clamps the target by max_n instead of min_n",
           lambda: _let(DGAP, "hi", ite(eq(MODE, JOIN), Input("min_pos_n"), Input("max_n"))),
           "round_emits_target"),
    Mutant("fetch_without_window_guard",
           "take_sample lacks buf < cap: the window overflows and fetching races with posting",
           lambda: DGAP.replace_row("take_sample", guard=and_(not_(x), eq(QUIT, 0), Input("src_has"))),
           "window_bounded"),
    Mutant("use_lower_bound_zero",
           "return_go lets the grouping pick use = 0 while real batches are owed",
           lambda: _choice(DGAP, "return_go", "use", lo=Const(0)), "deadlock_free"),
    Mutant("emit_forgets_buf_update",
           "emit_group forgets buf -= take (a missing frame update)",
           lambda: _updates(DGAP, "emit_group", buf=None), "samples_accounted"),
    Mutant("pad_without_fillers",
           "return_go never owes fillers (nfill := 0): PAD ranks short of samples emit fewer batches",
           lambda: _updates(DGAP, "return_go", nfill=Const(0)), "round_emits_target"),
    Mutant("post_only_when_full",
           "post_header requires a full window (drops 'or x'): an exhausted rank never posts",
           lambda: DGAP.replace_row("post_header", guard=or_(eq(buf, cap), gt(QUIT, 0))), "deadlock_free"),
    # -- aborts ----------------------------------------------------------------------------------
    Mutant("return_go_ignores_abort",
           "return_go drops 'not abort': after a stop status a rank may go on emitting while the others abort",
           lambda: DGAP.replace_row("return_go", guard=and_(Input("ready"), not_(Let("stop")))),
           "local_determinism"),
    Mutant("return_stop_ignores_abort",
           "return_stop drops 'not abort': when the data also ran out, ranks split between a clean stop "
           "and an abort",
           lambda: DGAP.replace_row("return_stop", guard=and_(Input("ready"), Let("stop"))),
           "ranks_agree_on_abort"),
    Mutant("quit_leaves_without_posting",
           "a stopping rank goes DONE without posting its status (a local early return before a collective)",
           _quit_leaves_without_posting, "deadlock_free"),
    Mutant("post_status_constant_zero",
           "the header's st is 0 whatever the rank's status: nobody learns of a stop, the stopping rank's "
           "unread samples are silently dropped",
           lambda: _payload(st=Const(0)), "nothing_left_at_end"),
    Mutant("return_abort_forgets_ab",
           "return_abort does not set ab: an aborted epoch is reported as complete",
           lambda: _updates(DGAP, "return_abort", aborted=None), "nothing_left_at_end"),
    Mutant("abort_decided_locally",
           "the abort decision reads the rank's own quit input instead of the gathered max_st: only the "
           "stopping rank leaves, the others wait for it in the next collective (Table.validate bypassed: "
           "it rejects decisions that read rank-local inputs)",
           lambda: _let(DGAP, "abort", gt(QUIT, 0)), "deadlock_free", validate=False),
    Mutant("fetch_ignores_quit",
           "take_sample drops 'quit == 0': a stopping rank may keep reading or post (two rows enabled)",
           lambda: DGAP.replace_row("take_sample", guard=and_(not_(Field("fl")), not_(x), lt(buf, cap),
                                                              Input("src_has"))),
           "local_determinism"),
    # -- the first rounds' smaller windows (cfg W0 < W) --------------------------------------------
    Mutant("cap_grows_past_window",
           "end_round doubles the cap without clamping it to W: after a few rounds a window holds more than W "
           "samples (more than the header's fills and the host memory the docs state)",
           lambda: _updates(DGAP, "end_round", cap=cap + cap), "window_bounded"),
    Mutant("post_waits_for_W",
           "post_header waits for a window of W instead of the round's cap: a rank whose cap is below W can "
           "neither fetch nor post",
           lambda: DGAP.replace_row("post_header", guard=or_(eq(buf, W), x, gt(QUIT, 0), Field("fl"))),
           "deadlock_free"),
    Mutant("fetch_up_to_W",
           "take_sample fills up to W instead of the round's cap: at the cap a rank may fetch or post (two rows "
           "enabled), so the window a rank posts depends on timing",
           lambda: DGAP.replace_row("take_sample", guard=and_(not_(Field("fl")), not_(x), lt(buf, W), eq(QUIT, 0),
                                                              Input("src_has"))),
           "local_determinism"),
    # -- one per property that no mutant above is expected to kill -----------------------------
    Mutant("pad_empty_rank_sits_out",
           "PAD owes fillers only to a rank that still holds samples (nfill := target - real if buf > 0): "
           "an empty rank sits the round out as in JOIN, so the ranks end with different step counts",
           lambda: _updates(DGAP, "return_go", nfill=ite(and_(eq(MODE, PAD), gt(buf, 0)),
                                                          Let("target") - mn(Let("target"), buf), Const(0))),
           "equal_steps_at_end"),
    Mutant("join_hi_is_max_n",
           "JOIN clamps the target by max_n (PAD's bound) instead of the smallest non-empty window: a rank "
           "with fewer samples than T emits fewer than T real batches and no fillers",
           lambda: _let(DGAP, "hi", ite(eq(MODE, QUOTA), Input("min_n"), Input("max_n"))),
           "join_round_emits_target_or_nothing"),
    Mutant("quota_stops_at_short_window",
           "QUOTA stops at the first window that is not full (min_n < W) instead of the first empty one: "
           "the epoch can end with no rank's shard emitted",
           lambda: _let(DGAP, "stop", ite(eq(MODE, QUOTA), lt(Input("min_n"), W), eq(Input("max_n"), 0))),
           "quota_closure"),
    # -- the round exchange's flush round (cfg xchg = 1) -------------------------------------------
    Mutant("flush_never_ends",
           "return_flush does not set fl: every stop sends the ranks into another flush round, forever",
           lambda: _updates(DGAP, "return_flush", fl=None), "bounded_termination"),
    Mutant("stop_ignores_the_flush",
           "return_stop drops its exchange condition: after the first stop a rank may leave or flush (two rows "
           "enabled), so the ranks split between DONE and another collective",
           lambda: DGAP.replace_row("return_stop", guard=and_(Input("ready"), not_(Let("abort")), Let("stop"))),
           "local_determinism"),
    # -- witnesses as expected killers: the mutant removes a behaviour the witness shows ---------
    Mutant("status_reduced_by_min",
           "the header's status is reduced with MIN instead of MAX: only a unanimous stop aborts, so a rank "
           "that stops alone never takes its peers with it",
           lambda: _aggregate_op("max_st", "min"), "an_abort_reaches_a_healthy_rank"),
    Mutant("grouping_never_carries",
           "return_go's use lower bound is buf: the grouping must emit the whole window in T batches "
           "(overfilling them) instead of carrying samples into the next round",
           lambda: _choice(DGAP, "return_go", "use", lo=buf), "carry_is_held_across_rounds"),
)


def by_name(name: str) -> Mutant:
    for m in MUTANTS:
        if m.name == name:
            return m
    raise KeyError(f"no mutant {name!r}; mutants: {[m.name for m in MUTANTS]}")
