"""Which code a result file came from, and whether today's code still computes what it holds.

Legend
    stamp        what a result writer records under ``"provenance"``: the git ``commit`` of the tree that ran
                 (None outside a git checkout), ``dirty`` (uncommitted changes under ``odb/`` or
                 ``paper_repro/``, results excluded) and the ``fingerprint``
    fingerprint  a SHA-256 of what the scale grid computes (`paper_repro.scale_grid.run_point`: every method's
                 exact batches through the step-time model, ODB's dealt and pooled runs, the baselines) on
                 `PROBES`, three small points, and the quality grid (`paper_repro.bench_grid.run_config`, ``make
                 bench``: fixed shards too) on `QUALITY_PROBES`, with the measured wall times left out
                 (`TIMING_KEYS`).  Code
                 that changes no batch and no figure keeps it (a refactor, a faster deal); a change to the
                 policy, the dealer, a baseline, the metrics or the step-time model changes it
    exchange     the rows of ``scale_grid --exchange-rows`` (`scale_grid.exchange_point`), which `fingerprint`
                 does not run, record ``exchange_slack`` and ``exchange_fingerprint`` too
                 (`scale_grid.exchange_fingerprint`: the exchange on `scale_grid.EXCHANGE_PROBE` at that slack)
    status       of each results JSON: ``current`` (its fingerprints are today's), ``STALE`` (another: the code
                 that made it computes otherwise now; rerun it), ``unstamped`` (written before stamps, or
                 exchange rows written before their stamp)
    verified     a scale- or quality-grid result written before stamps whose cheapest point today's code
                 recomputed (`verify`): stamped with that point, and today's fingerprint if every figure was
                 equal (else none: STALE)

Why: result files outlive the code that made them.  Three committed grids had predated the epoch-end flush or
shipped the pooling prototype's column, and only a comparison of commit times by hand found them.  A figure
from code that no longer runs is a claim about a sibling.

    python -m paper_repro.provenance [--strict] [RESULTS_DIR]   (``--strict``: exit 1 if any is STALE)
    python -m paper_repro.provenance --verify FILE ...          (recompute, and stamp if equal)
    python -m paper_repro.provenance --at-commit FILE ...       (exchange rows: `at_commit`)
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# what is fingerprinted lives with the grid that computes it: the grid's CLI stamps its results, and a module
# the grid imported could not import the grid back
from .scale_grid import (
    EXCHANGE_PROBE,
    EXCHANGES,
    POOLED_XB,
    PROBES,
    QUALITY_PROBES,
    TIMING_KEYS,
    exchange_digest,
    exchange_fingerprint,
    fingerprint,
    git,
    stamp,
    without_timings,
)

__all__ = ["PROBES", "QUALITY_PROBES", "TIMING_KEYS", "fingerprint", "exchange_fingerprint", "stamp", "check",
           "verify", "at_commit"]

RESULTS = Path(__file__).resolve().parent / "results"


def exchange_slack(res: dict) -> int | None:
    """The budget-balance slack (basis points) of a result's exchange rows, None if it has none: its stamp's,
    else (written before exchange stamps) its command's ``--slack``, 0 without one."""
    rows = res.get("rows") if isinstance(res, dict) else None
    if not isinstance(rows, list) or not any(k in r.get("methods", {}) for r in rows for k in EXCHANGES):
        return None
    prov = res.get("provenance") or {}
    if "exchange_slack" in prov:
        return prov["exchange_slack"]
    m = re.search(r"--slack (\d+)", res.get("args", ""))
    if any(POOLED_XB in r["methods"] for r in rows) and not m:
        raise ValueError("budget-balanced exchange rows without their slack")
    return int(m.group(1)) if m else 0


def check(results_dir: str | Path = RESULTS, current: str | None = None,
          current_x: dict | None = None) -> list[tuple[str, str, str]]:
    """``(file, status, commit)`` for every results JSON (module docstring); `current`: today's fingerprint,
    `current_x`: today's exchange fingerprint per slack (None, or a slack not in it: computed here)."""
    out, current_x = [], dict(current_x or {})
    for p in sorted(Path(results_dir).glob("*.json")):
        try:
            res = json.loads(p.read_text())
            prov = res.get("provenance")
        except (ValueError, AttributeError):
            res = prov = None
        if not isinstance(prov, dict) or "fingerprint" not in prov:  # (None: recomputed otherwise, STALE)
            out.append((p.name, "unstamped", ""))
            continue
        if current is None:
            current = fingerprint()
        commit = (prov.get("commit") or "?")[:10] + (" (dirty)" if prov.get("dirty") else "")
        v = prov.get("verified")
        if v:
            commit += (f", a point recomputed {'alike' if v.get('same', True) else 'otherwise'} at "
                       f"{(v.get('commit') or '?')[:10]}")
        ok = prov["fingerprint"] == current
        slack = exchange_slack(res)
        if slack is not None and ok:
            if "exchange_fingerprint" not in prov:
                out.append((p.name, "unstamped", commit + ", the exchange not fingerprinted"))
                continue
            if slack not in current_x:
                current_x[slack] = exchange_fingerprint(slack)
            ok = prov["exchange_fingerprint"] == current_x[slack]
            if prov.get("exchange_verified"):
                commit += f", the exchange fingerprinted at its commit by {prov['exchange_verified']['by'][:10]}"
        out.append((p.name, "current" if ok else "STALE", commit))
    return out


# run in a fresh interpreter on an older checkout: its `exchange_point`, today's `scale_grid.exchange_digest`
_AT_COMMIT = """import json, os, sys
import odb, paper_repro
from paper_repro.scale_grid import exchange_point
here = os.path.realpath(os.getcwd())
if not all(os.path.realpath(m.__file__).startswith(here + os.sep) for m in (odb, paper_repro)):
    sys.exit("not the checkout's code: " + odb.__file__ + ", " + paper_repro.__file__)
{source}
probe, slack, keys = json.loads(sys.argv[1])
print(exchange_digest(exchange_point, tuple(probe), slack, frozenset(keys)))
"""


def at_commit(path: str | Path, write: bool = True, by: str | None = None, timeout: float = 600,
              repo: str | Path = RESULTS.parents[1]) -> bool:
    """Exchange rows written before their stamp: `scale_grid.exchange_fingerprint` computed on the code of the
    commit that made them (``git archive`` of its ``odb/`` and ``paper_repro/``, `scale_grid.exchange_digest`
    run there in a fresh interpreter) against today's.  Equal: today's exchange computes what the file's code
    computed on the probe, as `fingerprint` vouches for the rest.  With `write`, the stamp gains
    ``exchange_slack``, ``exchange_fingerprint`` (today's if equal, else None: STALE) and
    ``exchange_verified`` (`by`: the commit that checked, None: HEAD).  A dirty or commit-less stamp cannot be
    checked this way (ValueError); nor can a result with no exchange rows.  `repo`: the git checkout that holds
    the commit."""
    p = Path(path)
    res = json.loads(p.read_text())
    prov, slack = res.get("provenance") or {}, exchange_slack(res)
    if slack is None or not prov.get("commit") or prov.get("dirty") is not False:
        raise ValueError(f"{p.name}: no exchange rows, or not made by a clean commit")
    today = exchange_fingerprint(slack)
    with tempfile.TemporaryDirectory() as tmp:
        tar = subprocess.run(["git", "-C", str(repo), "archive", prov["commit"],
                              "odb", "paper_repro"], capture_output=True, check=True, timeout=120).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True, timeout=120)
        code = _AT_COMMIT.format(source=inspect.getsource(exchange_digest))
        run = subprocess.run([sys.executable, "-c", code, json.dumps([EXCHANGE_PROBE, slack, sorted(TIMING_KEYS)])],
                             capture_output=True, text=True, cwd=tmp, timeout=timeout,
                             env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    if run.returncode != 0:
        raise RuntimeError(f"{p.name}: the exchange at {prov['commit'][:10]} did not run:\n{run.stderr[-2000:]}")
    same = run.stdout.strip() == today
    if write:
        prov.update(exchange_slack=slack, exchange_fingerprint=today if same else None,
                    exchange_verified={"by": by or git("rev-parse", "HEAD"), "date": time.strftime("%Y-%m-%d"),
                                       "same": same})
        res["provenance"] = prov
        p.write_text(json.dumps(res))
    return same


def verify(path: str | Path, current: str | None = None, write: bool = True,
           commit: str | None = None) -> tuple[bool, list]:
    """Recompute the cheapest point (fewest samples) of a scale-grid or quality-grid (``make bench``) result
    with today's code: (every computed figure equal, the point).  With `write`, an unstamped file is stamped:
    ``verified`` (the recomputing commit, the point, ``same``) and, if equal, today's fingerprint (`current`;
    None: computed here), else none (the check then says STALE).  Its own commit stays None: the file says
    which code made it no more than before, only whether today's computes its figures alike.  `commit`: the
    commit of the code that recomputes (None: HEAD now; a caller verifying many files takes it once, before
    the first, as the code it runs was imported then)."""
    from .bench_grid import run_config
    from .scale_grid import run_point

    p = Path(path)
    res = json.loads(p.read_text())
    if "rows" in res:  # the scale grid (`scale_grid.run_point`)
        r = min(res["rows"], key=lambda r: (r["world"] * r["per_rank"], r["world"]))
        pooled = "odb_pooled8" in r["methods"]
        at = [r["dist"], r["world"], r["window"], r["budget"], r["cost"], r["per_rank"], pooled]
        again = run_point(*at[:6], 0, pooled=pooled)
    else:  # the quality grid (`bench_grid.run_config`, ``make bench``)
        r = min(res["results"], key=lambda r: (r["samples"], r["world"], r["window"]))
        at = [r["dist"], r["world"], r["window"], r["budget"], r["cost"], r["samples"] // r["world"]]
        again = run_config(*at)
    same = without_timings(again) == without_timings(r)
    if write and "provenance" not in res:  # equal: today's fingerprint; else none, so the check says STALE
        res["provenance"] = {"commit": None, "dirty": None, "fingerprint": (current or fingerprint()) if same else None,
                             "verified": {"commit": commit or git("rev-parse", "HEAD"), "point": at,
                                          "date": time.strftime("%Y-%m-%d"), "same": same}}
        p.write_text(json.dumps(res, indent=None if "rows" in res else 1))  # each grid's own layout
    return same, at


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="?", default=str(RESULTS))
    ap.add_argument("--strict", action="store_true", help="exit 1 if a result is STALE")
    ap.add_argument("--at-commit", nargs="+", default=[], metavar="FILE",
                    help="exchange rows stamped before exchange stamps: their exchange fingerprint at their commit")
    ap.add_argument("--verify", nargs="+", default=[], metavar="FILE",
                    help="scale- or quality-grid results: recompute each one's cheapest point, stamp it if equal")
    a = ap.parse_args(argv)
    head = git("rev-parse", "HEAD") if a.verify or a.at_commit else None
    current = fingerprint() if a.verify else None
    differ = 0
    for f in a.verify:
        t0 = time.perf_counter()
        same, at = verify(f, current, commit=head)
        differ += not same
        print(f"{'verified' if same else 'DIFFERS':>9}  {Path(f).name}: {at} recomputed in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    for f in a.at_commit:
        t0 = time.perf_counter()
        same = at_commit(f, by=head)
        differ += not same
        print(f"{'verified' if same else 'DIFFERS':>9}  {Path(f).name}: the exchange fingerprint at its commit, in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    rows = check(a.results)
    for name, status, commit in rows:
        print(f"{status:>9}  {name}{f'  (from {commit})' if commit else ''}")
    stale = sum(s == "STALE" for _, s, _ in rows)
    print(f"{len(rows)} result files: {sum(s == 'current' for _, s, _ in rows)} current, {stale} stale, "
          f"{sum(s == 'unstamped' for _, s, _ in rows)} unstamped")
    return 1 if differ or (a.strict and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
