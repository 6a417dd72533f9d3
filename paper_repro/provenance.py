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
    status       of each results JSON: ``current`` (its fingerprint is today's), ``STALE`` (another: the code
                 that made it computes otherwise now; rerun it), ``unstamped`` (written before stamps)
    verified     a scale- or quality-grid result written before stamps whose cheapest point today's code
                 recomputed (`verify`): stamped with that point, and today's fingerprint if every figure was
                 equal (else none: STALE)

Why: result files outlive the code that made them.  Three committed grids had predated the epoch-end flush or
shipped the pooling prototype's column, and only a comparison of commit times by hand found them.  A figure
from code that no longer runs is a claim about a sibling.

    python -m paper_repro.provenance [--strict] [RESULTS_DIR]   (``--strict``: exit 1 if any is STALE)
    python -m paper_repro.provenance --verify FILE ...          (recompute, and stamp if equal)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# what is fingerprinted lives with the grid that computes it: the grid's CLI stamps its results, and a module
# the grid imported could not import the grid back
from .scale_grid import PROBES, QUALITY_PROBES, TIMING_KEYS, fingerprint, git, stamp, without_timings

__all__ = ["PROBES", "QUALITY_PROBES", "TIMING_KEYS", "fingerprint", "stamp", "check", "verify"]

RESULTS = Path(__file__).resolve().parent / "results"


def check(results_dir: str | Path = RESULTS, current: str | None = None) -> list[tuple[str, str, str]]:
    """``(file, status, commit)`` for every results JSON (module docstring); `current`: today's fingerprint
    (None: computed here)."""
    out = []
    for p in sorted(Path(results_dir).glob("*.json")):
        try:
            prov = json.loads(p.read_text()).get("provenance")
        except (ValueError, AttributeError):
            prov = None
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
        out.append((p.name, "current" if prov["fingerprint"] == current else "STALE", commit))
    return out


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
    ap.add_argument("--verify", nargs="+", default=[], metavar="FILE",
                    help="scale- or quality-grid results: recompute each one's cheapest point, stamp it if equal")
    a = ap.parse_args(argv)
    head, current = (git("rev-parse", "HEAD"), fingerprint()) if a.verify else (None, None)
    differ = 0
    for f in a.verify:
        t0 = time.perf_counter()
        same, at = verify(f, current, commit=head)
        differ += not same
        print(f"{'verified' if same else 'DIFFERS':>9}  {Path(f).name}: {at} recomputed in "
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
