"""The front door (issues 49 and 51): the README's budget, its recipes and the docs site.

* The README stays a front door: at most `README_LINES` lines, no dated figure (measurements go to
  ``docs/decisions/`` and ``paper_repro/results/``).
* Every ``python`` code block a user would paste, in the README and in ``docs/`` (the decision records
  aside), runs: a block that includes an example (``--8<-- "examples/x.py"``) or is the text of one is run by
  ``tests/test_examples.py``; any other block is run here on 2 gloo ranks under torchrun.
* ``mkdocs build --strict`` succeeds (a broken link, reference or include fails it), and every public name
  has a docstring for the API reference.
* One import path per public name in the README, the docs and the examples.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LINES = 210
DATED = re.compile(r"\b20\d\d-[01]\d(-[0-3]\d)?\b|\b(January|February|March|April|May|June|July|August|September|"
                   r"October|November|December) 20\d\d\b")
BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
INCLUDE = re.compile(r'^--8<-- "([^"]+)"\s*$')


def user_pages() -> list[Path]:
    """The README and every docs page a user reads (the dated decision records aside)."""
    return [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md") if "decisions" not in p.parts)


def python_blocks(text: str) -> list[str]:
    return [m.group(1) for m in BLOCK.finditer(text)]


def examples_text() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "examples").glob("*.py")))


def blocks_to_run(pages) -> list[tuple[str, str]]:
    """(page, block) for every python block that no example covers; a missing included file raises."""
    out, examples = [], examples_text()
    for page in pages:
        for block in python_blocks(page.read_text()):
            inc = INCLUDE.match(block.strip())
            if inc:
                path = ROOT / inc.group(1)
                assert path.exists() and path.parent.name == "examples", f"{page.name} includes {inc.group(1)}"
                continue
            if block.strip() in examples:
                continue
            out.append((page.name, block))
    return out


def run_block(block: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "recipe.py"
    script.write_text(block)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    return subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=240)


def test_the_readme_is_a_front_door_of_at_most_its_budget_without_dated_figures():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_LINES
    dated = [line for line in text.splitlines() if DATED.search(line)]
    assert not dated, f"dated lines belong in docs/decisions/ or paper_repro/results/: {dated}"
    first_screen = "\n".join(text.splitlines()[:70])
    for what in ("pip install", "```python", "make repro", "make test"):
        assert what in first_screen, f"the README's first screen lacks {what!r}"


def test_the_readme_quickstart_is_the_example_that_runs():
    block = python_blocks((ROOT / "README.md").read_text())[0]
    assert block.strip() in (ROOT / "examples" / "quickstart.py").read_text()


def test_the_date_check_and_the_block_finder_have_teeth(tmp_path):
    assert DATED.search("run on 2026-12-05") and DATED.search("in December 2026") and not DATED.search("W = 2048")
    page = tmp_path / "page.md"
    page.write_text('text\n```python\nraise SystemExit(3)\n```\n```python\n--8<-- "examples/quickstart.py"\n```\n')
    blocks = blocks_to_run([page])
    assert [b for _, b in blocks] == ["raise SystemExit(3)\n"]
    page.write_text('```python\n--8<-- "examples/gone.py"\n```\n')
    with pytest.raises(AssertionError, match="includes examples/gone.py"):
        blocks_to_run([page])


@pytest.mark.slow  # each block: 2 torchrun ranks (about 10 s)
def test_every_python_block_a_user_would_paste_runs_on_two_gloo_ranks(tmp_path):
    for page, block in blocks_to_run(user_pages()):
        proc = run_block(block, tmp_path)
        assert proc.returncode == 0, f"a block of {page} failed:\n{block}\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}"


@pytest.mark.slow
def test_a_failing_block_fails_the_recipe_run(tmp_path):
    proc = run_block("import sys\nsys.exit(3)\n", tmp_path)
    assert proc.returncode != 0


def test_the_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra: make test installs it")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert (tmp_path / "site" / "results" / "SUMMARY" / "index.html").exists()
    assert "buffer_size" in (tmp_path / "site" / "api" / "index.html").read_text()


PUBLIC = ["odb", "odb.batching", "odb.integrations", "odb.integrations.hf", "odb.integrations.trl",
          "odb.integrations.accelerate", "odb.integrations.lightning", "odb.runtime", "odb.plan"]


def test_every_public_name_has_a_docstring():
    missing = []
    for mod in PUBLIC:
        m = importlib.import_module(mod)
        for name in m.__all__:
            obj = getattr(m, name)
            if callable(obj) and not (getattr(obj, "__doc__", None) or "").strip():
                missing.append(f"{mod}.{name}")
    assert not missing


def canonical_paths() -> dict[str, str]:
    """Each public name -> the shortest module that exports it (the one path the docs use)."""
    out: dict[str, str] = {}
    for mod in PUBLIC:
        for name in importlib.import_module(mod).__all__:
            out.setdefault(name, mod)
    return out


def test_the_readme_the_docs_and_the_examples_use_one_import_path_per_public_name():
    canon = canonical_paths()
    bad = []
    texts = [(p, p.read_text()) for p in user_pages()] + [(p, p.read_text()) for p in (ROOT / "examples").glob("*.py")]
    for path, text in texts:
        for line in text.splitlines():
            if line.startswith(":::"):  # an API reference directive names the definition's module
                continue
            for mod, names in re.findall(r"from (odb(?:\.\w+)*) import ([\w, ]+)", line):
                bad += [f"{path.name}: {mod}.{n}" for n in map(str.strip, names.split(","))
                        if n in canon and canon[n] != mod]
            for mod, name in re.findall(r"\b(odb(?:\.\w+)*)\.(\w+)\b", line):
                if f"{mod}.{name}" in PUBLIC:  # a public module (`odb.plan`), not its function of that name
                    continue
                if name in canon and canon[name] != mod:
                    bad.append(f"{path.name}: {mod}.{name}")
    assert not bad, f"use the shortest public path: {sorted(set(bad))}"
