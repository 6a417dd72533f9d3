"""The committed proof report is current (same table hash) and records no failure."""

import json
from pathlib import Path

from odb.protocol.table import DGAP

ROOT = Path(__file__).resolve().parents[1] / "proofs"


def _report() -> dict:
    return json.loads((ROOT / "report.json").read_text())


def test_committed_report_is_for_the_current_table():
    rep = _report()
    assert rep["table_hash"] == DGAP.hash, (
        "proofs/report.json was generated for another table; run `make verify` and commit the report")
    assert DGAP.hash in (ROOT / "REPORT.md").read_text()


def test_committed_report_has_no_failing_verdict_and_every_mutant_killed():
    rep = _report()
    bad = [(v["property"], v["mode"], v["method"], v["result"]) for v in rep["verdicts"]
           if v["result"] not in ("proved", "holds", "found")]
    assert bad == [] and rep["ok"] and rep["failures"] == []
    assert len(rep["mutants"]) >= 18 and all(m["killed_as_expected"] for m in rep["mutants"])


def test_committed_report_contains_the_symbolic_and_the_explicit_engines():
    rep = _report()
    methods = {v["method"] for v in rep["verdicts"]}
    assert any(m.startswith("z3") for m in methods), "the z3 all-N proofs are missing from the report"
    assert "explicit BFS" in methods
    n6 = [r for r in rep["runs"] if r["n"] == 6 and r["d_max"] == 2 and not r.get("quits")]
    assert {r["mode"] for r in n6} == {"pad", "join", "quota"}
    assert {r["mode"] for r in rep["runs"] if r.get("quits")} == {"pad", "join", "quota"}
    witness = [v for v in rep["verdicts"] if v["property"] == "every_witness_found"]
    assert len(witness) == 1 and witness[0]["result"] == "holds"


def test_committed_report_carries_a_deep_run_for_the_current_table():
    deep = _report()["deep_summary"]
    assert deep and deep["table_hash"] == DGAP.hash and deep["failures"] == []
    assert max(r["n"] for r in deep["runs"]) >= 8


def test_committed_report_shows_every_always_property_falsifiable_in_each_of_its_modes():
    from models.properties import PROPERTIES
    rep = _report()
    got = {(v["property"], v["mode"]): v["result"] for v in rep["verdicts"] if v["property"].endswith(": falsifiable")}
    names = {0: "pad", 1: "join", 2: "quota"}
    want = {(f"{p.name}: falsifiable", names[m]) for p in PROPERTIES if p.kind == "always" for m in p.modes}
    assert set(got) == want and set(got.values()) == {"proved"}
    assert [v["result"] for v in rep["verdicts"] if v["property"] == "witnesses_imply_antecedents"] == ["proved"] * 3


def test_committed_report_carries_the_dealt_model_its_z3_proofs_and_its_mutants():
    from proofs.mutants.dealt import DEALT_MUTANTS
    from proofs.symbolic.dealt import OBLIGATIONS
    rep = _report()
    runs = rep["dealt_runs"]
    assert {r["mode"] for r in runs} == {"pad", "join", "quota"} and max(r["n"] for r in runs) == 4
    assert not any(r["truncated"] for r in runs)
    dealt = [v for v in rep["verdicts"] if v["method"] == "explicit BFS (dealt model)"]
    assert dealt and all(v["result"] in ("holds", "found") for v in dealt)
    z3v = {v["property"]: v["result"] for v in rep["verdicts"] if v["method"] == "z3 all-N (dealer arithmetic)"}
    assert z3v == {name: "proved" for name, _ in OBLIGATIONS}
    assert [m["name"] for m in rep["dealt_mutants"]] == [m.name for m in DEALT_MUTANTS]
    assert all(m["killed_as_expected"] for m in rep["dealt_mutants"])
    assert "## Dealt sharding" in (ROOT / "REPORT.md").read_text()
