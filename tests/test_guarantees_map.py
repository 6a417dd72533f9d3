"""The guarantees map (`docs/guarantees.md`) stays true: every guarantee the README states has a row, every
property it names reads PROVED or HOLDS in `proofs/REPORT.md` wherever it appears, every test it names exists,
and every result file it names is in the repository."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = (ROOT / "docs" / "guarantees.md").read_text()
README = (ROOT / "README.md").read_text()
REPORT = (ROOT / "proofs" / "REPORT.md").read_text()


def _rows() -> dict[str, list[str]]:
    rows = {}
    for line in MAP.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 4 and cells[0] not in ("guarantee", "---"):
            rows[cells[0]] = cells[1:]
    return rows


def test_every_guarantee_of_the_readme_has_a_row_naming_its_tests():
    section = README.split("## What is guaranteed, and how we know", 1)[1].split("\n## ", 1)[0]
    stated = [b.rstrip(":") for b in re.findall(r"^- \*\*(.+?)\*\*", section, re.M)]
    assert len(stated) >= 10, stated
    rows = _rows()
    assert set(rows) == set(stated), (set(stated) - set(rows), set(rows) - set(stated))
    assert all(re.search(r"`tests/\w+\.py::test_\w+`", tests) for _, tests, _ in rows.values())


def test_every_property_named_is_proved_or_holds_in_every_row_of_the_report():
    names = {n for proof, _, _ in _rows().values() for n in re.findall(r"`(\w+)`", proof)}
    assert len(names) >= 10, names
    for name in names:
        verdicts = re.findall(rf"^\| {name} \|[^\n]*", REPORT, re.M)
        assert verdicts, f"{name}: not in proofs/REPORT.md"
        bad = [v for v in verdicts if not re.search(r"\| (PROVED|HOLDS) \|", v)]
        assert not bad, f"{name}: {bad[:2]}"


def test_every_test_and_file_named_exists():
    missing = []
    for _, tests, measured in _rows().values():
        for path, name in re.findall(r"`(tests/\w+\.py)::(test_\w+)`", tests):
            src = ROOT / path
            defs = {n.name for n in ast.walk(ast.parse(src.read_text())) if isinstance(n, ast.FunctionDef)} \
                if src.exists() else set()
            if name not in defs:
                missing.append(f"{path}::{name}")
        for path in re.findall(r"`((?:paper_repro|proofs|tests)/[\w/.]+\.(?:md|json))`", measured):
            if not (ROOT / path).exists():
                missing.append(path)
    assert not missing, f"docs/guarantees.md names what the repository lacks: {missing}"
