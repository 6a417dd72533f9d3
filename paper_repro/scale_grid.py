"""The cluster-scale grid: every method's exact batches at 8 to 1,024 ranks, scored two ways.

``python -m paper_repro.scale_grid [--full]`` (``make repro`` and ``make repro-full`` run it too) writes
``paper_repro/results/scale_grid[_full]_<yyyymm>.{json,md}`` and ``scale_vs_n[_full].png``.
``--window W`` runs every selected point at window W instead, with at least 8 W samples per rank (the
full grid holds the padded points at 64 and 256 ranks at W = 1024, the loader's default, too).

Each point is (distribution, N ranks, window W, budget B, cost kind, samples per rank).  The epoch's
lengths are `paper_repro.distributions`' (the four paper CVs and the release's long-tail mix), shuffled
once; every method schedules the same lengths (`paper_repro.bench_grid.schedules`, which checks that
each schedule holds every sample exactly once):

    gmt             GMT, batches sorted by length (the offline oracle; a length cache)
    gmt_shuffled    GMT with the batch order shuffled (fairseq-style samplers)
    bmt             GMT inside buckets of 4096 (offline, a length cache)
    hf_rebalance    HF Trainer's BatchRebalanceSampler (offline lengths)
    dp_balanced     Megatron-Core's DP-balanced packing (gathers true lengths, moves samples)
    kk_micro        verl / OpenRLHF Karmarkar-Karp micro-batches (moves samples)
    release_reimpl  the released package's algorithm, re-implemented, fixed shards (`odb.core.sim`);
                    not on the quadratic cost (its grouping knows a token budget only, and its groups
                    break a quadratic one: the simulation's partition check stops it)
    odb_dealt       ODB with dealt sharding, the default policy and ``placement=None`` (the paper's algorithm;
                    the default, ``"auto"``, adds the round exchange: `paper_repro.defaults_grid`), `odb.core.sim`
                    (the runtime's `RankCore` per rank on the runtime's header and replicated decision)

    odb_pooled8     ODB with ``pool_size=8`` (`odb.core.placement`, opt-in): the windows of each host's 8 ranks
                    pooled, every rank a replica of its pool's core, only pools aligned through the round
                    collective (N ranks, N x the header); `odb.core.sim` with ``pool_size=8``, one core per
                    pool (the replicas' batches: ``tests/test_pool.py``).  Each rank preprocesses 8 times
                    the samples it trains on.  At N >= 64.

Beside them, a structural PROTOTYPE (``odb_exchange``, `exchange_schedule`) runs where the pooled ODB
does: ODB's own batches, each round's re-dealt across the ranks in decreasing fill (whole batches move
between ranks; the share moved is reported).

Scores, per method:

* *budget cost* (`paper_repro.bench_metrics.metrics`, the issue's figures): ``steps``, ``straggler_eff``
  (sum over steps of mean / max rank cost), ``straggler_ceiling`` (mean / max of the ranks' total cost:
  no order of the same batches does better);
* *step-time model* (`paper_repro.cluster_sim`, H20 constants stated there): predicted ``seconds`` and
  ``samples_per_s`` with each method's collate (pad for a padded cost, packed varlen for the packed and
  quadratic costs), ODB's and the release's round collectives charged (`cluster_sim.odb_round_latency`,
  the mode the runtime picks at this N and W), and ``balanced_samples_per_s``: the same batches with
  every step as long as its mean rank (what perfect balance of this schedule's steps would give);
  ``predicted_accum``: the same at `ACCUM` micro-batches per optimizer step (DDP ``no_sync`` or gradient
  accumulation with the same count on every rank: ranks wait for each other once per optimizer step, so a
  rank's sum over its micro-batches is what must balance);
* ``predicted_variable`` (ODB only): a second PROTOTYPE option on ODB's own batches, variable micro-batch
  counts per optimizer step (`cluster_sim.simulate_variable`; DDP ``no_sync`` only, not a runtime mode),
  compared with sorted GMT at `ACCUM` equal micro-batches.

`TARGETS` (data, the issue's) apply at N >= 64 and W >= 256; `target_lines` prints each as met or
missed, and for a miss the ceiling that explains it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Sequence

__all__ = ["GRID_QUICK", "GRID_FULL", "METHODS", "TARGETS", "BEATS", "points", "run_point", "run_grid",
           "target_lines", "write", "main", "at_window"]

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
DISTS = ("llava", "ultrachat", "mmmix", "sharegpt4o", "release")
METHODS = ("gmt", "gmt_shuffled", "bmt", "hf_rebalance", "dp_balanced", "kk_micro", "release_reimpl", "odb_dealt")
LABELS = {"odb_pooled8": "ODB pool_size=8", "odb_pooled8_exchange": "ODB pool_size=8 + exchange",
          "odb_pooled8_exchange_balanced": "ODB pool_size=8 + exchange, budget-balanced",
          "odb_exchange": "ODB + round exchange (prototype)", "gmt": "GMT sorted (oracle)",
          "gmt_shuffled": "GMT shuffled", "bmt": "BMT", "hf_rebalance": "HF rebalance",
          "dp_balanced": "Megatron DP-balanced", "kk_micro": "KK micro-batches", "release_reimpl": "release (re-impl.)",
          "odb_dealt": "ODB (dealt, placement=None)"}
# Which costs run at which world sizes (the quick grid keeps the 256-rank points to the padded cost: a
# 256-rank point simulates 524k samples through 256 RankCores, about 2 minutes on one core).
GRID_QUICK = {"worlds": (8, 64, 256), "window": 256, "budget": 8192, "per_rank": 2048,
              "costs": {"padded": (8, 64, 256), "packed": (8, 64), "quadratic": (8, 64)},
              "paper_points": (("sharegpt4o", 8, 10000),)}
GRID_FULL = {"worlds": (8, 64, 256, 1024), "window": 256, "budget": 8192, "per_rank": 2048,
             "costs": {"padded": (8, 64, 256, 1024), "packed": (8, 64, 256, 1024), "quadratic": (8, 64, 256, 1024)},
             "paper_points": tuple((d, 8, 10000) for d in DISTS),
             # the default window (`buffer_size`) since 2026-12-01, at 8 W samples per rank (`at_window`)
             "wide": {"window": 1024, "costs": {"padded": (64, 256)}}}
# ODB with pooled windows (`odb.core.placement`): ranks per host, and where it runs (the quick grid: the padded
# points at N >= 64; the full grid: every point at N >= 64).
HOST = 8
POOLED = "odb_pooled8"
EXCHANGE = "odb_exchange"  # the second structural prototype (`exchange_schedule`), where the pooled one runs
POOLED_X = "odb_pooled8_exchange"  # ODB pool_size=8 with the round exchange, through the core (`exchange_point`)
POOLED_XB = "odb_pooled8_exchange_balanced"  # the same with budget balance (``exchange_slack``), `exchange_point`
SLACK = 125  # POOLED_XB's slack in basis points (``exchange_slack=0.0125``): docs/decisions, 2026-12-05
# Micro-batches per optimizer step in the second step-model view (DDP no_sync / gradient accumulation, the
# same count on every rank; `cluster_sim.simulate`'s ``accum``); the targets read the first view (1).
ACCUM = 4
# The targets, as data: at N >= 64 and W >= 256, for ODB (dealt, the default) and for ODB pool_size=8.
TARGETS = {"min_world": 64, "min_window": 256, "straggler_eff": 0.97, "steps_vs_gmt": 1.05,
           "throughput_vs_gmt": 0.97}
# ODB's predicted throughput must be above each of these at every point (the issue's list).
BEATS = ("gmt_shuffled", "bmt", "hf_rebalance", "dp_balanced", "release_reimpl")
# The ODB configurations the targets are checked for.
ODBS = ("odb_dealt", POOLED, POOLED_X, POOLED_XB)
EXCHANGES = (POOLED_X, POOLED_XB)  # the configurations of ``--exchange-rows`` (`exchange_point`)


def exchange_key(slack: int) -> str:
    """The method key of an exchange row with this budget-balance `slack` (basis points)."""
    return POOLED_XB if slack else POOLED_X


def points(full: bool) -> list[tuple]:
    """The grid's points ``(dist, N, W, B, cost, per_rank, pooled)``, largest first (a pool then ends on small
    ones); ``pooled``: the point also runs ODB with pooled windows (`POOLED`) and the exchange prototype."""
    g = GRID_FULL if full else GRID_QUICK
    pts = [(d, n, g["window"], g["budget"], kind, g["per_rank"])
           for kind, worlds in g["costs"].items() for n in worlds for d in DISTS]
    pts += [(d, n, g["window"], g["budget"], "padded", per) for d, n, per in g["paper_points"]]
    wide = g.get("wide")
    if wide:
        pts += [at_window((d, n, g["window"], g["budget"], kind, g["per_rank"]), wide["window"])
                for kind, worlds in wide["costs"].items() for n in worlds for d in DISTS]
    pts = [(*p, p[1] >= 64 and (full or p[4] == "padded")) for p in pts]  # pooled ODB too?
    return sorted(pts, key=lambda p: -p[1] * p[5])


def at_window(p: tuple, window: int, per_rank: int = 0) -> tuple:
    """Grid point `p` at `window` instead, with at least 8 windows of samples per rank (realistic epochs),
    or with `per_rank` samples per rank when given (a side-by-side control at another window)."""
    return (p[0], p[1], window, p[3], p[4], per_rank or max(p[5], 8 * window), *p[6:])


def _plan(rows, row_sizes, world: int, filler: int):
    """``rows[rank][step]`` (indices into `row_sizes`, None = a filler) -> `cluster_sim`'s plan of lengths."""
    steps = max(len(r) for r in rows)
    return [[("filler", filler) if (s < len(rows[r]) and rows[r][s] is None) else
             [row_sizes[i][0] for i in (rows[r][s] if s < len(rows[r]) else [])] for r in range(world)]
            for s in range(steps)]


def _predicted(plan, world: int, collate: str, round_s: float, rounds: int, accum: int) -> dict:
    from . import cluster_sim as cs

    out = cs.simulate(plan, world, cs.H20_2B, num_rounds=rounds, round_s=round_s, collate=collate, accum=accum)
    return {"seconds": out["seconds"], "samples_per_s": out["samples_per_s"], "straggler_eff": out["straggler_eff"],
            "balanced_samples_per_s": out["samples"] / out["balanced_seconds"] if out["balanced_seconds"] else 0.0}


def exchange_schedule(rows, sizes, cost, targets: Sequence[int]) -> tuple[list, dict]:
    """PROTOTYPE of a structural option, not what ships: a round's batches exchanged between ranks.

    ODB's own batches (``rows[rank][step]``, PAD mode, round k holding the next ``targets[k]`` steps on
    every rank), re-dealt within each round by `odb.batching.exchange.exchange_plan` on their fills (the
    default policy's, `odb.batching.policy.aligned_fill`): in decreasing fill, N to a step, a batch
    staying on its own rank where it can.  What the runtime would need and does not have: each batch's
    fill in the next round's header (``T`` ints per rank, gathered: N x T per round) and a transfer of the
    moved batches' samples before their steps (``docs/decisions/2026-12-05-exchange-design.md``).
    Returns the rows and the movement: ``moved_batches`` and ``moved_tokens`` (shares of all),
    ``header_ints_max`` (the largest N x T)."""
    from odb.batching import default_policy
    from odb.batching.exchange import exchange_plan
    from odb.batching.grouping import Group
    from odb.batching.policy import aligned_fill

    world, steps = len(rows), max(len(r) for r in rows)
    attention = default_policy().attention
    out: list[list] = [[None] * steps for _ in range(world)]
    moved = moved_tok = real = tok = 0
    bounds, s0 = [], 0
    for t in targets:
        if s0 >= steps:
            break
        bounds.append((s0, min(steps, s0 + t)))
        s0 += t
    if s0 < steps:
        bounds.append((s0, steps))

    def fill(bt):  # the batch as a window of its own (a fill reads its samples only)
        own = [sizes[i] for i in bt]
        return aligned_fill([Group(tuple(range(len(own))), True, cost.utilisation(own))], own, cost,
                            attention)[0].fill

    for a, b in bounds:
        batch = [[rows[r][k] if k < len(rows[r]) else None for k in range(a, b)] for r in range(world)]
        plan = exchange_plan([[None if bt is None else fill(bt) for bt in row] for row in batch])
        for r in range(world):
            for j, origin in enumerate(plan[r]):
                if origin is None:
                    continue
                bt = batch[origin[0]][origin[1]]
                out[r][a + j] = bt
                n_tok = sum(sizes[i][0] for i in bt)
                real, tok = real + 1, tok + n_tok
                if origin[0] != r:
                    moved, moved_tok = moved + 1, moved_tok + n_tok
    return out, {"moved_batches": moved / max(1, real), "moved_tokens": moved_tok / max(1, tok),
                 "header_ints_max": world * max((b - a for a, b in bounds), default=0)}


def run_point(dist: str, world: int, window: int, budget: int, kind: str, per_rank: int, seed: int = 0,
              pooled: bool = False) -> dict:
    """Every method of `METHODS` on one point, both scores (module docstring)."""
    from odb.baselines import step_lower_bound
    from odb.batching import default_policy
    from odb.core.header import header_layout

    from . import cluster_sim as cs
    from .bench_grid import _exactly_once, point, schedules
    from .bench_metrics import metrics

    t0 = time.perf_counter()
    pt = point(dist, world, budget, kind, per_rank, seed)
    filler = sorted(s[0] for s in pt.sizes)[len(pt.sizes) // 2]  # a PAD filler: one median-length sample
    collate = "pad" if kind == "padded" else "packed"
    header_len = header_layout(default_policy().summary_len, window).length
    round_cost = {"odb_dealt": cs.odb_round_latency(cs.H20_2B, world, window, header_len)[0],
                  "release_reimpl": cs.H20_2B.allgather(world, (2 + 2 * window) * 8)}
    out = {"dist": dist, "world": world, "window": window, "budget": budget, "cost": kind, "per_rank": per_rank,
           "samples": len(pt.sizes), "lower_bound": step_lower_bound(pt.sizes, pt.cost, world), "methods": {}}
    methods = [m for m in METHODS if not (m == "release_reimpl" and kind == "quadratic")]
    round_steps: dict = {}
    for name, (rows, row_sizes, extra) in schedules(pt, world, window, methods, round_steps).items():
        m = {**metrics(rows, row_sizes, pt.cost), **extra}
        plan = _plan(rows, row_sizes, world, filler)
        m["predicted"] = _predicted(plan, world, collate, round_cost.get(name, 0.0), extra.get("rounds", 0), 1)
        m["predicted_accum"] = _predicted(plan, world, collate, round_cost.get(name, 0.0), extra.get("rounds", 0),
                                          ACCUM)
        if name == "odb_dealt":  # the variable-count prototype, on ODB's own batches
            v = cs.simulate_variable(plan, world, cs.H20_2B, ACCUM, extra.get("rounds", 0), round_cost[name], collate)
            m["predicted_variable"] = {k: v[k] for k in ("seconds", "samples_per_s", "straggler_eff", "steps")}
        out["methods"][name] = m
        if name == "odb_dealt" and pooled:  # the exchange prototype, on ODB's own batches and rounds
            t1 = time.perf_counter()
            ex, moved = exchange_schedule(rows, row_sizes, pt.cost, round_steps[name])
            _exactly_once(ex, len(pt.sizes), f"{EXCHANGE} N={world} W={window}")
            plan = _plan(ex, row_sizes, world, filler)
            e = {**metrics(ex, row_sizes, pt.cost), **moved, "rounds": extra["rounds"]}
            r_s = round_cost[name] + cs.H20_2B.allgather(world, 8 * moved["header_ints_max"] / world)  # + the fills
            e["predicted"] = _predicted(plan, world, collate, r_s, extra["rounds"], 1)
            e["predicted_accum"] = _predicted(plan, world, collate, r_s, extra["rounds"], ACCUM)
            e["sim_s"] = time.perf_counter() - t1
            out["methods"][EXCHANGE] = e
    if pooled and world >= 2 * HOST:
        out["methods"][POOLED] = _pooled(pt, world, window, collate, filler)
    return _versus_gmt(out, t0)


def _pooled(pt, world: int, window: int, collate: str, filler: int, exchange: bool = False, slack: int = 0) -> dict:
    """ODB with ``pool_size=HOST`` through the rank core (`odb.core.sim`, one core per pool), both scores;
    with the round exchange (`exchange`) too, and its data movement; `slack`: its budget balance (basis points)."""
    from odb import Exchanged, LoaderSettings, Pooled
    from odb.batching import default_policy
    from odb.core.header import header_layout
    from odb.core.sim import simulate

    from . import cluster_sim as cs
    from .bench_grid import _exactly_once
    from .bench_metrics import metrics

    name = exchange_key(slack) if exchange else POOLED
    t1 = time.perf_counter()
    placement = Exchanged(pool=HOST, slack=slack / 10_000) if exchange else Pooled(HOST)
    sim = simulate([[] for _ in range(world)], LoaderSettings(token_budget=None, cost=pt.cost, buffer_size=window,
                                                              placement=placement, first_window=None), deal=pt.sizes)
    rows, rounds = sim.batches, sim.rounds
    _exactly_once(rows, len(pt.sizes), f"{name} N={world} W={window}")
    plan = _plan(rows, pt.sizes, world, filler)
    # the round collective runs over all N ranks: a pool window's header (and its fills, with the exchange),
    # each rank's W steps of counts
    r_s = cs.odb_round_latency(cs.H20_2B, world, window,
                               header_layout(default_policy().summary_len, window, HOST, exchange).length)[0]
    m = {**metrics(rows, pt.sizes, pt.cost), "rounds": rounds, "sim_s": time.perf_counter() - t1,
         "decision_ms": 1e3 * sum(sim.decision_s) / max(1, len(sim.decision_s))}
    if exchange:  # batches sent between pools (a move inside a pool is in memory), of all real batches
        m["moved_batches"] = sim.moved / max(1, sum(b is not None for row in rows for b in row))
    m["predicted"] = _predicted(plan, world, collate, r_s, rounds, 1)
    m["predicted_accum"] = _predicted(plan, world, collate, r_s, rounds, ACCUM)
    return m


def exchange_point(dist: str, world: int, window: int, budget: int, kind: str, per_rank: int, seed: int = 0,
                   slack: int = 0) -> dict:
    """ODB ``pool_size=HOST`` with the round exchange (`POOLED_X`: `odb.core.sim` with ``exchange=True``, the
    rank core that the loader runs with ``exchange=True``; with a `slack`, `POOLED_XB`: budget balance,
    ``exchange_slack = slack / 10,000``) and sorted GMT, on one point of `run_point`: the rows of
    ``--exchange-rows``.  GMT is recomputed, so that `paper_repro.scale_targets` can check it against
    the committed grids' figures of the same point.  The step-time model charges the round collective with
    the fills in its header; the transfer of the moved batches is not charged (it runs a round ahead of
    their steps, beside the training)."""
    from odb.baselines import step_lower_bound

    from .bench_grid import point, schedules
    from .bench_metrics import metrics

    t0 = time.perf_counter()
    pt = point(dist, world, budget, kind, per_rank, seed)
    filler = sorted(s[0] for s in pt.sizes)[len(pt.sizes) // 2]
    collate = "pad" if kind == "padded" else "packed"
    out = {"dist": dist, "world": world, "window": window, "budget": budget, "cost": kind, "per_rank": per_rank,
           "samples": len(pt.sizes), "lower_bound": step_lower_bound(pt.sizes, pt.cost, world), "methods": {}}
    for name, (rows, row_sizes, extra) in schedules(pt, world, window, ["gmt"], {}).items():
        m = {**metrics(rows, row_sizes, pt.cost), **extra}
        plan = _plan(rows, row_sizes, world, filler)
        m["predicted"] = _predicted(plan, world, collate, 0.0, extra.get("rounds", 0), 1)
        m["predicted_accum"] = _predicted(plan, world, collate, 0.0, extra.get("rounds", 0), ACCUM)
        out["methods"][name] = m
    out["methods"][exchange_key(slack)] = _pooled(pt, world, window, collate, filler, True, slack)
    return _versus_gmt(out, t0)


def _versus_gmt(out: dict, t0: float) -> dict:
    g = out["methods"]["gmt"]
    for m in out["methods"].values():
        m["steps_vs_gmt"] = m["steps"] / g["steps"]
        m["throughput_vs_gmt"] = m["predicted"]["samples_per_s"] / g["predicted"]["samples_per_s"]
        m["balanced_vs_gmt"] = m["predicted"]["balanced_samples_per_s"] / g["predicted"]["samples_per_s"]
        m["accum_throughput_vs_gmt"] = m["predicted_accum"]["samples_per_s"] / g["predicted_accum"]["samples_per_s"]
        if "predicted_variable" in m:  # against GMT at the same micro-batches per step, in equal counts
            m["variable_throughput_vs_gmt"] = (m["predicted_variable"]["samples_per_s"]
                                               / g["predicted_accum"]["samples_per_s"])
    out["lower_bound_vs_gmt"] = out["lower_bound"] / g["steps"]
    out["point_s"] = time.perf_counter() - t0
    return out


def _run(p):
    return run_point(*p[:6], pooled=p[6] if len(p) > 6 else False)


def _run_exchange(p):
    return exchange_point(*p[:6], slack=p[6] if len(p) > 6 else 0)


def exchange_points(results_dir: str = RESULTS) -> list[tuple]:
    """The in-scope points where ODB pool_size=8 ran in the committed grids that today's code computes alike
    (their provenance fingerprint is today's, `fingerprint`; what `paper_repro.provenance` calls current):
    ``(dist, N, W, B, cost, per_rank)``, each once, largest first."""
    current, pts = fingerprint(), set()
    for p in sorted(Path(results_dir).glob("scale_grid*.json")):
        res = json.loads(p.read_text())
        if (res.get("provenance") or {}).get("fingerprint") != current:
            continue  # stale or unstamped: not the points of today's code
        pts |= {(r["dist"], r["world"], r["window"], r["budget"], r["cost"], r["per_rank"])
                for r in in_scope(res["rows"]) if POOLED in r["methods"]}
    return sorted(pts, key=lambda p: (-p[1] * p[5], p))


def write_exchange(res: dict, outdir: str = RESULTS, name: str = "") -> list[str]:
    """``scale_grid_exchange[_name]_<yyyymm>.{json,md}`` (``scale_grid_balanced...`` for `POOLED_XB`): the rows of
    ``--exchange-rows`` (`exchange_point`), which `paper_repro.scale_targets` merges with the committed grids'
    points; returns the paths."""
    key = next(k for k in EXCHANGES if k in res["rows"][0]["methods"])
    kind = "exchange" if key == POOLED_X else "balanced"
    base = os.path.join(outdir, f"scale_grid_{kind}{f'_{name}' if name else ''}_{time.strftime('%Y%m')}")
    os.makedirs(outdir, exist_ok=True)
    with open(base + ".json", "w") as f:
        json.dump(res, f)
    md = [f"# {LABELS[key]}: the round exchange through the rank core at the committed grids' points", "",
          f"Command: `python -m paper_repro.scale_grid --exchange-rows{res.get('args', '')}`; {len(res['rows'])} "
          f"points in {res['seconds']:.0f} s; {time.strftime('%Y-%m-%d')}.  `exchange_point`: "
          + " ".join((exchange_point.__doc__ or "").split()), "",
          "## Targets (this configuration alone; `python -m paper_repro.scale_targets` merges it with the grids)", "",
          *[x for x in target_lines(res) if x.startswith(f"- {LABELS[key]}")], "",
          "## Every point", "",
          "| dist | N | W | cost | per rank | straggler (budget) | straggler (step model) | steps / GMT | "
          "throughput / GMT | batches sent between pools |", "|" + "---|" * 10]
    for r in sorted(res["rows"], key=lambda r: (r["cost"], r["dist"], r["world"], r["window"], r["per_rank"])):
        m = r["methods"][key]
        md.append(f"| {r['dist']} | {r['world']} | {r['window']} | {r['cost']} | {r['per_rank']} | "
                  f"{m['straggler_eff']:.3f} | {m['predicted']['straggler_eff']:.3f} | {m['steps_vs_gmt']:.3f} | "
                  f"{m['throughput_vs_gmt']:.4f} | {m['moved_batches']:.3f} |")
    with open(base + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    return [base + ".json", base + ".md"]


def run_grid(full: bool = False, workers: int = 2, progress: bool = True,
             pts: Sequence[tuple] | None = None) -> dict:
    """Every point of the grid (`points`, or `pts`), `workers` processes; ``{"grid", "rows", "seconds"}``."""
    from tqdm import tqdm

    pts = list(points(full) if pts is None else pts)
    t0 = time.monotonic()
    rows = []
    with ProcessPoolExecutor(max_workers=max(1, workers)) as ex:
        for r in tqdm(ex.map(_run, pts), total=len(pts), desc="scale grid", unit="point", disable=not progress):
            rows.append(r)
    return {"grid": _plain(GRID_FULL if full else GRID_QUICK), "targets": TARGETS, "beats": list(BEATS), "rows": rows,
            "seconds": time.monotonic() - t0}


def _plain(v):
    """`v` with every tuple a list, at any depth (the grid as its JSON holds it; the full grid nests a dict)."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return [_plain(x) for x in v] if isinstance(v, (tuple, list)) else v


def _where(r) -> str:
    return f"{r['dist']} N={r['world']} W={r['window']} {r['cost']} ({r['per_rank']}/rank)"


def in_scope(rows: Sequence[dict], targets: dict = TARGETS) -> list[dict]:
    """The points of `rows` the targets apply to (``min_world`` ranks and ``min_window`` up)."""
    return [r for r in rows if r["world"] >= targets["min_world"] and r["window"] >= targets["min_window"]]


def target_lines(res: dict) -> list[str]:
    """One line per target and ODB configuration (`ODBS`; met, or missed at k of n points with the worst point
    and the ceiling that explains it), then each against every method it must beat, then the prototypes."""
    t = res["targets"]
    pts = in_scope(res["rows"], t)
    if not pts:
        return ["- no point at N >= 64 and W >= 256 in this grid"]
    lines = []

    def tally(label, pool, value, ok, lowest, ceiling):
        vals = [(value(r), r) for r in pool]
        bad = [(v, r) for v, r in vals if not ok(v)]
        v, r = (min if lowest else max)(vals, key=lambda x: x[0])
        line = f"- {label}: " + ("MET" if not bad else f"MISSED at {len(bad)}/{len(vals)} points") + \
               f"; worst {v:.3f} at {_where(r)}"
        if bad:
            line += "; " + ceiling(r)
        lines.append(line)

    for key in ODBS:
        pool = [r for r in pts if key in r["methods"]]
        if not pool:
            continue
        name = LABELS[key]

        def odb(r, key=key):
            return r["methods"][key]

        tally(f"{name}: straggler efficiency >= {t['straggler_eff']}", pool, lambda r: odb(r)["straggler_eff"],
              lambda v: v >= t["straggler_eff"], True,
              lambda r: f"there: its straggler ceiling (mean / max of the ranks' total cost) "
                        f"{odb(r)['straggler_ceiling']:.3f}, GMT's straggler efficiency "
                        f"{r['methods']['gmt']['straggler_eff']:.3f}, its own by the step model (the time "
                        f"the policy aligns, attention included) {odb(r)['predicted']['straggler_eff']:.3f}")
        tally(f"{name}: steps <= {t['steps_vs_gmt']} x GMT's", pool, lambda r: odb(r)["steps_vs_gmt"],
              lambda v: v <= t["steps_vs_gmt"], False,
              lambda r: f"there: the step lower bound is {r['lower_bound_vs_gmt']:.3f} x GMT's steps")
        tally(f"{name}: predicted throughput >= {t['throughput_vs_gmt']} x sorted GMT's", pool,
              lambda r: odb(r)["throughput_vs_gmt"], lambda v: v >= t["throughput_vs_gmt"], True,
              lambda r: f"there: with every step as long as its mean rank its batches would give "
                        f"{odb(r)['balanced_vs_gmt']:.3f} x GMT (the imbalance's share), and it runs "
                        f"{odb(r)['steps_vs_gmt']:.3f} x GMT's steps")
        for peer in BEATS + ("kk_micro",):
            on = [r for r in pool if peer in r["methods"]]
            if not on:
                continue
            def vs(r, peer=peer):
                return odb(r)["predicted"]["samples_per_s"] / r["methods"][peer]["predicted"]["samples_per_s"]

            wins = [r for r in on if vs(r) > 1]
            worst = min(on, key=vs)
            ratio = vs(worst)
            what = "must beat" if peer in BEATS else "reported, not a target:"
            verdict = ("MET" if len(wins) == len(on) else f"MISSED at {len(on) - len(wins)}/{len(on)} points") \
                if peer in BEATS else f"above at {len(wins)}/{len(on)} points"
            lines.append(f"- {name} {what} {LABELS[peer]} on predicted throughput: {verdict}; lowest ratio "
                         f"{ratio:.3f} at {_where(worst)}")

    def base(r):
        return r["methods"]["odb_dealt"]

    pooled = [r for r in pts if POOLED in r["methods"]]
    if pooled:
        better = sum(1 for r in pooled if r["methods"][POOLED]["predicted"]["samples_per_s"]
                     > base(r)["predicted"]["samples_per_s"])
        gain = [r["methods"][POOLED]["predicted"]["samples_per_s"] / base(r)["predicted"]["samples_per_s"]
                for r in pooled]
        lines.append(f"- {LABELS[POOLED]} against ODB dealt (pool_size=1), same points: faster at {better}/"
                     f"{len(pooled)}, {min(gain):.3f}-{max(gain):.3f} x its predicted throughput (pooled packs "
                     f"{HOST} x the window: at the same window the two balance alike, "
                     "docs/decisions/2026-12-02-pooled-windows.md)")
    pts = [r for r in pts if "odb_dealt" in r["methods"]]  # (the exchange rows hold GMT and their own only)
    if not pts:
        return lines
    acc = [(base(r)["accum_throughput_vs_gmt"], r) for r in pts]
    v, r = min(acc, key=lambda x: x[0])
    lines.append(f"- context, not a target: at {ACCUM} micro-batches per optimizer step (no_sync), ODB's predicted "
                 f"throughput is >= {t['throughput_vs_gmt']} x sorted GMT's at "
                 f"{sum(1 for x, _ in acc if x >= t['throughput_vs_gmt'])}/{len(acc)} points; worst {v:.3f} at "
                 f"{_where(r)}")
    var = [(base(r)["variable_throughput_vs_gmt"], base(r)["predicted_variable"]["straggler_eff"], r) for r in pts
           if "variable_throughput_vs_gmt" in base(r)]
    if var:
        v, _, r = min(var, key=lambda x: x[0])
        lines.append(f"- structural option, a prototype (`cluster_sim.simulate_variable`: variable micro-batch "
                     f"counts per optimizer step, DDP no_sync, about {ACCUM} per step): ODB's predicted throughput >= "
                     f"{t['throughput_vs_gmt']} x sorted GMT's (at {ACCUM} equal micro-batches) at "
                     f"{sum(1 for x, _, _ in var if x >= t['throughput_vs_gmt'])}/{len(var)} points; worst {v:.3f} at "
                     f"{_where(r)}; straggler efficiency per optimizer step {min(x for _, x, _ in var):.3f}-"
                     f"{max(x for _, x, _ in var):.3f}")
    ex = [r for r in pts if EXCHANGE in r["methods"]]
    if ex:
        def rng(key, m):
            v = [(r["methods"][m][key] if key in r["methods"][m] else r["methods"][m]["predicted"][key]) for r in ex]
            return f"{min(v):.3f}-{max(v):.3f}"
        better = sum(1 for r in ex if r["methods"][EXCHANGE]["predicted"]["samples_per_s"]
                     > base(r)["predicted"]["samples_per_s"])
        lines.append(f"- structural option, a prototype (`exchange_schedule`: each round's batches re-dealt across "
                     f"ranks by fill), at {len(ex)} points: straggler efficiency {rng('straggler_eff', EXCHANGE)} "
                     f"(ODB dealt {rng('straggler_eff', 'odb_dealt')}), steps {rng('steps_vs_gmt', EXCHANGE)} x GMT "
                     f"({rng('steps_vs_gmt', 'odb_dealt')}), predicted throughput {rng('throughput_vs_gmt', EXCHANGE)} "
                     f"x GMT ({rng('throughput_vs_gmt', 'odb_dealt')}); faster than ODB dealt at {better}/{len(ex)}; "
                     f"batches moved {rng('moved_batches', EXCHANGE)}")
    return lines


def _needs() -> list[str]:
    """Which methods read a length cache before the epoch, and which move samples between ranks (the flags
    `bench_grid.METHODS` carries, from `odb.baselines.PEERS`)."""
    from .bench_grid import METHODS as FLAGS

    flags = {m.key: m for m in FLAGS}
    lines = ["| method | length cache | moves samples |", "|---|---|---|"]
    for k in METHODS:
        f = flags[k]
        lines.append(f"| {LABELS[k]} | {'yes' if f.length_cache else 'no'} | {'yes' if f.moves_samples else 'no'} |")
    lines.append(f"| {LABELS[POOLED]} | no | no (each rank of a host preprocesses all of its host's samples) |")
    lines.append(f"| {LABELS[EXCHANGE]} | no | yes: whole batches, within a round (the share is in the results) |")
    return lines


def _table(res: dict, cell) -> list[str]:
    cols = METHODS + (POOLED, EXCHANGE, POOLED_X, POOLED_XB)
    lines = ["| dist | N | W | cost | per rank | " + " | ".join(LABELS[m] for m in cols) + " |",
             "|" + "---|" * (5 + len(cols))]
    key = lambda r: (r["cost"], r["dist"], r["world"], r["window"], r["per_rank"])  # noqa: E731
    for r in sorted(res["rows"], key=key):
        cells = [cell(r["methods"][m]) if m in r["methods"] else "n/a" for m in cols]
        lines.append(f"| {r['dist']} | {r['world']} | {r['window']} | {r['cost']} | {r['per_rank']} | "
                     + " | ".join(cells) + " |")
    return lines


def write(res: dict, outdir: str = RESULTS, full: bool = False, name: str = "") -> list[str]:
    """The JSON, the Markdown report and the plot (``scale_grid[_full][_name]_<yyyymm>``); returns the paths."""
    stamp = time.strftime("%Y%m")
    tag = ("_full" if full else "") + (f"_{name}" if name else "")
    base = os.path.join(outdir, f"scale_grid{tag}_{stamp}")
    os.makedirs(outdir, exist_ok=True)
    with open(base + ".json", "w") as f:
        json.dump(res, f)
    g = res["grid"]
    doc = (__doc__ or "").strip()
    md = ["# Predicted: balance and throughput from 8 to 1,024 ranks (exact batches, step-time model)", "",
          f"Command: `python -m paper_repro.scale_grid{res.get('args', ' --full' if full else '')}`; "
          f"{len(res['rows'])} points in "
          f"{res['seconds']:.0f} s; {time.strftime('%Y-%m-%d')}.", "",
          f"Grid: W = {g['window']}, B = {g['budget']}, {g['per_rank']} samples per rank "
          f"({g['per_rank'] / g['window']:g} W); costs by world "
          f"size {g['costs']}; paper-sized points {g['paper_points']} ((dist, N, samples per rank))"
          + (f"; at W = {g['wide']['window']} too, 8 W samples per rank: {g['wide']['costs']}" if g.get("wide") else "")
          + ".", "",
          "```", doc, "```", "", "## Targets (ODB dealt and ODB pool_size=8, N >= 64, W >= 256)", "",
          *target_lines(res), "",
          "## What each method needs", "", *_needs(), "",
          "## Every point", "",
          "Each cell: straggler efficiency (budget cost) / steps vs sorted GMT / predicted throughput vs sorted GMT.",
          "", *_table(res, lambda m: f"{m['straggler_eff']:.3f} / {m['steps_vs_gmt']:.3f} / "
                                     f"{m['throughput_vs_gmt']:.3f}"), "",
          f"## At {ACCUM} micro-batches per optimizer step (no_sync)", "",
          "Each cell: predicted straggler efficiency per optimizer step / predicted throughput vs sorted GMT (at "
          f"{ACCUM} too).", "",
          *_table(res, lambda m: f"{m['predicted_accum']['straggler_eff']:.3f} / {m['accum_throughput_vs_gmt']:.3f}"),
          ""]
    plot = plot_vs_n(res, os.path.join(outdir, f"scale_vs_n{tag}.png"))
    if plot:
        md += [f"![straggler efficiency and predicted throughput against N]({os.path.basename(plot)})", ""]
    with open(base + ".md", "w") as f:
        f.write("\n".join(md))
    return [base + ".json", base + ".md"] + ([plot] if plot else [])


def plot_vs_n(res: dict, path: str) -> str | None:
    """Straggler efficiency and predicted throughput / sorted GMT against N, per method (the exchange rows
    too, where `res` holds them: `paper_repro.scale_targets` plots the merged grids), padded cost, one column
    per distribution, at ``res["grid"]``'s samples per rank (not the paper-sized points); None if no point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = res["grid"]["per_rank"]
    rows = [r for r in res["rows"] if r["cost"] == "padded" and r["per_rank"] == per]
    dists = [d for d in DISTS if any(r["dist"] == d for r in rows)]
    if not dists:
        return None
    fig, ax = plt.subplots(2, len(dists), figsize=(3.2 * len(dists), 6), squeeze=False, sharex=True)
    for j, d in enumerate(dists):
        rr = sorted((r for r in rows if r["dist"] == d), key=lambda r: r["world"])
        for i, m in enumerate(METHODS + (POOLED, EXCHANGE) + EXCHANGES):
            lw = 2.5 if m in ODBS else 1.0
            ls = {EXCHANGE: "--", POOLED_X: "-.", POOLED_XB: (0, (5, 1))}.get(m, "-")
            color = plt.get_cmap("tab20")(2 * i % 20 + 2 * i // 20)  # the 12 methods, no two alike
            xy = [(r["world"], r["methods"][m]) for r in rr if m in r["methods"]]
            if not xy:
                continue
            xs = [x for x, _ in xy]
            for row, key in ((0, "straggler_eff"), (1, "throughput_vs_gmt")):
                ax[row][j].plot(xs, [v[key] for _, v in xy], marker="o", lw=lw, ls=ls, color=color, label=LABELS[m])
        ax[0][j].axhline(res["targets"]["straggler_eff"], color="k", ls=":", lw=0.8)
        ax[1][j].axhline(res["targets"]["throughput_vs_gmt"], color="k", ls=":", lw=0.8)
        ax[0][j].set_title(d, fontsize=9)
        ax[1][j].set_xscale("log", base=2)
        ax[1][j].set_xlabel("ranks N")
    ax[0][0].set_ylabel("straggler efficiency (budget cost)")
    ax[1][0].set_ylabel("predicted throughput / sorted GMT")
    ax[0][0].legend(fontsize=6, loc="lower left")
    fig.suptitle(f"padded cost, W = {res['grid']['window']}, {per} samples per rank; dotted: the targets", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- provenance: what each result records of the code that made it (`paper_repro.provenance` checks it) --------
_ROOT = Path(__file__).resolve().parents[1]
# (dist, world, window, budget, cost, per_rank, pooled): padded with pooled windows, packed and quadratic
PROBES = (("sharegpt4o", 16, 32, 4096, "padded", 128, True),
          ("mmmix", 8, 16, 4096, "packed", 64, False),
          ("release", 8, 16, 4096, "quadratic", 64, False))
# (dist, world, window, budget, cost, per_rank) of the quality grid
QUALITY_PROBES = (("llava", 2, 64, 4096, "padded", 256), ("release", 4, 32, 4096, "packed", 128))
# wall times measured while computing, not computed: they differ run to run
TIMING_KEYS = frozenset({"plan_s", "sim_s", "point_s", "decision_ms", "decision_ms_max"})


def without_timings(x):
    """`x` without its measured wall times."""
    if isinstance(x, dict):
        return {k: without_timings(v) for k, v in x.items() if k not in TIMING_KEYS}
    if isinstance(x, list):
        return [without_timings(v) for v in x]
    return x


def fingerprint(probes=PROBES, quality_probes=QUALITY_PROBES) -> str:
    """The SHA-256 of `run_point` on `probes` and `run_config` on `quality_probes` (`paper_repro.provenance`);
    about 3 s."""
    from .bench_grid import run_config

    h = hashlib.sha256()
    for dist, world, window, budget, kind, per_rank, pooled in probes:
        res = run_point(dist, world, window, budget, kind, per_rank, 0, pooled=pooled)
        h.update(json.dumps(without_timings(res), sort_keys=True).encode())
    for q in quality_probes:
        h.update(json.dumps(without_timings(run_config(*q)), sort_keys=True).encode())
    return h.hexdigest()


# (dist, world, window, budget, cost, per_rank) of the exchange rows' fingerprint: 2 pools of 8, where the plain
# exchange moves 8% of the batches and budget balance 11%, with other figures (`exchange_fingerprint`)
EXCHANGE_PROBE = ("sharegpt4o", 16, 32, 4096, "padded", 128)


def exchange_digest(point, probe, slack, timing_keys) -> str:
    """The SHA-256 of ``point(*probe)`` at budget-balance `slack`, `timing_keys` left out.  Standard library only,
    and no name of this module: `paper_repro.provenance.at_commit` runs its source against an older checkout's
    `exchange_point` (one without a ``slack`` argument, before budget balance, at ``slack == 0``)."""
    import hashlib as _h
    import json as _j

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in timing_keys}
        return [strip(v) for v in x] if isinstance(x, list) else x

    res = point(*probe, slack=slack) if slack else point(*probe)
    return _h.sha256(_j.dumps(strip(res), sort_keys=True).encode()).hexdigest()


def exchange_fingerprint(slack: int, probe=EXCHANGE_PROBE) -> str:
    """What `fingerprint` leaves out, for the rows of ``--exchange-rows``: `exchange_point` on `probe` at `slack`
    (`exchange_digest`); under 1 s.  A change to the exchange plan, the rank core's exchange or the pools
    changes it; `fingerprint` runs neither."""
    return exchange_digest(exchange_point, probe, slack, TIMING_KEYS)


def git(*args: str) -> str | None:
    """``git args`` in this checkout: its output, or None (no git, not a checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(_ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def stamp(exchange_slack: int | None = None) -> dict:
    """What a result writer records (`paper_repro.provenance`): the commit, a dirty tree, the fingerprint; for
    exchange rows (`exchange_slack` not None) also ``exchange_slack`` and ``exchange_fingerprint``."""
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--", "odb", "paper_repro", ":(exclude)paper_repro/results")
    out = {"commit": commit, "dirty": None if status is None else bool(status), "fingerprint": fingerprint()}
    if exchange_slack is not None:
        out.update(exchange_slack=exchange_slack, exchange_fingerprint=exchange_fingerprint(exchange_slack))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The cluster-scale grid (module docstring).")
    ap.add_argument("--full", action="store_true", help="N up to 1024, every cost (hours on 2 cores)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--worlds", default="", help="comma-separated: keep only these N")
    ap.add_argument("--dists", default="", help="comma-separated: keep only these distributions")
    ap.add_argument("--costs", default="", help="comma-separated: keep only these costs")
    ap.add_argument("--name", default="", help="a tag for the file names (a filtered grid is not the grid)")
    ap.add_argument("--window", type=int, default=0,
                    help="every point at this window instead, with max(8 W, its own) samples per rank")
    ap.add_argument("--per-rank", type=int, default=0,
                    help="with --window: this many samples per rank instead (a control at equal epochs)")
    ap.add_argument("--exchange-rows", action="store_true",
                    help=f"{LABELS[POOLED_X]} and GMT (`exchange_point`) at the committed grids' in-scope points")
    ap.add_argument("--slack", type=int, default=0, help=f"with --exchange-rows: budget balance, basis points "
                    f"({LABELS[POOLED_XB]} at {SLACK})")
    ap.add_argument("--max-samples", type=int, default=0, help="with --exchange-rows: points of at most N x per "
                    "rank samples only")
    ap.add_argument("--min-samples", type=int, default=0, help="with --exchange-rows: points above this only")
    args = ap.parse_args(argv)
    if args.exchange_rows:
        return _exchange_main(args)
    if args.per_rank and not args.window:
        raise SystemExit("--per-rank goes with --window")
    keep = [(i, set(v.split(","))) for i, v in ((1, args.worlds), (0, args.dists), (4, args.costs)) if v]
    pts = [p for p in points(args.full) if all(str(p[i]) in vs for i, vs in keep)]
    if not pts:
        raise SystemExit("no point of the grid passes the filters")
    if (keep or args.window) and not args.name:
        raise SystemExit("a filtered grid needs --name (its files must not pass for the whole grid's)")
    if args.window:
        # each point once: the full grid's wide points are there already
        pts = list(dict.fromkeys(at_window(p, args.window, args.per_rank) for p in pts))
    prov = stamp()  # the code that runs, taken before it runs (a commit made during the run is not it)
    res = run_grid(args.full, args.workers, pts=pts)
    res["provenance"] = prov
    if args.window:
        res["grid"].update(window=args.window,
                           per_rank=args.per_rank or max(8 * args.window, res["grid"]["per_rank"]))
        res["grid"].pop("wide", None)
    res["args"] = "".join(f" --{k} {v}" for k, v in (("worlds", args.worlds), ("dists", args.dists),
                                                     ("costs", args.costs), ("window", args.window),
                                                     ("per-rank", args.per_rank),
                                                     ("name", args.name)) if v)
    res["args"] = (" --full" if args.full else "") + res["args"]
    for p in write(res, args.out, args.full, args.name):
        print("wrote", p)
    print("\n".join(target_lines(res)))
    return 0


def _exchange_main(args) -> int:
    """``--exchange-rows``: `exchange_point` at `exchange_points`, filtered, `args.workers` processes."""
    from tqdm import tqdm

    keep = [(i, set(v.split(","))) for i, v in ((1, args.worlds), (0, args.dists), (4, args.costs)) if v]
    pts = [p for p in exchange_points() if all(str(p[i]) in vs for i, vs in keep)
           and (not args.max_samples or p[1] * p[5] <= args.max_samples) and p[1] * p[5] > args.min_samples]
    if not pts:
        raise SystemExit("no committed in-scope point passes the filters")
    prov, t0, rows = stamp(args.slack), time.monotonic(), []
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as ex:
        for r in tqdm(ex.map(_run_exchange, [(*p, args.slack) for p in pts]), total=len(pts), desc="exchange rows",
                      unit="point"):
            rows.append(r)
    res = {"targets": TARGETS, "beats": list(BEATS), "rows": rows, "seconds": time.monotonic() - t0,
           "provenance": prov, "args": "".join(f" --{k} {v}" for k, v in (
               ("worlds", args.worlds), ("dists", args.dists), ("costs", args.costs), ("max-samples", args.max_samples),
               ("min-samples", args.min_samples), ("slack", args.slack), ("name", args.name)) if v)}
    for p in write_exchange(res, args.out, args.name):
        print("wrote", p)
    label = LABELS[exchange_key(args.slack)]
    print("\n".join(x for x in target_lines(res) if x.startswith(f"- {label}")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
