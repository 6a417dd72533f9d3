"""Mechanical mutation testing with cosmic-ray, beside our own catalogue (`code_mutants.py`).

Legend
    package    a folder of code that decides correctness and the tests that must defend it (`PACKAGES`)
    mutant     one change cosmic-ray's operators make to one AST node (a number, a comparison, a boolean,
               a binary operator, a removed decorator, ...): thousands per package
    killed     its package's tests fail on it (any failure, error or timeout); survived: they pass
    baseline   `BASELINE`: each surviving mutant that is equivalent (no test can tell it from the code),
               keyed by its file, operator and the mutated line's text, with the reason; a survivor not in
               it is a hole in the tests
    sample     ``--sample K``: K mutants per package, drawn with ``--seed``, the rest skipped; the full run
               (``--sample 0``) takes hours on 2 cores

Each package's session runs in a copy of the working tree (cosmic-ray mutates files in place), with the
project's own Python running the tests.  The report (``--report``, default `REPORT`) holds the kill rate per
package and every survivor with its diff, and whether the baseline justifies it.

    python tests/quality/mutation.py [--packages odb/core ...] [--sample 60] [--seed 0] [--report PATH]
    python tests/quality/mutation.py --packages odb/runtime --recheck    # after writing tests for its survivors

``--recheck`` reruns only a package's unjustified survivors in the report (each stored diff applied by `patch`,
the package's tests run): the sample's other mutants were killed and stay killed as tests are only added, so
a package whose sampled run takes an hour is brought up to date in minutes.  Each one it kills is kept in the
report (``rechecked``: its diff and the tests that killed it), and ``--guard`` (in ``make test``) applies every
such mutant again and runs only those tests: a hole cosmic-ray found and a test closed stays closed.

Run it with the project's Python (it runs the tests); cosmic-ray itself lives in a venv of its own
(``make mutation`` builds ``.venv-mutation``, pinned by constraints.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "tests" / "quality" / "mutation_report.json"
BASELINE = ROOT / "tests" / "quality" / "mutation_baseline.json"
PYTEST = "python -m pytest -x -q -p no:cacheprovider "
FAST = "-m 'not slow' "  # single-process tests only: where they defend a package alone, its mutants run in seconds

# package -> (its modules, the tests that must kill their mutants).  odb/runtime and odb/integrations are defended
# by their multi-process tests too (gloo, a few seconds each): the single-process ones cannot see a collective.
PACKAGES = {
    "odb/core": (["odb/core/placement.py", "odb/core/rank.py", "odb/core/replica.py", "odb/core/types.py",
                  "odb/core/header.py", "odb/core/info.py", "odb/core/shared.py", "odb/core/sim.py"],
                 FAST + "tests/test_core.py tests/test_differential.py tests/test_pool.py tests/test_exchange.py "
                 "tests/test_batching_sim.py tests/test_survivor_classes.py tests/test_runtime_single.py "
                 "tests/test_bench_decision.py tests/test_day_one.py tests/test_observe.py"),
    "odb/batching": (["odb/batching/deal.py", "odb/batching/intake.py", "odb/batching/endgame.py",
                      "odb/batching/dealt_order.py", "odb/batching/policy.py", "odb/batching/grouping.py",
                      "odb/batching/cost.py", "odb/batching/exchange.py", "odb/batching/base.py"],
                     FAST + "tests/test_batching_policy.py tests/test_batching_cost.py tests/test_deal.py "
                     "tests/test_dealt.py tests/test_exchange.py tests/test_batching_sim.py "
                     "tests/test_check_packing.py"),
    "odb/runtime": (["odb/runtime/epoch_pass.py", "odb/runtime/engine.py", "odb/runtime/source.py",
                     "odb/runtime/ledger.py", "odb/runtime/loader.py", "odb/runtime/transport.py",
                     "odb/runtime/group.py", "odb/runtime/observe.py", "odb/runtime/trace.py"],
                    "tests/test_runtime_single.py tests/test_day_one.py tests/test_elastic.py "
                    "tests/test_feature_edges.py tests/test_survivor_classes.py tests/test_runtime_dist.py "
                    "tests/test_runtime_guarantees.py tests/test_runtime_exchange.py tests/test_runtime_dealt.py "
                    "tests/test_runtime_replicas.py tests/test_observe.py tests/test_first_window.py "
                    "tests/test_plan.py::test_the_hint_simulates_only_below_its_sample_limit_and_otherwise_names_the_"
                    "command_to_run tests/test_plan.py::test_an_epoch_that_misses_the_balance_target_says_once_what_"
                    "a_larger_window_would_buy"),
    "odb/integrations": (["odb/integrations"],
                         "tests/test_integrations_hf.py tests/test_integrations_datasets.py "
                         "tests/test_integrations_plain.py tests/test_survivor_classes.py tests/test_elastic.py "
                         "tests/test_day_one.py tests/test_integrations_accelerate.py "
                         "tests/test_integrations_lightning.py tests/test_integrations_trl.py "
                         "tests/test_integrations_fsdp.py"),
    "proofs/conformance": (["proofs/conformance"],
                           "tests/test_conformance.py tests/test_survivor_classes.py tests/test_runtime_guarantees.py"),
}


def _config(modules: list[str], tests: str, timeout: float) -> str:
    mods = ", ".join(json.dumps(m) for m in modules)
    return (f'[cosmic-ray]\nmodule-path = [{mods}]\ntimeout = {timeout}\nexcluded-modules = []\n'
            f'test-command = "{sys.executable} {PYTEST[len("python "):]}{tests}"\n\n'
            '[cosmic-ray.distributor]\nname = "local"\n')


COSMIC_RAY = str(ROOT / ".venv-mutation" / "bin" / "cosmic-ray")  # `make mutation` builds it


def _cosmic(exe: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, env=env)


def _line(tree: Path, module: str, line: int) -> str:
    try:
        return (tree / module).read_text().splitlines()[line - 1].strip()
    except (OSError, IndexError):
        return ""


def run_package(name: str, sample: int, seed: int, timeout: float, exe: str = COSMIC_RAY) -> dict:
    """One package's session in a copy of the tree: the sample (or every mutant), its results."""
    modules, tests = PACKAGES[name]
    with tempfile.TemporaryDirectory(prefix="odb-mutation-") as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".venv", ".git", "site", "__pycache__", "*.sqlite"))
        (tree / "cr.toml").write_text(_config(modules, tests, timeout))
        db = tree / "session.sqlite"
        r = _cosmic(exe, "init", "cr.toml", str(db), cwd=tree)
        if r.returncode:
            raise RuntimeError(f"cosmic-ray init failed: {r.stderr[-2000:]}")
        con = sqlite3.connect(db)
        # by what each mutant is (job ids are random per session), so one seed draws the same mutants every time
        jobs = [j for (j,) in con.execute("SELECT job_id FROM mutation_specs ORDER BY module_path, operator_name, "
                                          "start_pos_row, start_pos_col, occurrence")]
        keep = set(random.Random(seed).sample(jobs, sample)) if 0 < sample < len(jobs) else set(jobs)
        skipped = [j for j in jobs if j not in keep]
        con.executemany("INSERT INTO work_results (job_id, worker_outcome, output, test_outcome, diff) "
                        "VALUES (?, 'SKIPPED', NULL, NULL, NULL)", [(j,) for j in skipped])
        con.commit()
        con.close()
        t0 = time.perf_counter()
        r = _cosmic(exe, "exec", "cr.toml", str(db), cwd=tree)
        if r.returncode:
            raise RuntimeError(f"cosmic-ray exec failed: {r.stderr[-2000:]}")
        seconds = time.perf_counter() - t0
        con = sqlite3.connect(db)
        rows = con.execute(
            "SELECT r.job_id, r.test_outcome, r.worker_outcome, r.diff, "
            "m.module_path, m.operator_name, m.start_pos_row "
            "FROM work_results r JOIN mutation_specs m ON m.job_id = r.job_id WHERE r.worker_outcome != 'SKIPPED'"
        ).fetchall()
        con.close()
        out = {"package": name, "tests": tests, "total_mutants": len(jobs), "run": len(rows), "seconds": round(seconds),
               "killed": 0, "survived": 0, "incompetent": 0, "survivors": []}
        for job, test, worker, diff, module, op, row in rows:
            outcome = (test or worker or "").lower()
            if outcome == "killed":
                out["killed"] += 1
            elif outcome == "survived":
                out["survived"] += 1
                out["survivors"].append({"key": f"{module}:{op}:{_line(ROOT, module, row)}", "module": module,
                                         "line": row, "operator": op, "diff": diff})
            else:
                out["incompetent"] += 1
        return out


def _run_tests(tree: Path, tests: str, timeout: float) -> str | None:
    """None if the tests pass in `tree`; else what failed (pytest's FAILED/ERROR lines, or the timeout)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        t = subprocess.run(f"{sys.executable} {PYTEST[len('python '):]}{tests}", shell=True, cwd=tree, env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timeout after {timeout:.0f} s"
    if t.returncode == 0:
        return None
    if t.returncode in (4, 5):  # a usage error or no test collected: nothing was tested, nothing killed
        raise RuntimeError(f"pytest could not run {tests!r}: {(t.stdout + t.stderr)[-500:]}")
    failed = [ln for ln in t.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    return "; ".join(failed)[:300] or (t.stdout + t.stderr)[-300:]


def _node_ids(killed_by: str) -> list[str]:
    """The pytest node ids in a ``killed_by`` record ("FAILED tests/x.py::test_y[p] - message; ...")."""
    out = []
    for part in killed_by.split("; "):
        if part.startswith(("FAILED ", "ERROR ")):
            out.append(part.split(" ", 1)[1].split(" - ", 1)[0])
    return out


class _Applied:
    """A survivor's stored diff applied to `tree` by `patch` for the ``with`` block, then reverted; an error
    if it no longer applies (the module changed: the sample must be drawn again)."""

    def __init__(self, tree: Path, mutant: dict):
        diff = mutant["diff"]
        diff = diff.split("\n", 1)[1] if diff.startswith("--- mutation diff ---") else diff
        self.tree, self.mutant, self.diff = tree, mutant, diff.rstrip("\n") + "\n"

    def __enter__(self):
        r = subprocess.run(["patch", "-p1", "--forward", "--silent"], cwd=self.tree, input=self.diff, text=True,
                           capture_output=True)
        added = [ln[1:] for ln in self.diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
        text = (self.tree / self.mutant["module"]).read_text()
        if r.returncode or not added or any(ln not in text for ln in added):
            raise RuntimeError(f"{self.mutant['key']}: its diff no longer applies ({r.stdout}{r.stderr}); "
                               "draw the package's sample again")
        return self

    def __exit__(self, *exc):
        subprocess.run(["patch", "-p1", "-R", "--silent"], cwd=self.tree, input=self.diff, text=True, check=True)


def _copy_tree(tmp: str) -> Path:
    tree = Path(tmp) / "tree"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".venv*", ".git", "site", "__pycache__", "*.sqlite"))
    return tree


def recheck(entry: dict, timeout: float) -> dict:
    """The report's package `entry` with each survivor no baseline justifies rerun against today's tests: its
    stored diff applied to a copy of the tree and the package's tests run (after they pass on the copy
    unmutated).  One killed now moves from survived to killed and is listed under ``rechecked`` with its diff
    and the test that killed it; one that still survives stays."""
    _, tests = PACKAGES[entry["package"]]
    previous = list(entry.get("survivors", []))
    entry = dict(entry, tests=tests, survivors=[], rechecked=list(entry.get("rechecked", [])))
    with tempfile.TemporaryDirectory(prefix="odb-recheck-") as tmp:
        tree = _copy_tree(tmp)
        failed = _run_tests(tree, tests, timeout)
        if failed:
            raise RuntimeError(f"{entry['package']}'s tests fail on the unmutated tree: {failed}")
        for s in previous:
            if s.get("justified"):
                entry["survivors"].append(s)
                continue
            with _Applied(tree, s):
                failed = _run_tests(tree, tests, timeout)
            if failed:
                entry["rechecked"].append({"key": s["key"], "module": s["module"], "diff": s["diff"],
                                           "killed_by": failed})
                entry["killed"] += 1
                entry["survived"] -= 1
            else:
                entry["survivors"].append(s)
            print(f"  {'killed  ' if failed else 'SURVIVED'} {s['key']}", flush=True)
    return entry


def guard(report: dict, timeout: float) -> list[str]:
    """Every ``rechecked`` mutant of the committed report (a hole cosmic-ray found and a test now closes) applied
    again, with only the tests that killed it run: they must still fail.  The keys of those that now survive."""
    reopened = []
    with tempfile.TemporaryDirectory(prefix="odb-guard-") as tmp:
        tree = _copy_tree(tmp)
        todo = [(m, _node_ids(m["killed_by"])) for e in report["packages"] for m in e.get("rechecked", [])]
        todo = [(m, ids) for m, ids in todo if ids]  # a timeout's kill: only the package's whole test list can say
        failed = _run_tests(tree, " ".join(sorted({f"'{i}'" for _, ids in todo for i in ids})), timeout)
        if failed:
            raise RuntimeError(f"the guarding tests fail on the unmutated tree: {failed}")
        for m, ids in todo:
            with _Applied(tree, m):
                failed = _run_tests(tree, " ".join(f"'{i}'" for i in ids), timeout)
            print(f"  {'killed  ' if failed else 'REOPENED'} {m['key']}", flush=True)
            if not failed:
                reopened.append(m["key"])
    return reopened


def _rates(res: dict, baseline: dict) -> int:
    """Justify `res`'s survivors from the baseline and set its kill rates; the number of unjustified ones."""
    for s in res["survivors"]:
        s["justified"] = baseline.get(s["key"])
    judged = res["killed"] + res["survived"]
    holes = sum(1 for s in res["survivors"] if not s["justified"])
    res["kill_rate"] = round(res["killed"] / judged, 3) if judged else None
    res["kill_rate_non_equivalent"] = round(res["killed"] / (res["killed"] + holes), 3) if judged else None
    return holes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packages", nargs="*", default=list(PACKAGES), choices=list(PACKAGES))
    ap.add_argument("--sample", type=int, default=60, help="mutants per package (0: every one; hours)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's tests")
    ap.add_argument("--report", default=str(REPORT))
    ap.add_argument("--cosmic-ray", default=COSMIC_RAY, help="the cosmic-ray executable (its own venv)")
    ap.add_argument("--recheck", action="store_true",
                    help="rerun only the report's unjustified survivors of --packages against today's tests")
    ap.add_argument("--guard", action="store_true",
                    help="apply each mutant the committed report lists as rechecked; its killing tests must fail")
    a = ap.parse_args(argv)
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    if a.guard:
        reopened = guard(json.loads(REPORT.read_text()), a.timeout)
        print(f"{len(reopened)} holes reopened" + (f": {reopened}" if reopened else ""))
        return 1 if reopened else 0
    path = Path(a.report)  # a package run replaces that package's entry; the others' stay
    old = json.loads(path.read_text()).get("packages", []) if path.exists() else []
    report = {"packages": [p for p in old if p.get("package") not in a.packages]}
    for name in a.packages:
        if a.recheck:
            (prev,) = [p for p in old if p.get("package") == name] or [None]
            if prev is None:
                raise SystemExit(f"--recheck: the report {path} has no entry for {name}")
            for s in prev["survivors"]:
                s["justified"] = baseline.get(s["key"])
            res = recheck(prev, a.timeout)
        else:
            res = run_package(name, a.sample, a.seed, a.timeout, a.cosmic_ray)
            res.update(sample=a.sample, seed=a.seed)
        holes = _rates(res, baseline)
        judged = res["killed"] + res["survived"]
        report["packages"].append(res)
        print(f"{name:20s} {res['killed']}/{judged} killed ({res['kill_rate']}), {holes} unjustified survivors, "
              f"{res['incompetent']} incompetent, of {res['total_mutants']} mutants; {res['seconds']} s", flush=True)
    report["packages"].sort(key=lambda p: p["package"])
    path.write_text(json.dumps(report, indent=1) + "\n")
    return 1 if any(not s["justified"] for p in report["packages"] if p["package"] in a.packages
                    for s in p["survivors"]) else 0


if __name__ == "__main__":
    sys.exit(main())
