"""MkDocs hook: the pages generated from the repository, never hand-copied.

* ``results.md`` and ``results/*``: every file of ``paper_repro/results/`` (the Markdown reports with the plots
  they link), and an index page listing them under ``SUMMARY.md``'s text;
* ``proofs/REPORT.md``: the proof report as ``make verify`` wrote it;
* ``decisions/index.md``: the decision records, newest first, each with its title.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "paper_repro" / "results"


def _title(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem


def _results_page() -> str:
    reports = sorted(RESULTS.glob("*.md"))
    lines = ["# Results", "", "Generated at build time from `paper_repro/results/` (`make repro`, `make bench` and the "
             "scale grids write these files; `python -m paper_repro.provenance` says which are current).", "",
             "Every report:", ""]
    lines += [f"- [{_title(p)}](results/{p.name}) (`{p.name}`)" for p in reports if p.name != "SUMMARY.md"]
    summary = (RESULTS / "SUMMARY.md").read_text().split("\n", 1)[1]
    summary = summary.replace("](", "](results/").replace("](results/http", "](http")
    return "\n".join(lines + ["", "## The reproduction summary (`SUMMARY.md`)", "", summary])


def _decisions_page(config) -> str:
    records = sorted((Path(config["docs_dir"]) / "decisions").glob("20*.md"), reverse=True)
    lines = ["# Decision records", "", "Dated measurements, and why the code is as it is; newest first.", ""]
    return "\n".join(lines + [f"- {p.stem[:10]}: [{_title(p)}]({p.name})" for p in records])


def on_files(files: Files, config) -> Files:
    for path in sorted(RESULTS.iterdir()):
        if path.suffix in (".md", ".png"):
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    files.append(File.generated(config, "results.md", content=_results_page()))
    files.append(File.generated(config, "proofs/REPORT.md", abs_src_path=str(ROOT / "proofs" / "REPORT.md")))
    files.append(File.generated(config, "decisions/index.md", content=_decisions_page(config)))
    return files
