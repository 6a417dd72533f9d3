"""The stage map (`docs/architecture.md`) stays true: every dotted name it lists resolves to an object of the
code, and every stage class of the placement is listed."""

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = (ROOT / "docs" / "architecture.md").read_text()


def _resolve(dotted: str):
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for a in parts[k:]:
            obj = getattr(obj, a)
        return obj
    raise ImportError(dotted)


def test_every_name_the_stage_map_lists_exists():
    names = sorted(set(re.findall(r"`((?:odb)\.[A-Za-z_][\w.]*)`", MAP)))
    assert len(names) > 25, names
    missing = []
    for n in names:
        try:
            _resolve(n)
        except (ImportError, AttributeError):
            missing.append(n)
    assert not missing, f"docs/architecture.md names what the code lacks: {missing}"


def test_the_map_lists_every_placement_and_every_callback_the_core_hands_the_interpreter():
    import ast

    from odb.core import placement

    for cls in ("OwnStage", "PoolStage", "ExchangeStage"):
        assert f"odb.core.placement.{cls}" in MAP
    assert set(placement.__all__) >= {"OwnStage", "PoolStage", "ExchangeStage"}
    # the callbacks RankCore hands machine.step and machine.run: read from the source, so a new one must be mapped
    tree = ast.parse((ROOT / "odb" / "core" / "rank.py").read_text())
    handed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("machine.step", "machine.run"):
            handed |= {a.attr for a in node.args if isinstance(a, ast.Attribute) and a.attr.startswith("_")}
    assert handed == {"_input", "_choose", "_selected", "_fired"}, handed
    for name in handed:
        assert f"odb.core.rank.RankCore.{name}" in MAP
