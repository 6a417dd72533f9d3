"""The default configuration at the committed scale grid points, against the targets, beside the opt-ins and peers.

    python -m paper_repro.defaults_grid            # print the report from the committed results
    python -m paper_repro.defaults_grid --run      # rerun the default at every point (hours on 2 cores)

What runs is what a user gets without settings: ``LoaderSettings(token_budget=None, cost=..., buffer_size=W)``,
its ``placement="auto"`` resolved by `odb.core.sim.simulate` as the loader resolves it for N ranks (dealt, PAD),
at each in-scope point of the committed grids (`paper_repro.scale_targets.merge`: 80 points, 64 to 1,024 ranks,
W >= 256, five length mixes, three costs) at the point's own window.  Its batches are scored as the grid scores
every method (`paper_repro.bench_metrics.metrics`; the step-time model with the round collective of the
resolved header) against the committed rows of the same point: sorted GMT (the targets' reference), the peers
it must beat (`scale_grid.BEATS`), ODB without the exchange (``placement=None``, the paper's algorithm) and the
opt-ins (pooled windows of 8, with the exchange, with budget balance).

Writes ``results/defaults_grid_<yyyymm>.json`` after every point (a long run can stop and resume: points
already there are kept) and the report ``defaults_grid_<yyyymm>.md``.  A row records the default's
``first_window``; rows of an earlier default (another ``first_window``) move to ``previous`` when a run starts,
and the report compares the two where both ran (the first rounds' smaller windows against full ones).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .scale_grid import BEATS, LABELS, RESULTS, TARGETS, _plan, _predicted, git

__all__ = ["DEFAULT", "FIRST_WINDOW", "grid_points", "default_point", "report", "main"]

DEFAULT = "odb_default"
FIRST_WINDOW = 32  # the loader's default first_window (a test checks it is LoaderSettings')
OPTINS = ("odb_dealt", "odb_pooled8", "odb_pooled8_exchange", "odb_pooled8_exchange_balanced")
NAMES = {**{k: v for k, v in LABELS.items() if k in OPTINS},
         DEFAULT: f"ODB default (placement='auto', first_window={FIRST_WINDOW})",
         "odb_dealt": "ODB placement=None (the paper's)"}


def _key(r: dict) -> str:
    return f"{r['dist']} N={r['world']} W={r['window']} {r['cost']} {r['per_rank']}/rank"


def grid_points(results_dir: str = RESULTS) -> list[dict]:
    """The in-scope points of the committed scale grids (current ones only), cheapest first."""
    import glob

    from .provenance import check
    from .scale_grid import in_scope
    from .scale_targets import merge

    stale = {name for name, status, _ in check(results_dir) if status == "stale"}
    files = {}
    for p in sorted(glob.glob(os.path.join(results_dir, "scale_grid*.json"))):
        if os.path.basename(p) not in stale:
            with open(p) as f:
                files[os.path.basename(p)] = json.load(f)
    return sorted(in_scope(merge(files)), key=lambda r: (r["world"] * r["per_rank"], _key(r)))


def default_point(r: dict, **overrides) -> dict:
    """The default configuration on grid point `r` (a merged row): its figures, scored as the grid scores.
    `overrides`: `odb.LoaderSettings` fields set otherwise (``first_window=None``: today's default without the
    first rounds' smaller windows)."""
    from odb import LoaderSettings
    from odb.core.header import header_layout
    from odb.core.sim import simulate
    from odb.plan import stepmodel as cs

    from .bench_grid import _exactly_once, point
    from .bench_metrics import metrics

    t0 = time.perf_counter()
    world, window = r["world"], r["window"]
    pt = point(r["dist"], world, r["budget"], r["cost"], r["per_rank"], 0)
    settings = LoaderSettings(token_budget=None, cost=pt.cost, buffer_size=window, **overrides)
    placed = settings.resolved(world, "dealt")
    sim = simulate([[] for _ in range(world)], settings, deal=pt.sizes)
    _exactly_once(sim.batches, len(pt.sizes), f"{DEFAULT} {_key(r)}")
    filler = sorted(s[0] for s in pt.sizes)[len(pt.sizes) // 2]
    collate = "pad" if r["cost"] == "padded" else "packed"
    pol = placed.cost_and_policy()[1]
    lay = header_layout(int(pol.summary_len), window, placed.lanes, placed.exchange, placed.slack_bp)
    r_s = cs.odb_round_latency(cs.H20_2B, world, window, lay.length)[0]
    m = {**metrics(sim.batches, pt.sizes, pt.cost), "rounds": sim.rounds,
         "placement": None if placed.placement is None else placed.placement.as_dict(),
         "first_window": placed.first_window, "first_wait": max(w for w in sim.first_wait if w is not None),
         "moved_batches": sim.moved / max(1, sum(b is not None for row in sim.batches for b in row))}
    m["predicted"] = _predicted(_plan(sim.batches, pt.sizes, world, filler), world, collate, r_s, sim.rounds, 1)
    g = r["methods"]["gmt"]
    m["steps_vs_gmt"] = m["steps"] / g["steps"]
    m["throughput_vs_gmt"] = m["predicted"]["samples_per_s"] / g["predicted"]["samples_per_s"]
    m["sim_s"] = time.perf_counter() - t0
    return m


def _path(results_dir: str, ext: str) -> str:
    return os.path.join(results_dir, f"defaults_grid_{time.strftime('%Y%m')}.{ext}")


def run(results_dir: str = RESULTS, out: str | None = None, limit: int | None = None) -> dict:
    """Run the default at every point not yet in `out` (default this month's file), writing after each."""
    out = out or _path(results_dir, "json")
    res = {"rows": {}}
    if os.path.exists(out):
        with open(out) as f:
            res = json.load(f)
    for k in [k for k, row in res["rows"].items() if row.get("first_window") != FIRST_WINDOW]:
        res.setdefault("previous", {})[k] = res["rows"].pop(k)  # an earlier default's row
    res["stamp"] = {"commit": git("rev-parse", "HEAD"),
                    "dirty": bool(git("status", "--porcelain", "--", "odb", "paper_repro",
                                      ":(exclude)paper_repro/results"))}
    todo = [r for r in grid_points(results_dir) if _key(r) not in res["rows"]][:limit]
    for i, r in enumerate(todo):
        res["rows"][_key(r)] = default_point(r)
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f, indent=1, sort_keys=True)
        os.replace(tmp, out)
        print(f"[{i + 1}/{len(todo)}] {_key(r)}: {res['rows'][_key(r)]['sim_s']:.0f} s", file=sys.stderr, flush=True)
    return res


def report(res: dict, results_dir: str = RESULTS) -> list[str]:
    """Per target, the default's tally over the points it ran, beside the opt-ins and the peers on the same
    points; each miss named with its cause (the straggler ceiling, the step lower bound)."""
    t = TARGETS
    pts = [r for r in grid_points(results_dir) if _key(r) in res["rows"]]
    for r in pts:
        r["methods"] = {**r["methods"], DEFAULT: res["rows"][_key(r)]}
    lines = [f"{len(pts)} points (of the committed grids' in-scope points), each at its own window; targets "
             f"(data, `scale_grid.TARGETS`): straggler efficiency >= {t['straggler_eff']}, steps <= "
             f"{t['steps_vs_gmt']} x GMT's, predicted throughput >= {t['throughput_vs_gmt']} x sorted GMT's.", ""]
    lines += ["| configuration | straggler >= 0.97 | worst | steps <= 1.05x GMT | worst | throughput >= 0.97x GMT "
              "| worst | beats every peer |", "|---|---|---|---|---|---|---|---|"]
    for name in (DEFAULT, *OPTINS):
        have = [r for r in pts if name in r["methods"]]
        if not have:
            continue
        ms = [r["methods"][name] for r in have]
        st = [m["straggler_eff"] for m in ms]
        sv = [m["steps_vs_gmt"] for m in ms]
        tv = [m["throughput_vs_gmt"] for m in ms]
        beats = sum(all(r["methods"][name]["predicted"]["samples_per_s"] > r["methods"][p]["predicted"]["samples_per_s"]
                        for p in BEATS if p in r["methods"]) for r in have)
        lines.append(f"| {NAMES[name]} | {sum(v >= t['straggler_eff'] for v in st)}/{len(ms)} | {min(st):.3f} | "
                     f"{sum(v <= t['steps_vs_gmt'] for v in sv)}/{len(ms)} | {max(sv):.3f} | "
                     f"{sum(v >= t['throughput_vs_gmt'] for v in tv)}/{len(ms)} | {min(tv):.3f} | {beats}/{len(ms)} |")
    lines += ["", "The default by window (the grid's W; the loader's default buffer_size is 1,024):", "",
              "| W | points | straggler >= 0.97 | worst | steps <= 1.05x GMT | worst | throughput >= 0.97x GMT | "
              "worst |", "|---|---|---|---|---|---|---|---|"]
    for w in sorted({r["window"] for r in pts}):
        ms = [r["methods"][DEFAULT] for r in pts if r["window"] == w]
        st, sv, tv = ([m[k] for m in ms] for k in ("straggler_eff", "steps_vs_gmt", "throughput_vs_gmt"))
        lines.append(f"| {w} | {len(ms)} | {sum(v >= t['straggler_eff'] for v in st)} | {min(st):.3f} | "
                     f"{sum(v <= t['steps_vs_gmt'] for v in sv)} | {max(sv):.3f} | "
                     f"{sum(v >= t['throughput_vs_gmt'] for v in tv)} | {min(tv):.3f} |")
    lines += ["", "Misses of the default, each with its cause:"]
    for r in pts:
        m = r["methods"][DEFAULT]
        why = []
        if m["straggler_eff"] < t["straggler_eff"]:
            why.append(f"straggler {m['straggler_eff']:.3f} (its ceiling, mean / max of the ranks' totals, "
                       f"{m['straggler_ceiling']:.3f}; GMT's {r['methods']['gmt']['straggler_eff']:.3f})")
        if m["steps_vs_gmt"] > t["steps_vs_gmt"]:
            none, p8 = r["methods"].get("odb_dealt", {}), r["methods"].get("odb_pooled8", {})
            why.append(f"steps {m['steps_vs_gmt']:.3f} x GMT's (the step lower bound is {r['lower_bound_vs_gmt']:.3f} "
                       "x; the exchange moves whole batches, so the steps are the window's packing: placement=None "
                       f"{none.get('steps_vs_gmt', float('nan')):.3f} x, pooled windows of 8 "
                       f"{p8.get('steps_vs_gmt', float('nan')):.3f} x)")
        if m["throughput_vs_gmt"] < t["throughput_vs_gmt"]:
            bal = m["predicted"]["balanced_samples_per_s"] / r["methods"]["gmt"]["predicted"]["samples_per_s"]
            why.append(f"throughput {m['throughput_vs_gmt']:.3f} x GMT's (with every step as long as its mean rank "
                       f"{bal:.3f} x)")
        lost = [p for p in BEATS if p in r["methods"] and m["predicted"]["samples_per_s"]
                <= r["methods"][p]["predicted"]["samples_per_s"]]
        if lost:
            why.append("not faster than " + ", ".join(lost))
        if why:
            lines.append(f"- {_key(r)}: " + "; ".join(why))
    if lines[-1].startswith("Misses"):
        lines.append("- none")
    lines += _first_windows(res, pts)
    moved = [res["rows"][_key(r)]["moved_batches"] for r in pts]
    if moved:
        lines += ["", f"The exchange moved {min(moved):.1%}-{max(moved):.1%} of the real batches between ranks "
                      "(the price in bytes: docs/guide/scaling.md)."]
    return lines


def _first_windows(res: dict, pts: list[dict]) -> list[str]:
    """The default against its earlier rows with full first windows (``previous``), where both ran."""
    prev = {k: v for k, v in res.get("previous", {}).items() if v.get("first_window") is None}
    both = [r for r in pts if _key(r) in prev]
    only = len(set(prev) - {_key(r) for r in pts})
    if not prev:
        return []
    out = ["", f"The first rounds' smaller windows (first_window={FIRST_WINDOW}) against full ones "
               f"(first_window=None, the same placement) at the {len(both)} points where both ran"
           + (f"; {only} points ran with full windows only (their rows above are missing)" if only else "") + ":", ""]
    if not both:
        return out
    ratio = [res["rows"][_key(r)]["predicted"]["samples_per_s"] / prev[_key(r)]["predicted"]["samples_per_s"]
             for r in both]
    steps = [res["rows"][_key(r)]["steps"] / prev[_key(r)]["steps"] for r in both]
    dst = [res["rows"][_key(r)]["straggler_eff"] - prev[_key(r)]["straggler_eff"] for r in both]
    wait = [res["rows"][_key(r)]["first_wait"] / r["window"] for r in both]
    out += [f"- predicted throughput {min(ratio):.4f}-{max(ratio):.4f} x full windows' (within 1% at "
            f"{sum(v >= 0.99 for v in ratio)}/{len(both)}); steps {min(steps):.4f}-{max(steps):.4f} x; straggler "
            f"efficiency {min(dst):+.4f} to {max(dst):+.4f}",
            "- samples a rank reads before its first batch, in windows of the point's W: "
            f"{min(wait):.3f}-{max(wait):.3f} "
            "(with full windows at least 1: round 0 fills a whole window)"]
    worst = min(zip(ratio, both), key=lambda x: x[0])
    if worst[0] < 0.99:
        out.append(f"- worst {_key(worst[1])}: {worst[0]:.4f} x (the ramp's rounds pack smaller windows; an epoch of "
                   f"{worst[1]['per_rank']} samples a rank holds about one window of them)")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="store_true", help="rerun the default at the points not yet in the file")
    ap.add_argument("--limit", type=int, help="with --run: at most this many points")
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--file", help="the JSON to read and extend (default: the newest defaults_grid_*.json)")
    ap.add_argument("--md", action="store_true", help="also write the report beside the JSON (--run does)")
    a = ap.parse_args(argv)
    import glob

    path = a.file or (sorted(glob.glob(os.path.join(a.results, "defaults_grid_*.json"))) or [None])[-1]
    res = run(a.results, path, a.limit) if a.run else (json.load(open(path)) if path else None)
    if res is None:
        print("no defaults_grid_*.json yet: run with --run", file=sys.stderr)
        return 1
    lines = report(res, a.results)
    print("\n".join(lines))
    if a.run or a.md:
        md = (path or _path(a.results, "json"))[:-len(".json")] + ".md"
        st = res["stamp"]
        with open(md, "w") as f:
            f.write(f"# The default configuration at the committed grid points\n\nCommand: "
                    f"{res.get('command', '`python -m paper_repro.defaults_grid --run`')}; "
                    f"{time.strftime('%Y-%m-%d')}; "
                    f"commit {str(st['commit'])[:10]}"
                    f"{' (dirty)' if st['dirty'] else ''}; {sum(r['sim_s'] for r in res['rows'].values()):.0f} s of "
                    "simulation on one core.\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
