"""The statistics of `make repro`'s repeated runs: medians, spreads, paired ratios, what is resolved.

Pure functions of the run records that `paper_repro.train` writes (one record per method per
round); `paper_repro.report` renders them.  Definitions, used everywhere:

    spread     median, min and max of a quantity over the rounds (n = number of rounds); with 3
               rounds the min-max is the whole sample, nothing is trimmed
    ratio      of two methods in one workload: one value per round, method / base, both measured
               in that round (paired, so a slow stretch that hits both cancels); its spread is
               over the rounds
    resolved   a ratio is resolved against 1 if its min-max excludes 1; two ratios to the same base
               are resolved against each other if their min-max ranges do not overlap.  Anything
               else is "not resolved on this machine"
    gauge      GMT / BMT in every round where both emitted identical batches (same steps per rank,
               same tokens, same validation loss): a ratio whose true value is exactly 1, so its
               spread is what this machine does to a ratio (`gauge`)
    agree      two runs agree on a quantity if each one's median lies within the other's min-max
"""

from __future__ import annotations

import random
import statistics

__all__ = ["spread", "fmt", "repeats", "method_spread", "paired", "ratios", "resolve", "gauge", "identical",
           "summarize", "agree", "expected_agreement", "compare_runs", "ordering"]


def spread(xs) -> dict | None:
    """{"med", "lo", "hi", "n"} of the values (None ones skipped); None if there are none."""
    v = [float(x) for x in xs if x is not None]
    if not v:
        return None
    return {"med": statistics.median(v), "lo": min(v), "hi": max(v), "n": len(v)}


def fmt(s: dict | None, nd: int = 2, unit: str = "") -> str:
    """'1.43x [1.38-1.47]' style; '-' for None; a single value without brackets."""
    if s is None:
        return "-"
    if s["n"] == 1 or s["lo"] == s["hi"]:
        return f"{s['med']:.{nd}f}{unit}"
    return f"{s['med']:.{nd}f}{unit} [{s['lo']:.{nd}f}-{s['hi']:.{nd}f}]"


def repeats(run: dict, m: str) -> list[dict]:
    """The method's per-round records ([] if it is missing or unavailable)."""
    r = run["methods"].get(m) or {}
    return [] if "unavailable" in r else list(r.get("repeats", []))


def method_spread(run: dict, m: str, key) -> dict | None:
    """Spread over rounds of ``key(record)`` (a callable) or ``record[key]``."""
    f = key if callable(key) else (lambda rec: rec.get(key))
    return spread(f(rec) for rec in repeats(run, m))


def paired(run: dict, m: str, base: str, key: str = "samples_per_s") -> list[float]:
    """Per-round ratios m / base of ``key``, for the rounds in which both ran."""
    b = {rec["round"]: rec[key] for rec in repeats(run, base)}
    return [rec[key] / b[rec["round"]] for rec in repeats(run, m) if rec["round"] in b and b[rec["round"]]]


def ratios(run: dict, base: str, methods) -> dict:
    """{method: spread of its paired ratio to base} for the methods that ran with base."""
    out = {}
    for m in methods:
        s = spread(paired(run, m, base))
        if s is not None and m != base:
            out[m] = s
    return out


def resolve(rs: dict) -> dict:
    """{method: {"vs_one": "above" | "below" | "not resolved", "overlaps": [methods]}} (module doc)."""
    out = {}
    for m, s in rs.items():
        vs = "above" if s["lo"] > 1 else "below" if s["hi"] < 1 else "not resolved"
        over = [k for k, o in rs.items() if k != m and s["lo"] <= o["hi"] and o["lo"] <= s["hi"]]
        out[m] = {"vs_one": vs, "overlaps": over}
    return out


def identical(a: dict, b: dict) -> bool:
    """Two records emitted the same batches: same steps per rank, tokens and validation losses."""
    keys = ("steps_per_rank", "samples", "real_tokens", "padded_tokens", "micro_steps")
    return all(a[k] == b[k] for k in keys) and [v for _, v in a["val_loss"]] == [v for _, v in b["val_loss"]]


def gauge(runs: list[dict], a: str = "gmt", b: str = "bmt") -> dict:
    """The noise gauge: per-round a / b where both emitted identical batches, over every workload.
    {"ratios": [(workload, round, ratio)], "spread", "skipped": [workloads whose batches differ]}."""
    vals, skipped = [], []
    for run in runs:
        ra = {r["round"]: r for r in repeats(run, a)}
        rb = {r["round"]: r for r in repeats(run, b)}
        both = sorted(set(ra) & set(rb))
        if not both:
            continue
        if not all(identical(ra[k], rb[k]) for k in both):
            skipped.append(run["spec"]["name"])
            continue
        vals += [(run["spec"]["name"], k, ra[k]["samples_per_s"] / rb[k]["samples_per_s"]) for k in both]
    return {"ratios": vals, "spread": spread(v for _, _, v in vals), "skipped": skipped}


def summarize(run: dict, m: str) -> dict:
    """Every reported per-method figure as a spread over rounds (CPU figures: cores, mean of ranks)."""
    def share(part):
        return lambda rec: sum(c[part] for c in rec["cpu"]) / len(rec["cpu"]) / max(1e-9, rec["wall_s"])

    recs = repeats(run, m)
    final = [rec["val_loss"][-1][1] for rec in recs]
    return {
        "sps": method_spread(run, m, "samples_per_s"), "wall": method_spread(run, m, "wall_s"),
        "first": method_spread(run, m, "first_batch_s"), "first_all": method_spread(run, m, "first_batch_all_s"),
        "setup": method_spread(run, m, "setup_s"), "external": method_spread(run, m, "external_cores"),
        "main": method_spread(run, m, share("main_cpu_s")), "loader": method_spread(run, m, share("loader_cpu_s")),
        "other": method_spread(run, m, share("other_cpu_s")), "wait": method_spread(run, m, "wait_frac"),
        "val": spread(final), "val_identical": len(set(final)) <= 1,
        "same_batches": all(identical(recs[0], r) for r in recs[1:]) if recs else True,
        "exactly_once": all(r["exactly_once"] for r in recs) and bool(recs),
        "loaded": sum(1 for r in recs if r.get("loaded")), "reruns": sum(len(r.get("attempts", [])) for r in recs),
    }


def agree(a: dict | None, b: dict | None) -> bool | None:
    """Each run's median lies within the other's min-max (None if either is missing)."""
    if a is None or b is None:
        return None
    return a["lo"] <= b["med"] <= a["hi"] and b["lo"] <= a["med"] <= b["hi"]


def expected_agreement(n: int, trials: int = 20000, seed: int = 0) -> float:
    """The share of quantities on which two runs of n rounds each agree (`agree`: each median inside the
    other's min-max) when both draw from one unchanged distribution (Monte Carlo, Gaussian; seeded, so the
    same every call).  What a harness with no drift between runs should show: 0.61 at n = 4, 0.72 at 5."""
    rng = random.Random(seed)
    ok = 0
    for _ in range(trials):
        a = spread([rng.gauss(0.0, 1.0) for _ in range(n)])
        b = spread([rng.gauss(0.0, 1.0) for _ in range(n)])
        ok += bool(agree(a, b))
    return ok / trials


def compare_runs(prev: list[dict], cur: list[dict], base: str = "standard1",
                 pairs: tuple = (("odb_pad", "gmt"),)) -> list[dict]:
    """Side by side, per workload present in both: each method's samples/s, its ratio to base, and the
    ratios of `pairs` (ODB against the oracle).  Rows: {"workload", "what", "prev", "cur", "agree"}; runs
    without repeats are skipped."""
    rows = []
    old = {r["spec"]["name"]: r for r in prev if any("repeats" in v for v in r["methods"].values())}
    for run in cur:
        p = old.get(run["spec"]["name"])
        if p is None:
            continue
        for m in run["methods"]:
            a, b = method_spread(p, m, "samples_per_s"), method_spread(run, m, "samples_per_s")
            if a and b:
                rows.append({"workload": run["spec"]["name"], "what": f"{m} samples/s", "prev": a, "cur": b,
                             "agree": agree(a, b)})
            if m != base:
                a, b = spread(paired(p, m, base)), spread(paired(run, m, base))
                if a and b:
                    rows.append({"workload": run["spec"]["name"], "what": f"{m} / {base}", "prev": a, "cur": b,
                                 "agree": agree(a, b)})
        for m, ref in pairs:
            if m in run["methods"] and ref in run["methods"]:
                a, b = spread(paired(p, m, ref)), spread(paired(run, m, ref))
                if a and b:
                    rows.append({"workload": run["spec"]["name"], "what": f"{m} / {ref}", "prev": a, "cur": b,
                                 "agree": agree(a, b)})
    return rows


def ordering(points: list[tuple[float, dict]]) -> str:
    """How a ratio moves along x (CV), judged on min-max ranges: 'rises', 'falls', or 'not resolved'
    when some neighbouring ranges overlap (with the resolved steps named)."""
    pts = sorted(points, key=lambda p: p[0])
    steps = []
    for (x0, a), (x1, b) in zip(pts, pts[1:]):
        steps.append("up" if b["lo"] > a["hi"] else "down" if b["hi"] < a["lo"] else "tie")
    if steps and all(s == "up" for s in steps):
        return "rises"
    if steps and all(s == "down" for s in steps):
        return "falls"
    return "not resolved (" + ", ".join(f"{x0:g}->{x1:g} {s}" for (x0, _), (x1, _), s in zip(pts, pts[1:], steps)) + ")"
