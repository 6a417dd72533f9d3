"""Issue 15's targets over every committed scale grid at once: the tally the results pages show.

    python -m paper_repro.scale_targets [RESULTS_DIR]

Each ``scale_grid*.json`` of RESULTS_DIR (default ``paper_repro/results``) was written by one run of
`paper_repro.scale_grid`, and each prints its own targets.  This reads them all:

- a file's provenance (`paper_repro.provenance.check`) decides whether it counts: a STALE one (today's code
  computes otherwise) is left out and named; an unstamped one counts and is named as such;
- points are merged by (distribution, N, W, cost, samples per rank).  A point in two files is one point:
  every method present in both must hold the same figures (wall times aside) in both, or this raises.  The
  grid is deterministic, so two runs of one code on one point agree; a disagreement is a file from other code;
- `scale_grid.target_lines` runs on the merged points, against `scale_grid.TARGETS` (the targets as data);
- then what no single grid prints: per window W, each ODB configuration's figures against the targets
  (the window is what a user sets, and ODB's default is 1,024); per ODB configuration, straggler efficiency by
  the step-time model (the budget cost's is a target line) and what dealing by exact cost could win at most
  (below).

Dealing by cost.  A rank's straggler efficiency s (sum over steps of the mean rank's cost / sum of the
costliest rank's) factors as ``s = c * s'``: c, the straggler ceiling, is mean / max of the ranks' total cost
(how level the dealing left the epoch's totals), and ``s' = max total / sum over steps of the max`` is what the
per-step alignment loses with those totals.  A deal that knew every position's exact cost (a length cache: the
most any cost learned online before preprocessing could know) can at best level the totals, c -> 1, leaving
``s / c``.  The share of the lost balance that the totals explain is ``ln(1/c) / ln(1/s)``.  It is an
estimate: another deal gives other windows, hence another s'.

Writes the report to ``scale_targets_<yyyymm>.md`` beside the results and prints it, with `plots`: every
method against N, the exchange rows included, at the padded slices of `PLOTS`
(``scale_targets_vs_n_w<W>.png``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from .provenance import RESULTS, check
from .scale_grid import BEATS, LABELS, ODBS, TARGETS, in_scope, plot_vs_n, target_lines, without_timings

__all__ = ["merge", "tally", "window_lines", "dealing_lines", "plots", "PLOTS", "main"]


def _key(r: dict) -> tuple:
    return r["dist"], r["world"], r["window"], r["cost"], r["per_rank"]


def merge(results: dict[str, dict]) -> list[dict]:
    """The points of `results` (file name -> a scale grid's JSON), each (dist, N, W, cost, per rank) once, with
    the union of its methods.  Raises ValueError when two files give one method of one point different figures
    (wall times aside) or a different budget."""
    out: dict[tuple, dict] = {}
    where: dict[tuple, str] = {}
    for name, res in results.items():
        for r in res["rows"]:
            k = _key(r)
            if k not in out:
                out[k] = {**r, "methods": dict(r["methods"])}
                where[k] = name
                continue
            have = out[k]
            if have["budget"] != r["budget"] or have["lower_bound"] != r["lower_bound"]:
                raise ValueError(f"point {k}: {where[k]} and {name} differ in budget or step lower bound")
            for m, v in r["methods"].items():
                if m in have["methods"] and without_timings(have["methods"][m]) != without_timings(v):
                    raise ValueError(f"point {k}, method {m}: {where[k]} and {name} hold different figures "
                                     "(one of them is from other code)")
                have["methods"].setdefault(m, v)
    return list(out.values())


def window_lines(rows: list[dict]) -> list[str]:
    """Per window W and ODB configuration, over the in-scope points of `rows`: predicted throughput against
    the target, the peers it must beat and does not (`scale_grid.BEATS`), the steps target."""
    t, lines, scope = TARGETS, [], in_scope(rows)
    for key in ODBS:
        for w in sorted({r["window"] for r in scope}):
            pool = [r for r in scope if r["window"] == w and key in r["methods"]]
            if not pool:
                continue
            m = [r["methods"][key] for r in pool]
            thr = [x["throughput_vs_gmt"] for x in m]
            lose = sum(1 for r, x in zip(pool, m) for b in BEATS if b in r["methods"]
                       and r["methods"][b]["predicted"]["samples_per_s"] >= x["predicted"]["samples_per_s"])
            lines.append(f"- {LABELS[key]} at W = {w}: {len(pool)} points; predicted throughput {min(thr):.3f}-"
                         f"{max(thr):.3f} x sorted GMT's, below {t['throughput_vs_gmt']} at "
                         f"{sum(v < t['throughput_vs_gmt'] for v in thr)}; not faster than a peer it must beat in "
                         f"{lose} comparisons; steps over {t['steps_vs_gmt']} x GMT's at "
                         f"{sum(x['steps_vs_gmt'] > t['steps_vs_gmt'] for x in m)}")
    return lines


def dealing_lines(rows: list[dict]) -> list[str]:
    """Per ODB configuration: straggler efficiency by the step-time model, and the dealing bound (module
    docstring), over the in-scope points of `rows`."""
    lines = []
    want = TARGETS["straggler_eff"]
    for key in ODBS:
        pool = [r["methods"][key] for r in in_scope(rows) if key in r["methods"]]
        if not pool:
            continue
        name = LABELS[key]
        model = [m["predicted"]["straggler_eff"] for m in pool]
        lines.append(f"- {name}: straggler efficiency by the step-time model {min(model):.3f}-{max(model):.3f}, "
                     f"below {want} at {sum(v < want for v in model)}/{len(model)} points (context: the target "
                     "line above reads budget cost)")
        s = [m["straggler_eff"] for m in pool]
        c = [m["straggler_ceiling"] for m in pool]
        share = [math.log(1 / ci) / math.log(1 / si) for si, ci in zip(s, c) if si < 1.0]
        level = [si / ci for si, ci in zip(s, c)]
        if not share:  # every point perfectly balanced: nothing lost, nothing to explain
            lines.append(f"- {name}: straggler efficiency 1.000 at every point, no lost balance to explain")
            continue
        lines.append(
            f"- {name}, dealing by exact cost (an estimate, module docstring): the ranks' totals explain "
            f"{statistics.median(share):.0%} of the lost balance at the median point ({min(share):.0%}-"
            f"{max(share):.0%}); with level totals the straggler efficiency would be {min(level):.3f}-"
            f"{max(level):.3f} (now {min(s):.3f}-{max(s):.3f}), >= {want} at {sum(v >= want for v in level)}/"
            f"{len(level)} points (now {sum(v >= want for v in s)})")
    return lines


# (W, samples per rank) of the padded slices `plots` draws: the quick grid's epoch, and the long epochs at W = 2,048
PLOTS = ((256, 2048), (2048, 16384))


def plots(rows: list[dict], outdir: str | Path) -> list[tuple[int, str]]:
    """`scale_grid.plot_vs_n` on the merged points of each slice of `PLOTS` that holds at least 2 N in the
    targets' scope: every method, the exchange rows included; ``(W, the path written)`` each."""
    out = []
    for w, per in PLOTS:
        pts = [r for r in rows if r["window"] == w and r["per_rank"] == per and r["cost"] == "padded"]
        if len({r["world"] for r in in_scope(pts)}) < 2:
            continue
        path = plot_vs_n({"grid": {"window": w, "per_rank": per}, "rows": pts, "targets": TARGETS},
                         os.path.join(outdir, f"scale_targets_vs_n_w{w}.png"))
        out += [(w, path)] if path else []
    return out


def tally(results_dir: str | Path = RESULTS) -> tuple[list[str], list[dict]]:
    """(the report's lines, the merged points) for the scale grids of `results_dir` (module docstring)."""
    status = {name: (st, commit) for name, st, commit in check(results_dir)}
    files, skipped = {}, []
    for p in sorted(Path(results_dir).glob("scale_grid*.json")):
        if status[p.name][0] == "STALE":
            skipped.append(p.name)
            continue
        files[p.name] = json.loads(p.read_text())
    if not files:
        raise SystemExit(f"no current scale grid result in {results_dir}")
    rows = merge(files)
    scope = in_scope(rows)
    lines = [f"# Issue 15's targets over every committed scale grid ({len(scope)} points at N >= "
             f"{TARGETS['min_world']}, W >= {TARGETS['min_window']}; {len(rows)} points in all)", "",
             f"Command: `python -m paper_repro.scale_targets`; {time.strftime('%Y-%m-%d')}. Targets (data, "
             f"`scale_grid.TARGETS`): {json.dumps(TARGETS)}.", "",
             "## Files", ""]
    for name in files:
        st, commit = status[name]
        n = len(in_scope(files[name]["rows"]))
        lines.append(f"- `{name}`: {st}{f' (from {commit})' if commit else ''}; {len(files[name]['rows'])} points, "
                     f"{n} in scope")
    lines += [f"- left out, STALE: `{n}`" for n in skipped]
    lines += ["", "## Targets", "", *target_lines({"targets": TARGETS, "rows": rows}), "",
              "## Per window", "", *window_lines(rows), "",
              "## Context: the step-time model's straggler, and what dealing by cost could win", "",
              *dealing_lines(rows), ""]
    return lines, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="?", default=str(RESULTS))
    a = ap.parse_args(argv)
    lines, rows = tally(a.results)
    lines += [f"![every method against N, W = {w}, padded]({os.path.basename(p)})\n" for w, p in plots(rows, a.results)]
    out = Path(a.results) / f"scale_targets_{time.strftime('%Y%m')}.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
