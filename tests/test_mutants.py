"""Every seeded mutant of the table is killed, by the check expected to kill it.

The explicit engine only (the z3 kills are in `make verify`); a few seconds on one core:
each mutant runs the cheap quit scope first and the larger scope only if needed.
"""

import pytest

from models.properties import PROPERTIES
from odb.protocol.table import DGAP
from proofs.explicit.check import check_scope
from proofs.mutants import KILL, MUTANT_SCOPES, MUTANTS, by_name, check_mutant
from proofs.mutants.check import lost_witnesses

ABORT_MUTANTS = ("return_go_ignores_abort", "return_stop_ignores_abort", "quit_leaves_without_posting",
                 "post_status_constant_zero", "return_abort_forgets_ab", "abort_decided_locally",
                 "fetch_ignores_quit")


def test_the_catalogue_has_the_fifteen_mutants_and_the_abort_mutants_all_distinct():
    hashes = {m.table().hash for m in MUTANTS}
    assert len(MUTANTS) >= 18 and len(hashes) == len(MUTANTS) and DGAP.hash not in hashes
    for name in ABORT_MUTANTS:
        by_name(name)


@pytest.fixture(scope="module")
def results():
    return {m.name: check_mutant(m) for m in MUTANTS}


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed_by_its_expected_killer(mutant, results):
    r = results[mutant.name]
    assert r.killed, f"{mutant.name} survived"
    assert r.killed_as_expected, f"{mutant.name}: expected {mutant.expected}, killed by {r.killers}"
    assert r.counterexample


def test_an_incomplete_search_kills_nothing():
    # a truncated search gives "unknown" verdicts: they are never credited as kills
    r = check_mutant(by_name("return_stop_ignores_abort"), max_states=5)
    assert KILL == "failed" and not r.killed and r.killers == []


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if not m.validate], ids=lambda m: m.name)
def test_mutants_that_bypass_validation_are_rejected_by_table_validate(mutant):
    with pytest.raises(ValueError):
        mutant.build().validate()


def test_every_always_property_is_the_expected_killer_of_a_mutant_killed_as_expected(results):
    expected = {m.expected for m in MUTANTS if results[m.name].killed_as_expected}
    missing = [p.name for p in PROPERTIES if p.kind == "always" and p.name not in expected]
    assert missing == [], f"no mutant is expected to be (and is) killed by {missing}"


def test_a_witness_is_a_killer_only_where_the_unmutated_table_reaches_it():
    # DGAP loses nothing against itself
    small = MUTANT_SCOPES[0]
    assert lost_witnesses(check_scope(small, confluence_n_max=2).verdicts, small) == []
    # D <= 1 < W holds no carry even on DGAP: the never-carrying mutant is not credited there ...
    res = check_scope(small, table=by_name("grouping_never_carries").table(), confluence_n_max=2)
    assert any(v.property == "carry_is_held_across_rounds" and v.result == "not found" for v in res.verdicts)
    assert not any(v.property == "carry_is_held_across_rounds" for v in lost_witnesses(res.verdicts, small))
    # ... but in the scope with D > W it is, with a "failed" verdict (the only result that kills)
    r = check_mutant(by_name("grouping_never_carries"))
    # (the scopes run in order until the expected killer fails: the D > W one, before the exchange's)
    assert r.scopes == [str(s) for s in MUTANT_SCOPES[:2]] and "carry_is_held_across_rounds/pad" in r.killers
    assert "WITNESS LOST" in r.counterexample
