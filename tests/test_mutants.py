"""Every seeded mutant of the table is killed, by the check expected to kill it.

The explicit engine only (the z3 kills are in `make verify`); a few seconds on one core:
each mutant runs the cheap quit scope first and the larger scope only if needed.
"""

import pytest

from odb.protocol.table import DGAP
from proofs.mutants import KILL, MUTANTS, by_name, check_mutant

ABORT_MUTANTS = ("return_go_ignores_abort", "return_stop_ignores_abort", "quit_leaves_without_posting",
                 "post_status_constant_zero", "return_abort_forgets_ab", "abort_decided_locally",
                 "fetch_ignores_quit")


def test_the_catalogue_has_the_fifteen_mutants_and_the_abort_mutants_all_distinct():
    hashes = {m.table().hash for m in MUTANTS}
    assert len(MUTANTS) >= 18 and len(hashes) == len(MUTANTS) and DGAP.hash not in hashes
    for name in ABORT_MUTANTS:
        by_name(name)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed_by_its_expected_killer(mutant):
    r = check_mutant(mutant)
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
