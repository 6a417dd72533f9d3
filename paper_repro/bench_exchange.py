"""What the round exchange (``placement=odb.Exchanged()``) costs the loader on loopback gloo, beside the loader
without it.

N gloo processes on this machine each run ``passes`` rounds of passes of `odb.ODBDataLoader` over the same
long-tailed text data (samples of int64 ``input_ids`` and ``labels`` tensors, 16 to 4,096 tokens), dealt
sharding, padded cost: one pass without the exchange, one with it and, with ``--slack``, one with budget
balance (``Exchanged(slack=...)``), in turn, so that all see the same load on the machine.  The consumer only
reads each batch's padded cost (its collate computes nothing else): the figures are the loader's own.  Per
pass and rank: wall time, time in the header collectives, time in the exchange's transfers, batches sent and
received, bytes moved, and two straggler figures, what the moves bought: the loader's own estimate (every
rank's tokens per step over the largest rank's, `odb.core.info.LoaderStats.token_balance`) and the budget
cost's (sum over steps of the mean rank's padded cost over the largest rank's, fillers 0: the grid's
``straggler_eff``).  Printed and written as JSON (with the provenance stamp).

Not a test and no target: the exchange's gain is in the step-time model (`paper_repro.scale_grid`); this
measures its price in the code that runs.  Loopback gloo on 2 cores oversubscribed by N processes: an upper
bound of the local cost, not a network's.

    python -m paper_repro.bench_exchange [--world 4] [--window 128] [--passes 3] [--slack BP] [OUT_JSON]
    python -m paper_repro.bench_exchange --plan [OUT_JSON]

``--plan`` (`plan_cpu`): the CPU time of one round's plan as each rank computes it, beside the loader's
collective: the calls the rank core makes after the collect (`odb.batching.exchange.rank_fill_array`,
`plan_origins`, `runs_on`), at N = 64 to 1,024 ranks in pools of 8 and 16 to 293 steps a round (the grid's
exchange rows run 7 to 34 steps a round at W = 256 and 87 to 293 at W = 2,048 and N = 1,024), without and with
budget balance.  The fills are random keys of the header's shape, not a run's: the plan sorts them, and a
run's fills are no more ordered across ranks.  Process CPU time, the best of `reps`: the 2-core machine's
other load aside.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import tempfile
import time
from datetime import timedelta

__all__ = ["measure", "plan_cpu"]


class _Text:
    """Sample i: ``input_ids`` and ``labels``, int64 tensors of a long-tailed length."""

    def __init__(self, n: int, seed: int):
        rng = random.Random(seed)
        self.lengths = [max(16, min(4096, int(rng.lognormvariate(5.5, 0.9)))) for _ in range(n)]

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        import torch

        ids = torch.arange(self.lengths[i], dtype=torch.int64)
        return {"input_ids": ids, "labels": ids.clone()}


def _cost(samples):
    """The batch's padded cost, nothing collated."""
    return {"cost": len(samples) * max(len(s["input_ids"]) for s in samples)}


def _modes(slack: int) -> list[tuple[str, dict]]:
    """The passes of one round: (name, the loader's exchange settings)."""
    from odb.core.placement import Exchanged

    out = [("plain", {"placement": None}), ("exchange", {"placement": Exchanged()})]
    return out + [("balanced", {"placement": Exchanged(slack=slack / 10_000)})] if slack else out


def _rank(rank: int, world: int, store: str, out: str, spec: dict) -> None:
    import torch
    import torch.distributed as dist

    import odb

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    data = _Text(spec["samples"], 0)
    runs, modes = [], _modes(spec["slack"])
    for k in range(len(modes) * spec["passes"]):
        mode, settings = modes[k % len(modes)]
        loader = odb.ODBDataLoader(data, spec["budget"], _cost, buffer_size=spec["window"], sharding="dealt",
                                   timeout_s=120, seed=k // len(modes), first_window=None, **settings)
        t0 = time.perf_counter()
        costs = [0 if odb.pop_step_info(b).filler else b["cost"] for b in loader]
        wall = time.perf_counter() - t0
        st = loader.stats
        runs.append({"mode": mode, "steps": len(costs), "costs": costs, "wall_s": wall,
                     "collective_s": st.collective_s,
                     "exchange_s": st.exchange_s, "sent": st.exchange_sent, "received": st.exchange_received,
                     "bytes": st.exchange_bytes, "rounds": st.rounds, "samples": st.samples,
                     "straggler_tokens": st.token_balance()})
        loader.close()
    with open(out, "w") as f:
        json.dump(runs, f)
    dist.barrier()
    dist.destroy_process_group()


def measure(world: int = 4, window: int = 128, budget: int = 8192, samples_per_rank: int | None = None,
            passes: int = 3, slack: int = 0) -> dict:
    """Run the side-by-side passes (module docstring; `slack`: budget balance's, basis points, 0: not run) and
    return every rank's figures and their summary."""
    spec = {"window": window, "budget": budget, "passes": passes, "slack": slack,
            "samples": world * (samples_per_rank or 8 * window)}
    ctx = mp.get_context("fork")
    env = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = os.path.join(tmp, "store")
            outs = [os.path.join(tmp, f"r{r}.json") for r in range(world)]
            procs = [ctx.Process(target=_rank, args=(r, world, store, outs[r], spec)) for r in range(world)]
            for p in procs:
                p.start()
            deadline = time.monotonic() + 900
            for p in procs:
                p.join(max(1.0, deadline - time.monotonic()))
            for p in procs:
                if p.is_alive():
                    p.kill()  # our own child only
                    p.join(5)
            missing = [r for r in range(world) if not os.path.exists(outs[r])]
            if missing:
                raise RuntimeError(f"bench_exchange: ranks {missing} wrote no figures (exit codes "
                                   f"{[procs[r].exitcode for r in missing]})")
            ranks = [json.load(open(o)) for o in outs]
    finally:
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env
    summary = {}
    for mode, _ in _modes(slack):
        ks = [k for k in range(len(ranks[0])) if ranks[0][k]["mode"] == mode]
        walls = [max(r[k]["wall_s"] for r in ranks) for k in ks]
        per = [r[k] for r in ranks for k in ks]
        steps = [r[k]["steps"] for r in ranks for k in ks]
        if any(len(set(r[k]["steps"] for r in ranks)) != 1 for k in ks):
            raise RuntimeError(f"bench_exchange: the ranks ran different numbers of steps in a {mode} pass")
        budget_eff = [sum(sum(c) / world for c in zip(*(r[k]["costs"] for r in ranks)))
                      / sum(max(c) for c in zip(*(r[k]["costs"] for r in ranks))) for k in ks]
        summary[mode] = {
            "pass_wall_s_median": statistics.median(walls), "pass_wall_s_each": [round(w, 3) for w in walls],
            "steps_per_pass": sorted(set(steps)), "rounds_per_pass": sorted({p["rounds"] for p in per}),
            "collective_s_mean": statistics.fmean(p["collective_s"] for p in per),
            "exchange_s_mean": statistics.fmean(p["exchange_s"] for p in per),
            "batches_moved_per_pass": sum(p["sent"] for p in per) / passes,
            "batches_per_pass": sum(p["steps"] for p in per) / passes,
            "mb_per_rank_per_pass": statistics.fmean(p["bytes"] for p in per) / 2 / 1e6,
            "samples_per_pass": sum(p["samples"] for p in per) / passes,
            "straggler_tokens_mean": statistics.fmean(p["straggler_tokens"] for p in per),
            "straggler_budget_mean": statistics.fmean(budget_eff)}
    for mode, _ in _modes(slack)[1:]:  # each exchange mode against the loader without it
        x = summary[mode]
        x["wall_ratio"] = x["pass_wall_s_median"] / summary["plain"]["pass_wall_s_median"]
        x["moved_fraction"] = x["batches_moved_per_pass"] / x["batches_per_pass"]
    for r in ranks:  # the per-step costs are in the summary's figure; the JSON keeps their count
        for run in r:
            run.pop("costs")
    return {"world": world, "window": window, "budget": budget, "samples": spec["samples"], "passes": passes,
            "summary": summary, "ranks": ranks}


def plan_cpu(worlds=(64, 256, 1024), steps=(16, 34, 130, 293), slacks=(0, 125), pool: int = 8, reps: int = 5,
             seed: int = 0) -> list[dict]:
    """``--plan`` (module docstring): for each N, S and slack, ``cpu_ms`` (best of `reps`) and ``median_ms``."""
    import numpy as np

    from odb.batching.exchange import KEY_SHIFT, plan_origins, rank_fill_array, runs_on

    rng, out = random.Random(seed), []
    for world in worlds:
        for S in steps:
            for slack in slacks:
                T, P = S * pool, world // pool
                fill = [[rng.randrange(500_000, 1_000_000) for _ in range(T)] for _ in range(P)]
                fills = [[f * KEY_SHIFT + rng.randrange(0, f) for f in row] for row in fill] if slack else fill
                arr = np.array(fills, dtype=np.int64)
                ts = []
                for _ in range(reps):
                    t0 = time.process_time()
                    runs_on(plan_origins(rank_fill_array(arr, pool, T), slack))
                    ts.append(1e3 * (time.process_time() - t0))
                out.append({"world": world, "steps": S, "slack": slack, "pool": pool, "batches": world * S,
                            "cpu_ms": min(ts), "median_ms": statistics.median(ts)})
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--slack", type=int, default=0, help="basis points: budget balance's passes too (0: none)")
    ap.add_argument("--plan", action="store_true", help="the plan's CPU time a round instead (`plan_cpu`)")
    ap.add_argument("out", nargs="?", default=None)
    a = ap.parse_args(argv)
    from .provenance import stamp

    prov = stamp()  # the code that runs, taken before it runs
    if a.plan:
        fig = {"provenance": prov, "rows": plan_cpu(), "date": time.strftime("%Y-%m-%d")}
        lines = [f"N={r['world']:>5} S={r['steps']:>4} slack={r['slack']:>4}: {r['batches']:>7} batches, "
                 f"{r['cpu_ms']:8.2f} ms CPU (median {r['median_ms']:.2f})" for r in fig["rows"]]
    else:
        fig = measure(a.world, a.window, passes=a.passes, slack=a.slack)
        fig["provenance"] = prov
        s = fig["summary"]
        lines = [f"{name:>8}: pass {x['pass_wall_s_median']:.2f} s (each {x['pass_wall_s_each']}), steps "
                 f"{x['steps_per_pass']}, rounds {x['rounds_per_pass']}, collectives {x['collective_s_mean']:.2f} "
                 f"s, transfers {x['exchange_s_mean']:.2f} s per rank; {x['batches_moved_per_pass']:.0f} of "
                 f"{x['batches_per_pass']:.0f} batches moved, {x['mb_per_rank_per_pass']:.2f} MB sent per rank; "
                 f"token straggler efficiency {x['straggler_tokens_mean']:.3f}, budget cost's "
                 f"{x['straggler_budget_mean']:.3f}" for name, x in ((m, s[m]) for m, _ in _modes(a.slack))]
        lines += [f"N={fig['world']} W={fig['window']}: {name}/plain pass time {s[name]['wall_ratio']:.3f}, "
                  f"{100 * s[name]['moved_fraction']:.1f}% of the batches moved" for name, _ in _modes(a.slack)[1:]]
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(fig, f, indent=1)
    return fig


if __name__ == "__main__":
    main()
