"""The explicit engine explores exactly the model, its shortcuts are sound, and the table passes at small scope.

Small scopes only (the full N<=6 scope runs in `make verify`); the whole file takes
about 20 s on one core.
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
from proofs.explicit.props import compile_formula
from proofs.explicit.selfcheck import fast_matches_model, reduction_sound, symmetry_self_test

MODES = (PAD, JOIN, QUOTA)

# (mode, N, D, W) -> (canonical states, transitions, BFS depth, sinks, longest path).
# Any unintended change to the table, the environment or the engine changes a number here.
PINNED = {
    (PAD, 1, 2, 2): (69, 70, 16, 10, 16),
    (PAD, 2, 2, 2): (694, 1090, 29, 24, 29),
    (PAD, 3, 2, 2): (4701, 10500, 42, 44, 42),
    (JOIN, 3, 2, 2): (4414, 9662, 42, 46, 42),
    (QUOTA, 3, 2, 2): (1978, 4240, 42, 34, 42),
    (PAD, 2, 3, 2): (2597, 4268, 40, None, 40),
}


@pytest.mark.parametrize("key", sorted(PINNED), ids=str)
def test_state_counts_are_pinned(key):
    mode, n, d, w = key
    r = explore(n, d, w, mode)
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
    for n, d in ((1, 3), (2, 3)):
        count, bad = fast_matches_model(n, d, 2, mode)
        assert count > 0 and bad == []
    count, bad = fast_matches_model(3, 1, 2, mode)
    assert count > 0 and bad == []


@pytest.mark.parametrize("mode", MODES)
def test_symmetry_self_test_every_permutation_has_the_same_canonical_successors(mode):
    pairs, bad = symmetry_self_test(2, 3, 2, mode)
    assert pairs > 1000 and bad == []
    pairs, bad = symmetry_self_test(3, 1, 2, mode)
    assert pairs > 100 and bad == []


@pytest.mark.parametrize("mode", MODES)
def test_reduced_and_unreduced_runs_agree(mode):
    figures, diffs = reduction_sound(2, 3, 2, mode)
    assert diffs == [] and figures["unreduced_states"] > figures["reduced_states"]


def test_compiled_properties_agree_with_models_logic_on_every_reachable_state():
    for mode in MODES:
        r = explore(2, 3, 2, mode)
        index = {f: i for i, f in enumerate(DGAP.field_names)}
        index.update({f: len(index) + j for j, f in enumerate(("src", "d", "posted", "pn", "pshape"))})
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
            "every_row_fires", "confluent", "worst_case_rounds_match_closed_form"} <= names


def test_rounds_follow_the_closed_form_exactly():
    r = explore(3, 3, 2, PAD)
    assert r.per_vector[(0, 1, 3)]["max_rounds"] == 4 and r.per_vector[(0, 0, 0)]["max_rounds"] == 1
    q = explore(3, 3, 2, QUOTA)
    assert q.per_vector[(1, 2, 3)]["max_rounds"] == 2 and q.per_vector[(0, 2, 3)]["max_rounds"] == 1


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
    assert "max_i d_i + 1 (pad, join)" in BOUND_FORMULA and "min_i d_i + 1 (quota)" in BOUND_FORMULA
