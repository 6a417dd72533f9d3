"""The table is well formed, hashes stably, and its interpreter enforces its contracts."""

import pytest

from odb.errors import ProtocolError
from odb.protocol import DGAP, FILL, WAIT, fire, initial_local, step
from odb.protocol.expr import Field, Input, eq

CFG = {"W": 2, "W0": 2, "mode": 0, "header_len": 1, "xchg": 0}


def test_table_validates_and_hash_is_stable():
    DGAP.validate()
    assert DGAP.hash == DGAP.hash
    assert len(DGAP.hash) == 64


def test_hash_changes_when_a_guard_changes():
    mutated = DGAP.replace_row("post_header", guard=eq(Field("buf"), 0))
    assert mutated.hash != DGAP.hash


def test_validate_rejects_a_shape_that_depends_on_local_state():
    bad = DGAP.replace_row("post_header", effect=DGAP.row("post_header").effect.__class__(
        "post", payload=(("n", Field("buf")),), shape=Field("buf")))
    with pytest.raises(ValueError, match="shape"):
        bad.validate()


def test_data_source_is_asked_only_when_a_guard_needs_it():
    local = initial_local(DGAP, CFG)
    asked = []

    def inputs(name):
        asked.append(name)
        return 0 if name == "quit" else True

    s = step(DGAP, local, inputs, CFG, lambda *a: 0)
    assert s.row == "take_sample" and asked == ["quit", "src_has"]
    full = dict(local, buf=2)
    asked.clear()
    s = step(DGAP, full, inputs, CFG, lambda *a: 0)
    # A full window posts without asking the source; the header's status reads `quit`.
    assert s.row == "post_header" and asked == ["quit"] and s.after["ph"] == WAIT
    assert s.payload == {"n": 2, "st": 0, "shape": 1}


def test_each_table_runs_its_own_rows_in_one_process():
    """The interpreter compiles a table's guards, updates, effects, choice bounds and decision definitions
    per table: a changed copy of the table (what every table mutant is) runs its own, beside the table."""
    from dataclasses import replace

    from odb.protocol.expr import Const, and_, ite

    local = initial_local(DGAP, CFG)
    inputs = {"quit": 0, "src_has": True}
    assert step(DGAP, local, inputs, CFG, lambda *a: 0).after["buf"] == 1
    shut = DGAP.replace_row("take_sample", guard=and_(DGAP.row("take_sample").guard, Const(False)))
    with pytest.raises(ProtocolError, match="0 rows enabled"):
        step(shut, local, inputs, CFG, lambda *a: 0)
    twice = DGAP.replace_row("take_sample", updates=(("buf", Field("buf") + 2),))
    assert step(twice, local, inputs, CFG, lambda *a: 0).after["buf"] == 2
    assert step(DGAP, local, inputs, CFG, lambda *a: 0).after["buf"] == 1
    wait = dict(local, ph=WAIT, buf=2)
    ready = {"ready": True, "max_st": 0, "max_n": 2, "min_n": 2, "min_pos_n": 2, "proposal": 1, "quit": 0}
    seen = []
    step(DGAP, wait, ready, CFG, lambda row, c, lo, hi, params: seen.append((lo, hi)) or hi)
    row = DGAP.row("return_go")
    wide = DGAP.replace_row("return_go", choices=(replace(row.choices[0], lo=Const(0)),))
    step(wide, wait, ready, CFG, lambda row, c, lo, hi, params: seen.append((lo, hi)) or hi)
    lets = tuple((n, ite(Const(True), Const(2), e) if n == "target" else e) for n, e in DGAP.lets)
    two = replace(DGAP, lets=lets)
    got = step(two, wait, ready, CFG, lambda row, c, lo, hi, params: seen.append((lo, hi)) or hi)
    assert seen == [(1, 2), (0, 2), (2, 2)] and got.after["T"] == 2
    assert step(DGAP, wait, ready, CFG, lambda *a: 2).after["T"] == 1


def test_a_table_used_by_the_interpreter_still_pickles():
    """The interpreter caches generated functions beside a table's fields; a table that has run still pickles
    (its fields), and the copy runs alike."""
    import pickle

    local, inputs = initial_local(DGAP, CFG), {"quit": 0, "src_has": True}
    want = step(DGAP, local, inputs, CFG, lambda *a: 0)
    copy = pickle.loads(pickle.dumps(DGAP))
    assert copy.hash == DGAP.hash and step(copy, local, inputs, CFG, lambda *a: 0) == want


def test_choice_outside_its_contract_is_rejected():
    local = dict(initial_local(DGAP, CFG), ph=WAIT, buf=2)
    inputs = {"ready": True, "max_st": 0, "max_n": 2, "min_n": 2, "min_pos_n": 2, "proposal": 1}
    with pytest.raises(ProtocolError, match="use"):
        fire(DGAP, DGAP.row("return_go"), local, inputs, CFG, {"use": 0})
    s = fire(DGAP, DGAP.row("return_go"), local, inputs, CFG, {"use": 2})
    assert s.after["T"] == 1 and s.after["nreal"] == 1 and s.after["pend"] == 2


def test_step_still_checks_a_choice_against_its_contract():
    """`step` skips `fire`'s second look at the guard `enabled_rows` just evaluated, not the choice's bounds:
    a rank whose `choose` answers outside [lo, hi] stops with ProtocolError, and one inside fires."""
    local = dict(initial_local(DGAP, CFG), ph=WAIT, buf=2)
    inputs = {"ready": True, "max_st": 0, "max_n": 2, "min_n": 2, "min_pos_n": 2, "proposal": 1, "quit": 0}
    for bad in (0, 3):
        with pytest.raises(ProtocolError, match=f"use={bad} outside its contract"):
            step(DGAP, local, inputs, CFG, lambda row, c, lo, hi, params: bad)
    s = step(DGAP, local, inputs, CFG, lambda row, c, lo, hi, params: hi)
    assert s.row == "return_go" and s.params == {"use": 2} and s.after["pend"] == 2


def test_fire_rejects_a_row_whose_guard_is_false():
    local = dict(initial_local(DGAP, CFG), buf=2)  # a full window posts; it does not take a sample
    with pytest.raises(ProtocolError, match="take_sample is not enabled"):
        fire(DGAP, DGAP.row("take_sample"), local, {"quit": 0, "src_has": True}, CFG, {})


@pytest.mark.parametrize("scope", [{"fields": {}}, {"fields": None}, {}])
def test_an_unbound_leaf_raises_naming_it(scope):
    from odb.protocol.expr import Scope, evaluate

    with pytest.raises(KeyError, match=r"Field\('buf'\) is not bound"):
        evaluate(eq(Field("buf"), 0), Scope(**scope))


def test_initial_state_is_fill():
    assert initial_local(DGAP, CFG)["ph"] == FILL


@pytest.mark.parametrize("leaf", [Field("buf"), Input("quit"), Input("src_has")])
def test_validate_rejects_a_decision_that_reads_rank_local_values(leaf):
    from dataclasses import replace

    from odb.protocol.expr import gt

    lets = tuple((n, gt(leaf, 0) if n == "abort" else e) for n, e in DGAP.lets)
    with pytest.raises(ValueError, match="rank-local"):
        replace(DGAP, lets=lets).validate()
