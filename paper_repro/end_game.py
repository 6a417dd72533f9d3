"""Where ODB's default loses balance: the rounds while data flows against the epoch's end game.

    python -m paper_repro.end_game [--points dist,N,W,per_rank ...] [--out RESULTS_DIR]

Each point runs the shipped rank core (`odb.core.sim.simulate`: dealt sharding, the default policy, PAD mode,
padded cost, budget `BUDGET`, the scale grid's lengths `paper_repro.bench_grid.point`) and reads every round's
gathered summaries (``on_round``) to tell the two kinds of round apart.

Legend
    c_rk        rank r's batch cost at step k, in budgets (`CostModel.utilisation`; 0 for a filler)
    loss        the straggler loss, sum over steps of ``max_r c_rk - mean_r c_rk``
    straggler   ``sum_k mean_r c_rk / sum_k max_r c_rk``: the scale grid's ``straggler_eff`` (budget cost),
                checked equal to `paper_repro.bench_metrics.metrics` on the same batches
    end game    the rounds in which some rank with data posts that its source has ended (the policy's
                rule 1 and the epoch's last, flushing round); ``flowing``: every other round
    R_r         rank r's cost over the end game's steps; ``R_rj`` the same over end-game round j

Two bounds on what a better end game could give, the flowing rounds kept as they are and no sample moved
between ranks:

* ``per_round``: in every end-game round each rank's batches of equal cost, the same samples per rank and
  round (a partition rule alone).  A round's loss is at least ``max_r R_rj - mean_r R_rj``, since the sum over
  its steps of the max is at least the max over ranks of the sum.
* ``joint``: the whole end game one partition of each rank's end-game samples into equal-cost batches over
  common steps, its loss at least ``max_r R_r - mean_r R_r``.  Reaching it needs each rank to know its
  end-game samples when the end game starts; part of them are not yet dealt then, so it bounds every end game
  that moves no sample.

Each is reported as the straggler efficiency the point would have with the end game's loss at that bound.
``joint >= per_round`` always.  Both are bounds for the same split of the work between the flowing rounds
and the end game: a policy that changed the split changes R.  Neither counts that batches are not divisible.

Two PROTOTYPES, measured (straggler efficiency, and predicted throughput over sorted GMT's by the scale grid's
step-time model, `paper_repro.scale_grid._predicted`, ODB's round collectives charged as there):

* ``equal`` (`equal_end_game`): each rank's samples of each end-game round re-cut into the round's steps, the
  costliest batch as cheap as it can be: a partition rule alone, aiming at the ``per_round`` bound;
* ``flow`` (`flow_until_all`): another rule 1 for the rounds in which some rank has run dry, its own run.

Writes ``end_game_<yyyymm>.{json,md}`` (provenance-stamped) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

BUDGET = 8192
# (dist, N, W, samples per rank): the default's window and the smallest, at 64 to 1,024 ranks
POINTS = tuple((d, 64, 1024, 8192) for d in ("llava", "ultrachat", "mmmix", "sharegpt4o", "release")) + tuple(
    (d, 64, 256, 2048) for d in ("llava", "ultrachat", "mmmix", "sharegpt4o", "release")) + (
    ("sharegpt4o", 256, 1024, 8192), ("release", 256, 1024, 8192),
    ("sharegpt4o", 1024, 256, 2048), ("release", 1024, 256, 2048))


def flow_until_all():
    """PROTOTYPE, not what ships: the default policy but for its rule 1 while some, not every, rank with data
    has an ended source: such a round is decided as one while data flows (the exhausted ranks' closed groups
    count in the need, the reservoir halves it, the profile binds), so the first rank to run dry no longer
    makes every rank emit nearly its whole window at once; once every rank with data has run dry, the
    flush (rule 1) as before.  It reads the gathered summaries only (a replicated decision).  The partition
    is the default's: at the epoch end it fills open slots costliest first."""
    from odb.batching.policy import BalancedPolicy, _as_array

    class FlowUntilAll(BalancedPolicy):
        def propose(self, summaries, window):
            a = _as_array(summaries, self.summary_len)
            ex = a[a[:, 1] > 0, 2]
            if ex.any() and not ex.all():
                a = a.copy()
                a[:, 2] = 0  # a copy: the memo (`_same`) then keeps the partition on the round's own summaries
            return super().propose(a, window)

    return FlowUntilAll()


def where_lost(dist: str, world: int, window: int, per_rank: int, budget: int = BUDGET, kind: str = "padded",
               seed: int = 0, predict: bool = True, policy=None) -> dict:
    """One point's figures (module docstring); `predict`: the prototype and the step-time model's too;
    `policy`: a factory of the alignment policy to run (None: the default; its summary must open as the
    default's, ``[tag, n, exhausted, ...]``)."""
    from odb.batching import default_policy
    from odb.core.header import reduce_posts
    from odb.core.sim import simulate
    from odb.runtime.engine import header_layout

    from .bench_grid import _exactly_once, point
    from .bench_metrics import metrics

    pt = point(dist, world, budget, kind, per_rank, seed)
    layout = header_layout((policy or default_policy)().summary_len, window)
    ending: list[bool] = []  # per round: some rank with data has an ended source

    def on_round(k, posts):
        s = layout.decode_all(np.asarray(reduce_posts(posts).rows, dtype=np.int64)).summary_array
        live = s[:, 1] > 0  # the default policy's summary: [tag, n, exhausted, ...]
        ending.append(bool((s[live, 2] != 0).any()) if live.any() else True)

    t0 = time.perf_counter()
    sim = simulate([[] for _ in range(world)], pt.cost, window=window, mode="pad", deal=pt.sizes, on_round=on_round,
                   policy=policy)
    _exactly_once(sim.batches, len(pt.sizes), f"end game {dist} N={world} W={window}")
    steps = max(map(len, sim.batches))
    c = np.zeros((world, steps))
    for r, row in enumerate(sim.batches):
        for k, b in enumerate(row):
            if b:
                c[r, k] = pt.cost.utilisation([pt.sizes[i] for i in b])
    check = metrics(sim.batches, pt.sizes, pt.cost)["straggler_eff"]
    out = {"dist": dist, "world": world, "window": window, "per_rank": per_rank, "budget": budget, "cost": kind,
           **split_loss(c, sim.targets, ending), "sim_s": time.perf_counter() - t0}
    if abs(check - out["straggler"]) > 1e-9:
        raise RuntimeError(f"straggler {out['straggler']} here, {check} by bench_metrics: the steps are read otherwise")
    if not predict:
        return out
    if kind != "padded":
        raise ValueError("the equal end game prototype cuts padded batches only")
    # the prototype, and both schedules through the scale grid's step-time model beside sorted GMT's
    from odb.batching import default_policy as dp

    from . import cluster_sim as cs
    from .bench_grid import schedules
    from .scale_grid import _plan, _predicted

    eq = equal_end_game(sim.batches, pt.sizes, budget, dp().attention, sim.targets, ending)
    _exactly_once(eq, len(pt.sizes), f"equal end game {dist} N={world} W={window}")
    gmt = schedules(pt, world, window, ["gmt"])["gmt"][0]
    filler = sorted(s[0] for s in pt.sizes)[len(pt.sizes) // 2]  # as the scale grid's PAD filler
    r_s = cs.odb_round_latency(cs.H20_2B, world, window, layout.length)[0]
    sps = {name: _predicted(_plan(rows, pt.sizes, world, filler), world, "pad", r_s if name != "gmt" else 0.0,
                            sim.rounds if name != "gmt" else 0, 1)["samples_per_s"]
           for name, rows in (("gmt", gmt), ("now", sim.batches), ("equal", eq))}
    out.update(throughput_vs_gmt=sps["now"] / sps["gmt"], equal_throughput_vs_gmt=sps["equal"] / sps["gmt"],
               equal_straggler=metrics(eq, pt.sizes, pt.cost)["straggler_eff"])
    if policy is None:  # the second prototype: another rule 1, its own run of the same lengths
        fl = simulate([[] for _ in range(world)], pt.cost, window=window, mode="pad", deal=pt.sizes,
                      policy=flow_until_all)
        _exactly_once(fl.batches, len(pt.sizes), f"flow until all {dist} N={world} W={window}")
        out.update(flow_straggler=metrics(fl.batches, pt.sizes, pt.cost)["straggler_eff"], flow_throughput_vs_gmt=_predicted(
            _plan(fl.batches, pt.sizes, world, filler), world, "pad", r_s, fl.rounds, 1)["samples_per_s"] / sps["gmt"])
    out["point_s"] = time.perf_counter() - t0
    return out


def equal_groups(lengths: list[tuple[int, int]], T: int, budget: int, a: float) -> list[list[int]]:
    """At most `T` groups of ``lengths`` ((tokens, index) pairs) under a padded `budget`, the costliest as cheap
    as it can be: sorted by length, cut into runs whose weight ``n Lmax (1 + a Lmax)`` stays under a bound C,
    the least C (bisection) that needs no more than T runs; then the costliest run of two or more halved until
    there are T (or none is left to halve).  Costliest first."""
    L = sorted(lengths, reverse=True)
    if not L:
        return []
    w_of = lambda t: t * (1 + a * t)  # noqa: E731  (the default policy's aligned weight of one padded row)
    w = [w_of(x[0]) for x in L]

    def cut(C: float) -> list[tuple[int, int]]:
        runs, i = [], 0
        while i < len(L):
            take = max(1, min(budget // L[i][0], int(C / w[i]) if w[i] else len(L)))
            runs.append((i, min(len(L), i + take)))
            i += take
        return runs

    lo, hi = max(w) * (1 - 1e-12), len(w) * max(w) + 1.0  # hi: every run as long as the budget allows
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if len(cut(mid)) <= T else (mid, hi)
    runs = cut(hi)
    if len(runs) > T:
        raise RuntimeError(f"{len(L)} samples need {len(runs)} batches within the budget, {T} steps given")
    length = {i: t for t, i in L}
    weight = lambda g: len(g) * w_of(length[g[0]])  # noqa: E731  (a run is sorted: g[0] is its longest)
    groups = [[x[1] for x in L[i:j]] for i, j in runs]
    while len(groups) < T:
        k = max((k for k in range(len(groups)) if len(groups[k]) > 1), key=lambda k: weight(groups[k]), default=None)
        if k is None:
            break
        g = groups.pop(k)
        groups += [g[:(len(g) + 1) // 2], g[(len(g) + 1) // 2:]]
    return sorted(groups, key=weight, reverse=True)


def equal_end_game(rows, sizes, budget: int, a: float, targets: list[int], ending: list[bool]) -> list[list]:
    """PROTOTYPE, not what ships: ODB's batches (``rows[rank][step]``, PAD mode) with each end-game round's
    samples of each rank re-cut into that round's steps by `equal_groups` (no sample leaves its rank or its
    round; fillers where a rank has fewer samples than steps).  A partition rule alone would do it: a rank
    knows the samples it emits in a round when it partitions them."""
    steps = max(map(len, rows))
    out = [list(r) + [None] * (steps - len(r)) for r in rows]
    s0 = 0
    for t, e in zip(targets, ending):
        a0, b0 = s0, min(steps, s0 + t)
        s0 += t
        if not e or a0 >= b0:
            continue
        for r in range(len(rows)):
            mine = [(sizes[i][0], i) for b in out[r][a0:b0] if b for i in b]
            gs = equal_groups(mine, b0 - a0, budget, a)
            out[r][a0:b0] = gs + [None] * (b0 - a0 - len(gs))
    return out


def split_loss(c: np.ndarray, targets: list[int], ending: list[bool]) -> dict:
    """The figures of the module docstring from ``c[r, k]`` (each rank's batch cost at step k, in budgets),
    each round's target (PAD mode: round j is ``targets[j]`` steps on every rank; the last may be cut short)
    and whether each round is in the end game."""
    steps = c.shape[1]
    if sum(targets) < steps or len(ending) != len(targets):
        raise ValueError(f"{sum(targets)} steps in {len(targets)} rounds, {steps} released, {len(ending)} rounds seen")
    rnd = np.repeat(np.arange(len(targets)), targets)[:steps]
    end = np.asarray(ending, dtype=bool)[rnd]
    mx, mean = c.max(axis=0), c.mean(axis=0)
    loss = mx - mean
    per_round = 0.0
    for j in np.unique(rnd[end]):
        tot = c[:, rnd == j].sum(axis=1)
        per_round += tot.max() - tot.mean()
    R = c[:, end].sum(axis=1)
    flowing, base, tot = loss[~end].sum(), mean.sum(), c.sum(axis=1)
    return {"steps": int(steps), "rounds": len(targets), "end_rounds": int(len(np.unique(rnd[end]))),
            "end_steps": int(end.sum()), "straggler": float(base / mx.sum()), "ceiling": float(tot.mean() / tot.max()),
            "loss": float(loss.sum()), "end_loss": float(loss[end].sum()),
            "flowing_straggler": float(mean[~end].sum() / mx[~end].sum()) if (~end).any() else 1.0,
            "end_straggler": float(mean[end].sum() / mx[end].sum()) if end.any() else 1.0,
            "per_round": float(base / (base + flowing + per_round)),
            "joint": float(base / (base + flowing + R.max() - R.mean()))}


def render(rows: list[dict]) -> str:
    head = ("| point (samples per rank) | steps in the end game | share of the loss there | straggler now "
            "| while data flows | in the end game | bound: per round | bound: joint | re-cut prototype "
            "| flow-until-all prototype | throughput vs GMT: now, re-cut, flow-until-all |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = [f"| {r['dist']}, N = {r['world']:,}, W = {r['window']:,} ({r['per_rank']:,}) "
             f"| {r['end_steps']} of {r['steps']} ({r['end_rounds']} of {r['rounds']} rounds) "
             f"| {r['end_loss'] / r['loss']:.0%} | {r['straggler']:.3f} | {r['flowing_straggler']:.3f} "
             f"| {r['end_straggler']:.3f} | {r['per_round']:.3f} | {r['joint']:.3f} | {r['equal_straggler']:.3f} "
             f"| {r['flow_straggler']:.3f} | {r['throughput_vs_gmt']:.3f}, {r['equal_throughput_vs_gmt']:.3f}, "
             f"{r['flow_throughput_vs_gmt']:.3f} |" for r in rows]
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from .provenance import RESULTS
    from .scale_grid import stamp

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", nargs="*", default=None, help="dist,N,W,per_rank (default: POINTS)")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    points = POINTS if a.points is None else [
        (p.split(",")[0], *map(int, p.split(",")[1:4])) for p in a.points]
    rows = []
    for d, n, w, per in points:
        rows.append(where_lost(d, n, w, per))
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in rows[-1].items()}), flush=True)
    tag = time.strftime("%Y%m")
    out = Path(a.out)
    cmd = "python -m paper_repro.end_game" + ("" if a.points is None else " --points " + " ".join(a.points))
    (out / f"end_game_{tag}.json").write_text(json.dumps({"rows": rows, "provenance": stamp(), "command": cmd},
                                                         indent=1))
    text = (f"# Where ODB's default loses balance: rounds while data flows, and the end game\n\nCommand: `{cmd}`; "
            f"{time.strftime('%Y-%m-%d')}; padded cost, budget {BUDGET:,}, dealt, the default policy (the module "
            "docstring defines every column).\n\n" + render(rows))
    (out / f"end_game_{tag}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
