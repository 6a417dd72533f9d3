"""Batching quality (and runtime overhead) figures: ``python -m paper_repro.bench [--full]``.

Writes ``paper_repro/results/quality_sim_<yyyymm>.md`` and ``.json``.  Every ODB and release-algorithm figure comes from
`odb.core.sim`: the runtime's RankCore per rank (ranks driven through the DGAP table, PAD mode); GMT, BMT and Standard
come from `odb.baselines` on the same lengths, and so do the peers re-implemented from their public descriptions
(`odb.baselines.peers.PEERS`: shuffled GMT, HF's BatchRebalanceSampler, Megatron's DP-balanced packing, KK).
Methods: ``odb`` (the default policy) and ``release_reimpl`` run on
fixed, DistributedSampler-style strided shards; ``odb_dealt`` is the same policy with dealt shards:
`odb.batching.deal.Dealer` deals positions of the one global order to the ranks as they consume them, from measured
costs (each rank topped up to its per-round need, as the runtime does: `odb.core.sim`), so the fixed shards' ceiling
(below) does not bind it.  The Markdown shows ``odb`` as "fixed" and ``odb_dealt`` as "dealt".

Grid: `grid` gives its points (default and ``--full``): distributions matched to the paper's CVs plus the release's
long-tail mix (`paper_repro.distributions`), world sizes up to 64, windows (buffers, per rank) 64, 256, 1024.

The released package itself (``--release-python PY``): PY is the python of a separate venv holding
online-dynamic-batching 0.1.2 (its import name ``odb`` collides with ours); ``make bench`` builds it as
``.venv-release`` with no torch of its own (a .pth file borrows the main venv's: the Makefile's recipe) and passes it.
`measure_release_package` then runs ``paper_repro/release_driver.py`` at `release_points()`.

Metrics (per method):
    steps              optimizer steps (one batch per rank each)
    budget_use         sum of batch costs / (steps x ranks x budget)
    padding            1 - real tokens / padded tokens (batch x longest)
    straggler_eff      sum over steps of mean rank cost / sum of max rank cost
    step_time          sum over steps of the costliest rank's batch cost, in budgets (a step lasts as long as its
                       slowest rank): what "ODB beats a peer" is judged on (`bench_targets.BEATS`)
    singletons         fraction of real batches holding one sample
    singletons_avoid   the same, leaving out samples that cannot share a batch even with the shortest sample (over
                       budget, or > B/2 padded)
    vs_gmt, vs_lb      steps / GMT steps, steps / the global step lower bound
    vs_shard_lb        steps / the per-shard lower bound (max over ranks of `batch_lower_bound` of the rank's own
                       fixed shard): what is left once the fixed shards' imbalance is taken out (``odb_dealt`` is
                       not bound by it and can go below 1)
    straggler_ceiling  mean/max of the ranks' total batch cost: no order of this schedule's batches has a higher
                       straggler efficiency (for ``odb_dealt``: of what each rank was dealt)
    shard_token_ceiling, packed_use_ceiling  the same bound from the fixed shards' tokens alone (policy-free; exact
                       for a packed cost), and the packed budget use no schedule of these shards beats (per grid
                       point, not per method)
    decision_ms        policy time per rank and round (summarize+propose+partition), mean (``odb_dealt``: the
                       dealer's arithmetic is not in it)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from .bench_grid import decision_microbench, grid, measure_release_package, release_points, run_config
from .bench_metrics import metrics
from .bench_render import render
from .bench_targets import TARGET_VALUES
from .distributions import DISTRIBUTIONS, describe, sample_lengths
from .provenance import stamp

__all__ = ["main", "metrics", "run_config", "grid", "RESULTS"]

RESULTS = Path(__file__).resolve().parent / "results"


def _run(args):
    return run_config(*args)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m paper_repro.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="N up to 64, both budgets x costs, 8 W samples per rank (slow)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    ap.add_argument("--only", default="", help="comma-separated distributions to run (default: all)")
    ap.add_argument("--out", default=str(RESULTS), help="output folder")
    ap.add_argument("--no-runtime", action="store_true", help="skip the runtime-overhead part (bench_runtime)")
    ap.add_argument("--worlds", default="", help="comma-separated world sizes replacing the grid's (e.g. 64)")
    ap.add_argument("--name", default="", help="output file stem quality_sim_<name>_<yyyymm> (default: no name)")
    ap.add_argument("--release-python", default="", help="python of a venv holding online-dynamic-batching 0.1.2: "
                    "also measure the released package itself at release_points() (make bench does)")
    a = ap.parse_args(argv)
    cfgs = grid(a.full, tuple(int(w) for w in a.worlds.split(",")) if a.worlds else None)
    if a.only:
        keep = set(a.only.split(","))
        cfgs = [c for c in cfgs if c[0] in keep]
    prov = stamp()  # the code that runs, taken before it runs
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=a.jobs) as ex:
        results = list(ex.map(_run, cfgs))
    wall = time.perf_counter() - t0
    micro = decision_microbench()
    released = []
    pts = release_points() if a.release_python else []
    for i, pt in enumerate(pts):
        print(f"released package {i + 1}/{len(pts)}: {pt[0]} N={pt[1]} W={pt[2]} B={pt[3]}",
              file=sys.stderr, flush=True)
        mine = next((r for r in results if tuple(r[k] for k in ("dist", "world", "window", "budget", "cost"))
                     == pt[:5]), None) or run_config(*pt)
        released.append({"point": list(pt), "package": measure_release_package(a.release_python, *pt),
                         "odb": mine["methods"]["odb"], "odb_dealt": mine["methods"]["odb_dealt"],
                         "release_reimpl": mine["methods"]["release_reimpl"],
                         "gmt_steps": mine["methods"]["gmt"]["steps"]})
    report = {"date": time.strftime("%Y-%m-%d"), "provenance": prov, "wall_s": wall, "jobs": a.jobs, "full": a.full,
              "targets": TARGET_VALUES, "decision_microbench_1024": micro, "release_package": released,
              "distributions": {d: describe(sample_lengths(d, 20000)) for d in DISTRIBUTIONS},
              "results": results}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"quality_sim_{a.name + '_' if a.name else ''}{time.strftime('%Y%m')}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1))
    (out / f"{stem}.md").write_text(render(report))
    print((out / f"{stem}.md").read_text())
    if not a.no_runtime:
        _runtime_part(out)
    return 0


def _runtime_part(out: Path) -> None:
    from . import bench_runtime
    figures = bench_runtime.main(out)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    sys.exit(main())
