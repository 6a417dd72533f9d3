"""The benchmark grid and its points: every method on one point (`run_config`), the released package
measured on N gloo ranks (`measure_release_package`), and the decision-time microbenchmark."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from odb.baselines import (
    PEERS,
    ReleasePolicy,
    batch_lower_bound,
    bucketed_max_tokens,
    global_max_tokens,
    memory_equivalent_batch_size,
    standard,
    step_lower_bound,
)
from odb.batching import default_policy, make_cost_model
from odb.core.sim import simulate
from odb.settings import LoaderSettings

from .bench_metrics import metrics
from .distributions import DISTRIBUTIONS, sample_lengths

__all__ = ["grid", "run_config", "point", "Point", "schedules", "OFFLINE", "SIMULATED", "release_points",
           "measure_release_package", "decision_microbench", "Method", "METHODS"]


class Method(NamedTuple):
    """One method of the grid, as the report's legend shows it."""

    key: str             # its key in ``run_config(...)["methods"]``
    label: str
    length_cache: bool   # reads every sample's length before the epoch starts
    moves_samples: bool  # a sample loaded by one rank's shard may be trained on another rank


# Every scored method, in report order.  The peers' flags are `odb.baselines.PEERS`'s (written once, there);
# ODB dealt moves nothing between ranks either: a rank loads the positions it is dealt (`odb.batching.deal`).
METHODS: tuple[Method, ...] = (
    Method("gmt", "GMT, sorted batch order (offline oracle)", True, False),
    *(Method(p.key, p.source, p.length_cache, p.moves_samples) for p in PEERS[:1]),
    Method("bmt", "BMT, GMT inside buckets of 4096 (offline oracle)", True, False),
    *(Method(p.key, p.source, p.length_cache, p.moves_samples) for p in PEERS[1:]),
    Method("release_reimpl", "the release algorithm (re-implemented), fixed shards", False, False),
    Method("odb", "ODB, fixed shards", False, False),
    Method("odb_dealt", "ODB, dealt shards", False, False),
)


def _exactly_once(rows, n: int, what: str) -> None:
    emitted = sorted(i for row in rows for b in row if b for i in b)
    if emitted != list(range(n)):
        raise AssertionError(f"{what}: samples lost or duplicated")


def _sim_rows(sim, starts):
    return [[None if b is None else [starts[r] + i for i in b] for b in row] for r, row in enumerate(sim.batches)]


class Point(NamedTuple):
    """One grid point's data: the lengths, the cost model and the fixed shards' layout."""

    sizes: list            # the epoch's samples in dataset order (already shuffled)
    cost: object
    shards: list           # fixed strided shards (DistributedSampler-style), as sizes
    order_sizes: list      # the shards concatenated: what fixed-shard simulations' positions index
    starts: list           # each shard's first index in `order_sizes`


def point(dist: str, world: int, budget: int, kind: str, per_rank: int, seed: int = 0) -> Point:
    sizes = sample_lengths(dist, world * per_rank, seed)
    shards_idx = [list(range(r, len(sizes), world)) for r in range(world)]
    starts = [sum(len(s) for s in shards_idx[:r]) for r in range(world)]
    return Point(sizes, make_cost_model(kind, budget), [[sizes[i] for i in sh] for sh in shards_idx],
                 [sizes[i] for sh in shards_idx for i in sh], starts)


# what `schedules` can run, beside the peers (`PEERS`): the offline oracles, Standard, and the simulated ones
OFFLINE = ("gmt", "bmt", "standard_bs1", "standard_eq")
SIMULATED = ("odb", "odb_dealt", "release_reimpl")


def schedules(pt: Point, world: int, window: int, methods: Sequence[str], targets: dict | None = None) -> dict:
    """``{method: (rows, row_sizes, extra)}`` for each of `methods` on one point: its exact schedule
    (``rows[rank][step]``, indices into ``row_sizes``, None for a filler), checked to hold every sample
    exactly once (Standard at batch 1 is not materialized: ``rows`` is None, ``extra`` its steps), and
    ``extra``: planning or simulation figures (``plan_s``; the simulated ones' rounds and decision time).
    ``standard_eq`` is Standard at the memory-equivalent batch size (``extra["batch_size"]``).
    ``targets``: a dict that receives, per simulated method, each round's target (its steps, in PAD mode)."""
    sizes, cost = pt.sizes, pt.cost
    peers = {p.key: p for p in PEERS}
    out = {}
    for name in methods:
        t0 = time.perf_counter()
        extra: dict = {}
        if name == "gmt":
            rows, row_sizes = global_max_tokens(sizes, cost, world), sizes
        elif name == "bmt":
            rows, row_sizes = bucketed_max_tokens(sizes, cost, world), sizes
        elif name == "standard_bs1":
            out[name] = (None, sizes, {"steps": len(standard(len(sizes), world, 1)[0])})
            continue
        elif name == "standard_eq":
            b_eq = memory_equivalent_batch_size(sizes, cost)
            rows, row_sizes, extra = standard(len(sizes), world, b_eq), sizes, {"batch_size": b_eq}
        elif name in peers:  # the peers, on the same lengths in dataset order (the ones that shard use strided shards)
            rows, row_sizes = peers[name].fn(sizes, cost, world), sizes
        elif name in SIMULATED:
            policy = ReleasePolicy() if name == "release_reimpl" else default_policy()
            # the paper's ODB: no exchange, every round a full window (the default: defaults_grid)
            setting = LoaderSettings(token_budget=None, cost=cost, buffer_size=window, policy=policy,
                                     placement=None, first_window=None)
            # positions of the one global order `sizes`, dealt to the ranks as they consume them
            if name == "odb_dealt":
                sim = simulate([[] for _ in range(world)], setting, deal=sizes)
                rows, row_sizes = sim.batches, sizes
            else:
                sim = simulate(pt.shards, setting)
                rows, row_sizes = _sim_rows(sim, pt.starts), pt.order_sizes
            if targets is not None:
                targets[name] = list(sim.targets)
            extra = {"rounds": sim.rounds, "decision_ms": 1e3 * sum(sim.decision_s) / len(sim.decision_s),
                     "decision_ms_max": 1e3 * max(sim.decision_s)}
        else:
            raise ValueError(f"unknown method {name!r}")
        if name not in ("gmt", "bmt"):
            _exactly_once(rows, len(sizes), f"{name} N={world} W={window}")
        if name in peers or name in SIMULATED:
            extra["plan_s" if name in peers else "sim_s"] = time.perf_counter() - t0
        out[name] = (rows, row_sizes, extra)
    return out


def run_config(dist: str, world: int, window: int, budget: int, kind: str, per_rank: int, seed: int = 0) -> dict:
    """Every method on one grid point; returns the figures as a dict."""
    pt = point(dist, world, budget, kind, per_rank, seed)
    sizes, cost = pt.sizes, pt.cost
    lb = step_lower_bound(sizes, cost, world)
    shard_lb = max(batch_lower_bound(sh, cost) for sh in pt.shards)  # fixed shards: the fullest one's batches
    tokens = [sum(s[0] for s in sh) for sh in pt.shards]
    out = {"dist": dist, "world": world, "window": window, "budget": budget, "cost": kind,
           "samples": len(sizes), "lower_bound": lb, "shard_lower_bound": shard_lb,
           # policy-free ceilings of the shards: straggler efficiency (exact for a packed cost:
           # mean/max of the ranks' tokens) and packed budget use (total / (N * B * shard_lb))
           "shard_token_ceiling": (sum(tokens) / world) / max(tokens),
           "packed_use_ceiling": sum(tokens) / (world * budget * shard_lb), "methods": {}}
    scheds = schedules(pt, world, window, ("gmt", "bmt", *(p.key for p in PEERS), "standard_bs1", "standard_eq",
                                           "odb", "odb_dealt", "release_reimpl"))
    for name, (rows, row_sizes, extra) in scheds.items():
        if name == "standard_bs1":
            out["methods"][name] = dict(extra)
            continue
        if name == "standard_eq":
            name = f"standard_bs{extra['batch_size']}"
        extra = {k: v for k, v in extra.items() if k != "batch_size"}
        out["methods"][name] = {**metrics(rows, row_sizes, cost), **extra}
    g = out["methods"]["gmt"]["steps"]
    for m in out["methods"].values():
        m["vs_gmt"] = m["steps"] / g
        m["vs_lb"] = m["steps"] / lb
        m["vs_shard_lb"] = m["steps"] / shard_lb
    return out


def release_points(worlds: Sequence[int] = (2, 8)) -> list[tuple]:
    """Where `--release-python` runs the released package: every padded point of the default grid
    at world sizes `worlds` (its budget is padded tokens), plus 16 ranks at W = 256, B = 8192.
    Each point starts N gloo processes that import torch, so 64 ranks is left out on 2 cores
    (measured: 3 s a point at N = 2, 8 s at N = 8, 20 s at N = 16)."""
    pts = [c for c in grid(False, tuple(worlds)) if c[4] == "padded"]
    pts += [c for c in grid(False, (16,)) if c[4] == "padded" and c[2] == 256 and c[3] == 8192]
    return sorted(pts, key=lambda c: (c[0], c[1], c[2], c[3]))


def measure_release_package(python: str, dist: str, world: int, window: int, budget: int, kind: str,
                            per_rank: int, seed: int = 0, timeout_s: int = 300) -> dict:
    """The RELEASED package's own grouping on `world` gloo ranks (`paper_repro.release_driver`, run
    by `python`, a venv holding online-dynamic-batching 0.1.2), scored with `metrics` like the rest.

    Its budget is padded tokens (batch size x longest), so only ``kind="padded"`` is meaningful.
    Returns ``{"error": ...}`` if the ranks fail or time out (never raises for the package's faults).
    """
    sizes = sample_lengths(dist, world * per_rank, seed)
    shards = [sizes[r::world] for r in range(world)]
    flat = [x for sh in shards for x in sh]
    starts = [sum(len(sh) for sh in shards[:r]) for r in range(world)]
    with tempfile.TemporaryDirectory() as tmp:
        job, res = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
        with open(job, "w") as f:
            json.dump({"shards": [[x[0] for x in sh] for sh in shards], "budget": budget,
                       "buffer_size": window, "seed": 1042}, f)
        driver = Path(__file__).resolve().parent / "release_driver.py"
        try:
            subprocess.run([python, str(driver), job, res], timeout=timeout_s, check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
            out = json.load(open(res))
        except (subprocess.TimeoutExpired, OSError, ValueError) as e:
            return {"error": f"{type(e).__name__}: {e}"}
    if "error" in out:
        return out
    steps = max(len(b) for b in out["batches"])
    rows = [[[starts[r] + i for i in b] for b in row] + [None] * (steps - len(row))
            for r, row in enumerate(out["batches"])]
    m = metrics(rows, flat, make_cost_model(kind, budget))
    emitted = [i for row in rows for b in row if b for i in b]
    m.update({"lost": len(flat) - len(set(emitted)), "duplicated": len(emitted) - len(set(emitted)),
              "steps_per_rank": [len(b) for b in out["batches"]], "collate_calls": out["calls"],
              "wall_s": out["wall_s"]})
    return m


def decision_microbench(world: int = 64, window: int = 1024, reps: int = 50) -> dict:
    """Policy time for one round on one rank with a full `window`, for every distribution and
    cost kind: summarize + propose over `world` summaries + partition.  The summaries are those
    of `world` different windows of the distribution (as in a real round), handed over as the runtime
    hands them (`odb.batching.base.summaries_for`: one read-only int64 array to a policy that sets
    ``summary_arrays``, rows otherwise); each rep times a fresh policy (no memo carries over) on one of
    them.  Keys ``"<dist>/<cost>"``."""
    out = {}
    for dist in DISTRIBUTIONS:
        for kind in ("padded", "packed", "quadratic"):
            cost = make_cost_model(kind, 8192)
            wins = [sample_lengths(dist, window, seed=100 + r) for r in range(world)]
            rows = [tuple(default_policy().summarize(w, cost, False)) for w in wins]
            array = np.array(rows, dtype=np.int64)
            array.flags.writeable = False
            times = []
            for rep in range(reps):
                w = wins[rep % world]
                pol = default_policy()
                summaries = array if pol.summary_arrays is True else rows
                t0 = time.perf_counter()
                pol.summarize(w, cost, False)
                t = pol.propose(summaries, window)
                pol.partition(w, t, min(t, len(w)), cost, summaries=summaries)
                times.append(time.perf_counter() - t0)
            times.sort()
            out[f"{dist}/{kind}"] = {"median_ms": 1e3 * times[len(times) // 2], "max_ms": 1e3 * times[-1]}
    return out


def grid(full: bool, worlds: tuple[int, ...] | None = None) -> list[tuple]:
    """The default grid (about 3 minutes on 2 idle cores): every distribution, N in 2, 8, 16, 64,
    W in 64, 256, 1024, (8192, padded), (16384, padded), (8192, packed), ``max(2 W, 1024)``
    samples per rank.  ``full``: N in 2, 8, 64, both budgets x both costs, ``max(8 W, 4096)``.
    ``worlds`` replaces the world sizes (e.g. ``(64,)``: the default grid's points at 64 ranks)."""
    cfgs = []
    combos = [(b, k) for b in (8192, 16384) for k in ("padded", "packed")] if full else \
        [(8192, "padded"), (16384, "padded"), (8192, "packed")]
    for dist in DISTRIBUTIONS:
        for world in (worlds or ((2, 8, 64) if full else (2, 8, 16, 64))):
            for window in (64, 256, 1024):
                per_rank = max(8 * window, 4096) if full else max(2 * window, 1024)
                for budget, kind in combos:
                    cfgs.append((dist, world, window, budget, kind, per_rank))
    # largest first, so the pool does not end on one long point
    return sorted(cfgs, key=lambda c: -c[1] * c[5])
