"""The cluster-scale grid: each method's exact batches through `cluster_sim`'s step-time model.

For each paper distribution (full-scale token lengths from
`paper_repro.distributions`) and each world size N, with ``samples_per_rank``
samples per rank, padded cost under ``budget`` tokens:

    standard    odb.baselines.standard(batch_size=1)             (the paper's Standard)
    gmt / bmt   odb.baselines.global_max_tokens / bucketed_max_tokens (exact length cache)
    odb_pad     odb.core.sim.simulate(mode="pad") through the DGAP table;
                ranks read strided shards of the same shuffled data

A PAD filler is charged one forward/backward of a median-length sample; a
JOIN-finished rank costs nothing.  ODB also pays one header all-gather per round.

Each (distribution, N) cell is run for ``seeds`` independent draws of the
lengths and reported as the mean, with the standard deviation of the key
ratios (one draw of 48 samples per rank misordered neighbouring distributions
by less than the draw-to-draw spread).  The ``equal_mean`` control reruns the
grid with every draw rescaled to the same mean length (CV unchanged up to
rounding): the paper's four datasets differ in mean length as well as CV, and a
shorter mean makes batch-1 Standard relatively slower (the MFU knee), which
confounds "gain grows with CV" at small N.
"""

from __future__ import annotations

import time

import numpy as np

from odb.core.header import header_layout

from . import cluster_sim as cs

__all__ = ["GRID_QUICK", "GRID_FULL", "plan_from_schedule", "run_one", "run_seeds", "run_all", "protocol_table"]

# N = 8 and 16: the paper's single-node and two-node claims; larger N is `paper_repro.scale_grid`'s (realistic
# epochs, dealt sharding, every peer)
GRID_QUICK = {"worlds": [8, 16], "samples_per_rank": 128, "seeds": 3, "window": 256, "budget": 12288,
              "equal_mean": 1250.0}
GRID_FULL = {"worlds": [8, 16, 64], "samples_per_rank": 256, "seeds": 5, "window": 1024,
             "budget": 12288, "equal_mean": 1250.0}
# The ratios whose seed-to-seed spread is reported.
RATIOS = ("gmt_vs_standard", "bmt_vs_standard", "odb_pad_vs_standard", "odb_vs_gmt", "odb_vs_bmt")
DISTS = ["llava", "ultrachat", "mmmix", "sharegpt4o"]


def plan_from_schedule(schedule, lengths, filler_len: int) -> cs.Plan:
    """schedule[rank][step] (indices or None) -> plan[step][rank] (lengths or a filler)."""
    steps = max(len(r) for r in schedule)
    plan = []
    for s in range(steps):
        row = []
        for r in range(len(schedule)):
            b = schedule[r][s] if s < len(schedule[r]) else []
            row.append(("filler", filler_len) if b is None else [int(lengths[i]) for i in b])
        plan.append(row)
    return plan


def run_one(dist: str, world_size: int, samples_per_rank: int, window: int, budget: int, seed: int = 0,
            mean: float | None = None) -> dict:
    """One draw: every method's plan through the step model.  `mean`: rescale the drawn lengths
    to this mean (rounded, at least 1 token) before anything else; None keeps the distribution's."""
    from odb.baselines import bucketed_max_tokens, global_max_tokens, standard
    from odb.batching import default_policy, make_cost_model
    from odb.core import sim as simrank
    from odb.settings import LoaderSettings

    from . import distributions

    n = world_size * samples_per_rank
    sizes = distributions.sample_lengths(dist, n, seed=seed)
    lengths = np.array([s[0] for s in sizes])
    if mean is not None:
        lengths = np.maximum(1, np.rint(lengths * (mean / lengths.mean()))).astype(np.int64)
    order = np.random.default_rng(seed).permutation(n)  # one shuffle, shared by every method
    lengths = lengths[order]
    sizes = [(int(x),) for x in lengths]
    filler = int(np.median(lengths))
    cost = make_cost_model("padded", budget)
    out = {"dist": dist, "world_size": world_size, "samples": n, "cv": float(lengths.std() / lengths.mean())}
    plans = {"standard": plan_from_schedule(standard(n, world_size, 1), lengths, filler),
             "gmt": plan_from_schedule(global_max_tokens(sizes, cost, world_size), lengths, filler),
             "bmt": plan_from_schedule(bucketed_max_tokens(sizes, cost, world_size), lengths, filler)}
    for m, p in plans.items():
        out[m] = cs.simulate(p, world_size)
    shards = [[sizes[i] for i in range(r, n, world_size)] for r in range(world_size)]
    t0 = time.perf_counter()
    res = simrank.simulate(shards, LoaderSettings(token_budget=None, cost=cost, buffer_size=window, placement=None,
                                                              first_window=None))
    sim_s = time.perf_counter() - t0
    shard_idx = [list(range(r, n, world_size)) for r in range(world_size)]
    sched = [[None if b is None else [shard_idx[r][i] for i in b] for b in res.batches[r]] for r in range(world_size)]
    header_len = header_layout(default_policy().summary_len, window).length
    out["odb_pad"] = cs.simulate(plan_from_schedule(sched, lengths, filler), world_size,
                                 num_rounds=res.rounds, round_s=cs.odb_round_latency(cs.H20_2B, world_size, window,
                                                                                     header_len)[0])
    out["odb_pad"]["rounds"] = res.rounds
    out["odb_pad"]["simrank_s"] = sim_s
    for m in ("gmt", "bmt", "odb_pad"):
        out[f"{m}_vs_standard"] = out[m]["samples_per_s"] / out["standard"]["samples_per_s"]
    out["odb_vs_gmt"] = out["odb_pad"]["samples_per_s"] / out["gmt"]["samples_per_s"]
    out["odb_vs_bmt"] = out["odb_pad"]["samples_per_s"] / out["bmt"]["samples_per_s"]
    return out


def _mean_tree(xs: list):
    """Element-wise mean of equally shaped records (numbers averaged; other leaves from the first)."""
    x0 = xs[0]
    if isinstance(x0, dict):
        return {k: _mean_tree([x[k] for x in xs]) for k in x0}
    if isinstance(x0, (int, float)) and not isinstance(x0, bool):
        return float(np.mean(xs))
    return x0


def run_seeds(dist: str, world_size: int, samples_per_rank: int, window: int, budget: int, seeds: int,
              mean: float | None = None) -> dict:
    """`run_one` over seeds 0..seeds-1: the mean record, plus ``<ratio>_sd`` (population sd over
    seeds) and ``<ratio>_all`` for every ratio in RATIOS, and ``seeds``."""
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    runs = [run_one(dist, world_size, samples_per_rank, window, budget, seed=s, mean=mean) for s in range(seeds)]
    out = _mean_tree(runs)
    out["world_size"], out["samples"], out["seeds"] = world_size, runs[0]["samples"], seeds
    out["mean_len"] = mean
    for k in RATIOS:
        vals = [r[k] for r in runs]
        out[k + "_sd"], out[k + "_all"] = float(np.std(vals)), vals
    return out


def protocol_table(worlds, window: int) -> list[dict]:
    from odb.batching import default_policy

    return [cs.protocol_cost(n, window, header_layout(default_policy().summary_len, window).length) for n in worlds]


def run_all(full: bool = False, progress: bool = True) -> dict:
    """The grid (quick or full): ``rows`` as the distributions come, ``control`` at one equal mean length."""
    from tqdm import tqdm

    g = GRID_FULL if full else GRID_QUICK
    jobs = [(d, n, m) for m in (None, g["equal_mean"]) for n in g["worlds"] for d in DISTS]
    rows, control = [], []
    for d, n, m in tqdm(jobs, desc="cluster simulation", unit="case", disable=not progress):
        (rows if m is None else control).append(
            run_seeds(d, n, g["samples_per_rank"], g["window"], g["budget"], g["seeds"], mean=m))
    worlds = sorted(set(g["worlds"]) | {1024, 4096})
    return {"grid": g, "rows": rows, "control": control, "protocol": protocol_table(worlds, 1024),
            "model": cs.H20_2B.__dict__}
