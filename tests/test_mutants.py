"""Every seeded mutant of the table is killed, by the check expected to kill it.

The explicit engine only (the z3 kills are in `make verify`); about 20 s on one core,
dominated by `take_allows_empty_batches` (its runs go on until the rounds bound).
"""

import pytest

from odb.protocol.table import DGAP
from proofs.mutants import MUTANTS, check_mutant


def test_the_catalogue_has_at_least_twelve_distinct_mutants():
    hashes = {m.table().hash for m in MUTANTS}
    assert len(MUTANTS) >= 12 and len(hashes) == len(MUTANTS) and DGAP.hash not in hashes


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed_by_its_expected_killer(mutant):
    r = check_mutant(mutant)
    assert r.killed, f"{mutant.name} survived"
    assert r.killed_as_expected, f"{mutant.name}: expected {mutant.expected}, killed by {r.killers}"
    assert r.counterexample


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if not m.validate], ids=lambda m: m.name)
def test_mutants_that_bypass_validation_are_rejected_by_table_validate(mutant):
    with pytest.raises(ValueError):
        mutant.build().validate()
