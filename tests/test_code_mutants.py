"""The seeded code bugs of `tests/quality/code_mutants.py` still apply to the current source.

Killing them takes minutes (`make mutants`); this only keeps the catalogue from rotting: every
mutant's text occurs exactly once in its file, changes it, and names tests that exist.
"""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "quality"))
from code_mutants import MUTANTS, ROOT  # noqa: E402


def test_every_code_mutant_has_a_unique_name_and_the_survivor_classes_are_all_there():
    assert len({m.name for m in MUTANTS}) == len(MUTANTS) >= 30
    assert sum(m.survivor for m in MUTANTS) == 9


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_a_code_mutant_applies_once_and_names_existing_tests(m):
    text = (ROOT / m.path).read_text()
    assert text.count(m.old) == 1, f"{m.name}: its text occurs {text.count(m.old)} times in {m.path}"
    assert m.old != m.new
    for t in m.tests:
        path, _, node = t.partition("::")
        src = (ROOT / path).read_text()
        if node:
            fn = re.sub(r"\[.*\]$", "", node)
            assert re.search(rf"^def {re.escape(fn)}\(", src, re.M), f"{m.name}: no test {t}"


def test_the_mutants_a_hypothesis_property_tests_are_found_by_their_decorator():
    # `--hypothesis-seeds` reruns these under several seeds; a detection that found none would check nothing
    from code_mutants import hypothesis_mutants

    names = {m.name for m in hypothesis_mutants()}
    assert {"array_pack_budget_rounded", "many_groups_fill_reordered", "packed_one_token_over"} <= names
    assert not names & {"stub_never_appended", "header_st_from_live_quit"}  # their tests draw nothing


def test_every_parametrized_test_a_mutant_names_is_collected_under_that_id():
    # a renamed parameter leaves a mutant naming a case that no longer exists: pytest then runs nothing
    import subprocess

    ids = sorted({t for m in MUTANTS for t in m.tests if "[" in t})
    files = sorted({t.partition("::")[0] for t in ids})
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                         cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    collected = set(out.split())
    assert ids and [t for t in ids if t not in collected] == []
