"""The explicit engine explores exactly the model, its shortcuts are sound, and the table passes at small scope.

Small scopes only (the full N<=6 scope runs in `make verify`); the whole file takes
about 30 s on one core.
"""

import pytest

from models.env import Model
from models.logic import holds
from models.properties import for_mode
from models.scopes import Scope
from odb.protocol.table import DGAP, DONE, JOIN, PAD, QUOTA
from proofs.explicit import counterexample, explore
from proofs.explicit.check import check_scope
from proofs.explicit.confluence import check_confluence
from proofs.explicit.fast import rank_layout
from proofs.explicit.props import compile_formula
from proofs.explicit.selfcheck import fast_matches_model, reduction_sound, symmetry_self_test

MODES = (PAD, JOIN, QUOTA)

# (mode, N, D, W, quits) -> (canonical states, transitions, BFS depth, sinks, longest path).
# Any unintended change to the table, the environment or the engine changes a number here.
PINNED = {
    (PAD, 1, 2, 2, 0): (69, 70, 16, 10, 16),
    (PAD, 2, 2, 2, 0): (694, 1090, 29, 24, 29),
    (PAD, 3, 2, 2, 0): (4701, 10500, 42, 44, 42),
    (JOIN, 3, 2, 2, 0): (4414, 9662, 42, 46, 42),
    (QUOTA, 3, 2, 2, 0): (1978, 4240, 42, 34, 42),
    (PAD, 2, 3, 2, 0): (2597, 4268, 40, None, 40),
    (PAD, 3, 2, 2, 1): (22602, 61327, 43, None, 43),
    (QUOTA, 3, 2, 2, 2): (21417, 60885, 44, None, 44),
}


@pytest.mark.parametrize("key", sorted(PINNED), ids=str)
def test_state_counts_are_pinned(key):
    mode, n, d, w, q = key
    r = explore(n, d, w, mode, quits=q)
    states, transitions, depth, sinks, longest = PINNED[key]
    assert (r.states, r.transitions, r.depth, r.longest_path) == (states, transitions, depth, longest)
    if sinks is not None:
        assert r.sinks == sinks


def test_canonical_state_count_equals_the_generic_models_count():
    # the generic Model with SysState.canon reaches the same number of classes
    model = Model(W=2, mode=PAD)
    seen = {model.initial(d).canon() for d in [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]}
    todo = list(seen)
    while todo:
        s = todo.pop()
        for _, t in model.successors(s):
            t = t.canon()
            if t not in seen:
                seen.add(t)
                todo.append(t)
    assert len(seen) == explore(2, 2, 2, PAD).states


@pytest.mark.parametrize("mode", MODES)
def test_fast_successors_equal_the_generic_model_on_every_reachable_state(mode):
    for n, d, q in ((1, 3, 0), (2, 3, 0), (3, 1, 0), (2, 2, 1), (3, 1, 2)):
        count, bad = fast_matches_model(n, d, 2, mode, quits=q)
        assert count > 0 and bad == []


def test_fast_successors_include_the_environments_quit_and_respect_its_limit():
    r = explore(2, 1, 2, PAD, quits=1)
    assert r.fires["quit"] > 0 and r.fires["return_abort"] > 0
    fm = r.fm
    for s in r.states_list:
        num_quit = sum(fm.rank_of[i][fm.layout["qt"]] for i in s[0])
        assert num_quit <= 1
        quits = [t for _, row, _, t in fm.successors(s) if row == "quit"]
        assert (quits == []) == (num_quit == 1 or fm.all_done(s) or
                                 all(fm.rank_of[i][fm.layout["ph"]] == DONE for i in s[0]))
    assert explore(2, 1, 2, PAD).fires["quit"] == 0


@pytest.mark.parametrize("mode", MODES)
def test_symmetry_self_test_every_permutation_has_the_same_canonical_successors(mode):
    pairs, bad = symmetry_self_test(2, 3, 2, mode)
    assert pairs > 1000 and bad == []
    pairs, bad = symmetry_self_test(3, 1, 2, mode)
    assert pairs > 100 and bad == []
    pairs, bad = symmetry_self_test(2, 1, 2, mode, quits=2)
    assert pairs > 100 and bad == []


@pytest.mark.parametrize("mode", MODES)
def test_reduced_and_unreduced_runs_agree(mode):
    figures, diffs = reduction_sound(2, 3, 2, mode)
    assert diffs == [] and figures["unreduced_states"] > figures["reduced_states"]
    figures, diffs = reduction_sound(3, 1, 2, mode, quits=1)
    assert diffs == [] and figures["unreduced_states"] > figures["reduced_states"]


def test_rank_layout_is_the_models_own():
    lay = rank_layout(DGAP)
    s = Model(W=2, mode=PAD).initial((3,))
    assert s.ranks[0][lay["d"]] == 3 and s.ranks[0][lay["src"]] == 3
    assert all(s.rank_value(0, f) == s.ranks[0][i] for f, i in lay.items())


def test_compiled_properties_agree_with_models_logic_on_every_reachable_state():
    index = rank_layout(DGAP)
    for mode in MODES:
        for n, d, q in ((2, 3, 0), (2, 2, 1)):
            r = explore(n, d, 2, mode, quits=q)
            comp = [(p, compile_formula(p.formula, index, r.model.cfg, DGAP.let_map)) for p in for_mode(mode)]
            disagreements = 0
            for s in r.states_list:
                sysv = r.fm.to_sys(s)
                for p, c in comp:
                    disagreements += c.fn(list(sysv.ranks), None) != holds(p.formula, sysv)
            assert disagreements == 0


def test_the_table_passes_every_explicit_check_at_small_scope():
    res = check_scope(Scope(n_max=3, d_max=2, w=2))
    failed = [(v.property, v.mode, v.detail) for v in res.verdicts if not v.ok]
    assert failed == []
    names = {v.property for v in res.verdicts}
    assert {"deadlock_free", "bounded_termination", "completion_possible", "local_determinism",
            "every_row_fires", "confluent", "worst_case_rounds_match_closed_form", "real_batches_non_empty",
            "ranks_agree_on_abort"} <= names
    assert "an_abort_reaches_a_healthy_rank" not in names  # needs a quit: checked in the quit scopes


def test_the_table_passes_every_explicit_check_with_quits():
    res = check_scope(Scope(n_max=2, d_max=2, w=2, quits=2))
    failed = [(v.property, v.mode, v.detail) for v in res.verdicts if not v.ok]
    assert failed == []
    by = {(v.property, v.mode): v for v in res.verdicts}
    for m in ("pad", "join", "quota"):
        assert by[("an_abort_reaches_a_healthy_rank", m)].result == "found"
        assert by[("rounds_within_closed_form", m)].result == "holds"
        assert by[("every_row_fires", m)].extra["fires"]["return_abort"] > 0
    assert not any(v.property == "confluent" for v in res.verdicts)  # confluence: without quits only


def test_an_empty_real_batch_is_reported_by_the_step_property():
    from odb.protocol.expr import Const
    from proofs.mutants.catalogue import _choice
    bad = _choice(DGAP, "emit_group", "take", lo=Const(0))
    r = explore(1, 1, 2, PAD, table=bad, round_bound=lambda d: max(d) + 1)
    assert r.empty_batches and r.empty_batches[0][2] == "emit_group" and r.empty_batches[0][4] == 0
    assert explore(2, 2, 2, PAD).empty_batches == []


def test_rounds_follow_the_closed_form_exactly():
    r = explore(3, 3, 2, PAD)
    assert r.per_vector[(0, 1, 3)]["max_rounds"] == 4 and r.per_vector[(0, 0, 0)]["max_rounds"] == 1
    q = explore(3, 3, 2, QUOTA)
    assert q.per_vector[(1, 2, 3)]["max_rounds"] == 2 and q.per_vector[(0, 2, 3)]["max_rounds"] == 1


def test_with_quits_rounds_stay_within_the_closed_form_and_an_early_quit_ends_after_one_round():
    r = explore(2, 2, 2, PAD, quits=1)
    assert r.per_vector[(2, 2)]["max_rounds"] == 3 and r.per_vector[(2, 2)]["min_rounds"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_deterministic_policies_are_confluent(mode):
    for kind in ("lo", "hi", "hash"):
        c = check_confluence(3, 2, 2, mode, kind)
        assert c["bad"] == {} and c["vectors"] == 10 and not c["truncated"]


def test_a_deadlock_is_reported_with_a_shortest_step_table_and_waits_for_line():
    bad = DGAP.replace_row("see_exhausted", phase_to=DONE)
    r = explore(2, 2, 2, PAD, table=bad)
    assert r.num_deadlocks > 0
    text = counterexample(r, r.deadlocks[0], deadlock=True, title="DEADLOCK")
    assert "shortest: 4 steps" in text
    assert "STUCK: r1 waits in collective #0 for r0 (DONE, round 0)" in text
    assert "r0.ph FILL->DONE" in text


def test_a_search_past_max_states_is_flagged_truncated():
    r = explore(3, 2, 2, PAD, max_states=100)
    assert r.truncated
    res = check_scope(Scope(n_max=1, d_max=2, w=2, modes=(PAD,)), max_states=10)
    assert all(v.result == "unknown" for v in res.verdicts if v.method == "explicit BFS")


def test_the_explicit_bound_is_the_one_the_symbolic_engine_states():
    from proofs.explicit.check import Z3_BOUND_TEXT
    from proofs.symbolic import BOUND_FORMULA
    assert Z3_BOUND_TEXT in BOUND_FORMULA.replace(" ", " ")
    assert "max_i d_i + 1 + xchg (pad, join)" in BOUND_FORMULA and "min_i d_i + 1 + xchg (quota)" in BOUND_FORMULA
    assert "+ R + N" in BOUND_FORMULA and "quit" in BOUND_FORMULA  # one quit per rank on top
