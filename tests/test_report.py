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
