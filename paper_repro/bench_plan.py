"""How long ``odb plan`` takes a user, by world size: the planning guide's examples on one core of this machine.

    python -m paper_repro.bench_plan [--points 5000x8 5000x64 ...] [--out DIR]

Each point is a number of post-preprocessing lengths (a long tail: lognormal, CV about 1, 8 to 16,000 tokens,
seeded) and a world size, planned with the default candidates (`odb.plan.DEFAULT_BUDGETS` x
`odb.plan.DEFAULT_WINDOWS`, the placements that world size allows, ``--ranks-per-host 8`` where the world holds two
hosts or more), with the wall time of `odb.plan.plan` (the code the command runs, its imports excluded): in this
process alone (``jobs=1``, the target's measure), then as the command runs by default (a process a CPU), the two
reports checked equal.  `TARGETS` (data): issue 64's "under about 20 s" on one core.  A miss prints the work behind
it: the samples simulated times the candidates (about 10 us each here), and each round every simulated rank's
replicated decision over every rank's header.  Writes ``results/plan_times_<yyyymm>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

__all__ = ["TARGETS", "POINTS", "run", "main"]

TARGETS = {"seconds": 20.0}
POINTS = ((5_000, 8), (5_000, 64), (5_000, 1024), (100_000, 8), (100_000, 64), (100_000, 1024))


def _lengths(n: int):
    import numpy as np

    return np.clip(np.random.default_rng(64).lognormal(6.0, 0.9, n).astype(int), 8, 16_000)


def run(points=POINTS, every_cpu: bool = True) -> dict:
    """Each point planned in this process (``jobs=1``: one core, the target's measure) and, with `every_cpu`, as
    the command runs it by default (``jobs=None``: a process a CPU of this machine), the two reports compared."""
    from odb.plan import plan
    from odb.plan.planner import _jobs

    rows = []
    for n, world in points:
        lens = _lengths(n)
        rph = 8 if world >= 16 else 1
        t0 = time.perf_counter()
        r = plan(lens, world_size=world, ranks_per_host=rph, jobs=1)
        s = time.perf_counter() - t0
        row = {"lengths": n, "world_size": world, "ranks_per_host": rph, "seconds": round(s, 2),
               "candidates": len(r.predictions), "samples_per_rank": r.inputs["samples_per_rank"],
               "windows_cut": r.inputs["windows_cut"], "meets": s <= TARGETS["seconds"]}
        if every_cpu:
            t0 = time.perf_counter()
            d = plan(lens, world_size=world, ranks_per_host=rph, jobs=None)
            row["default_seconds"] = round(time.perf_counter() - t0, 2)
            row["default_jobs"] = _jobs(None, len(r.predictions), r.inputs["simulated_samples"])
            if [p.as_dict() for p in d.predictions] != [p.as_dict() for p in r.predictions]:
                raise AssertionError(f"{n} lengths at {world} ranks: the report differs with jobs=None")
        rows.append(row)
    return {"date": time.strftime("%Y-%m-%d"), "targets": TARGETS, "rows": rows}


def lines(res: dict) -> list[str]:
    out = ["| lengths | ranks | candidates | a rank's epoch | seconds, one core | target | seconds, the default |",
           "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        miss = "" if r["meets"] else (f" miss: {r['lengths']} samples x {r['candidates']} candidates simulated, each "
                                       f"round {r['world_size']} cores deciding on {r['world_size']} headers")
        dflt = f"{r['default_seconds']:.1f} ({r['default_jobs']} processes)" if "default_seconds" in r else "-"
        out.append(f"| {r['lengths']:,} | {r['world_size']} | {r['candidates']} | {r['samples_per_rank']} | "
                   f"{r['seconds']:.1f} | <= {TARGETS['seconds']:.0f} s{miss} | {dflt} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", nargs="+", help="LENGTHSxWORLD, e.g. 5000x64 (default: the guide's examples)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = ap.parse_args(argv)
    points = [tuple(int(v) for v in p.split("x")) for p in a.points] if a.points else POINTS
    from .provenance import stamp

    res = {**run(points), "provenance": stamp()}
    print("\n".join(lines(res)))
    path = os.path.join(a.out, f"plan_times_{time.strftime('%Y%m')}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
