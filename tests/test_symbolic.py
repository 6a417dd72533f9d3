"""The z3 all-N proofs: they pass on the DGAP table, and they have teeth.

Invariant: on DGAP every verdict of every mode is "proved"; on a seeded bug some verdict is
not; a table the encoder cannot handle gives a failed "encoding" verdict, never an exception;
z3 "unknown" is never a pass.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from models.logic import Forall
from models.properties import PROPERTIES, antecedent, by_name, f, for_mode, ph_is, witness_for
from odb.protocol.expr import Const, Field, Input, Let, and_, eq, gt, implies, lt, not_
from odb.protocol.table import DGAP, DONE, FILL, JOIN, PAD, QUOTA, Effect, Row
from proofs.symbolic import BOUND_FORMULA, BOUND_STATEMENT, INVARIANT, prove_all
from proofs.symbolic.prove import falsifiability, witness_check
from proofs.verdict import Verdict

MODE_NAME = {PAD: "pad", JOIN: "join", QUOTA: "quota"}
# verdicts not derived from the invariant (they read no Inv, so a broken invariant does not gate them)
FREE_CHECKS = ("inductive_invariant", "non_vacuity", "witnesses_imply_antecedents")


@pytest.fixture(scope="module")
def dgap_verdicts() -> list[Verdict]:
    return prove_all(DGAP, modes=(PAD, JOIN, QUOTA))


def test_every_obligation_is_proved_on_dgap_in_every_mode(dgap_verdicts):
    failed = [(v.mode, v.property, v.result, v.detail) for v in dgap_verdicts if not v.ok]
    assert not failed, failed
    for mode, name in MODE_NAME.items():
        got = {v.property for v in dgap_verdicts if v.mode == name}
        always = {p.name for p in for_mode(mode) if p.kind == "always"}
        assert got == always | {f"{p}: falsifiable" for p in always} | {
            "inductive_invariant", "non_vacuity", "deadlock_free", "bounded_termination", "local_determinism",
            "witnesses_imply_antecedents"}


def test_the_invariant_is_checked_conjunct_by_conjunct_for_every_transition(dgap_verdicts):
    for v in dgap_verdicts:
        if v.property == "inductive_invariant":
            n, t = v.extra["conjuncts"], v.extra["transitions"]
            assert t == len(DGAP.rows) + 2   # every row, complete, quit
            assert v.extra["queries"] == n * (1 + t)   # Init => c, and Inv & T => c' for every T
            assert n >= 30


def test_non_vacuity_checks_every_transition_and_are_satisfiable(dgap_verdicts):
    for v in dgap_verdicts:
        if v.property == "non_vacuity":
            # Init & Inv, every row, complete and quit, and the deadlock query's hypotheses
            assert v.result == "proved" and v.extra["queries"] == len(DGAP.rows) + 4


def test_the_termination_verdict_states_its_bound(dgap_verdicts):
    assert "sum_i (d_i + 1)" in BOUND_FORMULA and "W + 3" in BOUND_FORMULA and "+ R + N" in BOUND_FORMULA
    assert "lexicographic" in BOUND_STATEMENT and "quit" in BOUND_STATEMENT
    for v in dgap_verdicts:
        if v.property == "bounded_termination":
            assert v.extra["bound"] == BOUND_FORMULA
            assert v.extra["queries"] >= 3 * len(DGAP.rows)
            assert "quit lowers the stopped rank's quit budget" not in v.detail   # proved, so not listed


def test_aborts_are_proved_in_every_mode(dgap_verdicts):
    for name in MODE_NAME.values():
        got = {v.property: v for v in dgap_verdicts if v.mode == name}
        assert got["ranks_agree_on_abort"].result == "proved"


# -- teeth: seeded bugs ---------------------------------------------------------------
def _exit_early() -> "DGAP.__class__":
    """A rank that goes DONE when its own source is exhausted, without posting its header."""
    row = Row("exit_early", FILL, and_(Field("exhausted"), eq(Field("buf"), 0)), Effect("none"), (), DONE,
              "seeded bug: leaves the collective sequence on local exhaustion")
    return replace(DGAP, rows=(row,) + DGAP.rows)


def _stop_reads_local_buf():
    """The stop decision reads the rank's own buf instead of the collective's result."""
    lets = dict(DGAP.lets)
    lets["stop"] = eq(Field("buf"), 0)
    return replace(DGAP, lets=tuple(lets.items()))


def test_a_rank_that_exits_without_posting_is_caught_in_every_mode():
    verdicts = prove_all(_exit_early(), modes=(PAD, JOIN, QUOTA))
    for name in MODE_NAME.values():
        inv = next(v for v in verdicts if v.mode == name and v.property == "inductive_invariant")
        assert inv.result == "failed"
        # the failure names the transition and the conjunct, and prints a two-state CTI
        assert "exit_early =>" in inv.detail and "fires exit_early" in inv.detail and "field" in inv.detail
        # nothing derived from a broken invariant is reported as proved
        derived = [v for v in verdicts if v.mode == name and v.property not in FREE_CHECKS
                   and not v.property.endswith(": falsifiable")]
        assert derived and all(v.result == "unknown" and "not attempted" in v.detail for v in derived)


def test_a_decision_that_reads_local_state_is_caught():
    verdicts = prove_all(_stop_reads_local_buf(), modes=(PAD,))
    inv = next(v for v in verdicts if v.property == "inductive_invariant")
    assert inv.result == "failed" and "return_stop" in inv.detail


def test_a_filler_that_is_never_counted_down_is_caught():
    bad = DGAP.replace_row("emit_filler", updates=(("nb", Field("nb") + 1), ("kb", Field("kb") + 1)))
    assert any(not v.ok for v in prove_all(bad, modes=(PAD,)))


def test_a_rank_stuck_in_emit_is_a_deadlock():
    stuck = DGAP.replace_row("end_round", guard=and_(eq(Field("nreal"), 0), eq(Field("nfill"), 0), eq(Field("T"), 0)))
    verdicts = {v.property: v for v in prove_all(stuck, modes=(PAD,))}
    # the invariant still holds (end_round simply never fires), so the deadlock query is the one that bites
    assert verdicts["inductive_invariant"].ok
    assert verdicts["deadlock_free"].result == "failed" and "field" in verdicts["deadlock_free"].detail


def test_a_filler_row_that_changes_nothing_breaks_termination():
    loop = DGAP.replace_row("emit_filler", updates=())
    verdicts = {v.property: v for v in prove_all(loop, modes=(PAD,))}
    assert verdicts["inductive_invariant"].ok and verdicts["deadlock_free"].ok
    term = verdicts["bounded_termination"]
    assert term.result == "failed" and "emit_filler decreases" in term.detail


def test_a_row_that_can_never_fire_fails_non_vacuity():
    dead = DGAP.replace_row("see_exhausted", guard=and_(Const(False), Input("src_has")))
    verdicts = prove_all(dead, modes=(PAD,))
    nv = next(v for v in verdicts if v.property == "non_vacuity")
    assert nv.result == "failed" and "see_exhausted" in nv.detail


# -- teeth: seeded abort bugs ---------------------------------------------------------------
def test_return_go_that_ignores_an_abort_is_caught():
    """return_go reads only stop: after a stopping rank's header, a healthy rank may go on emitting
    while the others return to DONE with ab (they no longer agree on the epoch's end)."""
    bad = DGAP.replace_row("return_go", guard=and_(Input("ready"), not_(Let("stop"))))
    for mode in (PAD, QUOTA):
        verdicts = {v.property: v for v in prove_all(bad, modes=(mode,))}
        inv = verdicts["inductive_invariant"]
        assert inv.result == "failed" and "return_go =>" in inv.detail and "fires return_go" in inv.detail
        assert verdicts["bounded_termination"].result == "unknown"   # gated: not a kill


def test_a_stopping_rank_that_leaves_without_posting_is_caught():
    """A rank told to stop goes DONE at once instead of posting its status: its peers would wait
    in the round's collective forever."""
    leave = Row("quit_silently", FILL, gt(Input("quit"), 0), Effect("none"), (), DONE,
                "seeded bug: a stopping rank leaves without posting its status")
    bad = replace(DGAP, rows=(leave,) + DGAP.rows)
    for mode in (PAD, JOIN, QUOTA):
        verdicts = {v.property: v for v in prove_all(bad, modes=(mode,))}
        inv = verdicts["inductive_invariant"]
        assert inv.result == "failed" and "quit_silently =>" in inv.detail


def test_a_stopping_rank_that_may_still_fetch_is_nondeterministic():
    """take_sample ignores quit: a stopping rank may fetch or post (both enabled): the invariant
    and every property still hold, and the all-N determinism query is the one that bites."""
    bad = DGAP.replace_row("take_sample", guard=and_(not_(Field("fl")), not_(Field("exhausted")),
                                                     lt(Field("buf"), Field("cap")), Input("src_has")))
    verdicts = {v.property: v for v in prove_all(bad, modes=(PAD,))}
    assert verdicts["inductive_invariant"].ok and verdicts["deadlock_free"].ok
    det = verdicts["local_determinism"]
    assert det.result == "failed" and "take_sample and post_header" in det.detail and "qt" in det.detail


def test_local_determinism_checks_every_pair_of_rows_of_a_phase(dgap_verdicts):
    pairs = sum(1 for x, a in enumerate(DGAP.rows) for b in DGAP.rows[x + 1:] if a.phase_from == b.phase_from)
    assert pairs >= 9
    for v in dgap_verdicts:
        if v.property == "local_determinism":
            assert v.result == "proved" and v.extra["queries"] == pairs


def test_an_abort_that_forgets_its_flag_is_caught():
    """return_abort goes DONE without ab: the ranks that aborted look like ranks that completed
    the epoch, so nothing_left_at_end / quota_closure would be claimed for an aborted run."""
    bad = DGAP.replace_row("return_abort", updates=(("rd", Field("rd") + 1),))
    verdicts = {v.property: v for v in prove_all(bad, modes=(PAD,))}
    assert verdicts["inductive_invariant"].result == "failed"
    assert "return_abort => done_after_stop_or_abort" in verdicts["inductive_invariant"].detail


def test_a_quit_that_never_reaches_the_header_is_caught():
    """post_header posts st = 0 whatever the rank's status: a stopping rank's partial window goes
    into a round as a healthy one (no abort; the peers go on, the stopping rank cannot fetch)."""
    post = DGAP.row("post_header")
    bad = DGAP.replace_row("post_header", effect=replace(post.effect, payload=(("n", Field("buf")), ("st", Const(0)))))
    inv = next(v for v in prove_all(bad, modes=(PAD,)) if v.property == "inductive_invariant")
    assert inv.result == "failed" and "post_header => wait_full_or_exhausted" in inv.detail


@pytest.mark.parametrize("table,needle", [
    (DGAP.replace_row("end_round", updates=(("T", Const(True)),)), "sort"),
    (DGAP.replace_row("take_sample", guard=Input("no_such_input")), "no_such_input"),
    (DGAP.replace_row("end_round", updates=(("no_such_field", Const(0)),)), "no_such_field"),
    (DGAP.replace_row("post_header", effect=Effect("post", payload=(("m", Field("buf")),), shape=Const(1))),
     "header field 'n'"),
    (DGAP.replace_row("post_header", effect=Effect("post", payload=(("n", Field("buf")),), shape=Const(1))),
     "header field 'st'"),
    (replace(DGAP, aggregates=DGAP.aggregates[:2]), "aggregate"),
    (replace(DGAP, rows=DGAP.rows + (replace(DGAP.row("end_round"), name="quit"),)), "clash"),
], ids=["ill_sorted_update", "unknown_input", "unknown_field", "payload_without_n", "payload_without_st",
        "two_aggregates", "row_named_quit"])
def test_an_unencodable_table_gives_a_failed_verdict_not_an_exception(table, needle):
    verdicts = prove_all(table, modes=(PAD, QUOTA))
    assert verdicts and all(not v.ok for v in verdicts)
    enc = [v for v in verdicts if v.property == "encoding"]
    assert len(enc) == 2 and all(v.result == "failed" and needle in v.detail for v in enc)


def test_z3_unknown_is_never_a_pass():
    verdicts = prove_all(DGAP, modes=(PAD,), timeout_ms=1)
    inv = next(v for v in verdicts if v.property == "inductive_invariant")
    assert inv.result == "unknown" and not inv.ok and "unknown" in inv.detail
    # the checks that read no invariant (falsifiability, witnesses) may finish within 1 ms; nothing else passes
    assert not any(v.ok for v in verdicts if v.property not in FREE_CHECKS and not v.property.endswith(": falsifiable"))


def test_invariant_conjunct_names_are_unique():
    names = [c.name for c in INVARIANT]
    assert len(names) == len(set(names))


# -- every always property can fail, and its witness is about its premise ----------------------
def test_every_always_property_is_falsified_by_some_unconstrained_state(dgap_verdicts):
    for mode, name in MODE_NAME.items():
        got = {v.property: v for v in dgap_verdicts if v.mode == name and v.property.endswith(": falsifiable")}
        assert set(got) == {f"{p.name}: falsifiable" for p in for_mode(mode) if p.kind == "always"}
        for v in got.values():
            assert v.result == "proved" and v.extra["queries"] == 1 and "N=" in v.extra["violated_by"]


def test_a_one_letter_typo_that_makes_a_property_a_tautology_fails_the_falsifiability_check():
    """``equal_steps_at_end`` with ``nb_i`` typed as ``nb_j``: nothing can violate it, so it proves
    nothing; the invariant-based proof of it would still pass."""
    p = by_name("equal_steps_at_end")
    typo = replace(p, formula=Forall("i", Forall("j", implies(
        and_(ph_is("i", DONE), ph_is("j", DONE)), eq(f("j", "nb"), f("j", "nb"))))))
    for mode in p.modes:
        (v,) = falsifiability(DGAP, mode, (typo,))
        assert v.property == "equal_steps_at_end: falsifiable" and v.result == "failed" and not v.ok
        assert "unsat, wanted sat" in v.detail and "tautology" in v.detail
    (real,) = falsifiability(DGAP, PAD, (p,))
    assert real.ok


def test_falsifiability_unknown_is_a_failure():
    (v,) = falsifiability(DGAP, QUOTA, (by_name("quota_closure"),), timeout_ms=1)
    assert v.result in ("proved", "unknown")  # 1 ms may or may not suffice; never "failed" for a real property
    assert v.ok == (v.result == "proved")


def test_every_always_property_names_a_witness_for_each_of_its_modes_that_reaches_its_premise(dgap_verdicts):
    for p in PROPERTIES:
        if p.kind != "always":
            continue
        for mode in p.modes:
            w = witness_for(p, mode)
            assert w is not None and w.kind == "sometimes" and mode in w.modes, (p.name, mode)
    assert antecedent(by_name("samples_accounted").formula) is None
    assert antecedent(by_name("quota_closure").formula) is not None
    for name in MODE_NAME.values():
        (v,) = [v for v in dgap_verdicts if v.mode == name and v.property == "witnesses_imply_antecedents"]
        assert v.result == "proved" and v.extra["queries"] >= 5


def test_a_witness_that_is_not_about_the_premise_or_missing_fails_the_witness_check():
    # a witness about posted headers says nothing about finished ranks
    wrong = replace(by_name("equal_steps_at_end"), witness="two_headers_posted")
    props = tuple(wrong if p.name == wrong.name else p for p in PROPERTIES)
    v = witness_check(DGAP, PAD, props)
    assert v.result == "failed" and "two_headers_posted implies the antecedent of equal_steps_at_end" in v.detail
    # a witness that does not apply in a mode of the property
    narrow = replace(by_name("round_emits_target"), witness="a_filler_is_emitted")
    props = tuple(narrow if p.name == narrow.name else p for p in PROPERTIES)
    v = witness_check(DGAP, QUOTA, props)
    assert v.result == "failed" and "round_emits_target names a witness for quota" in v.detail
