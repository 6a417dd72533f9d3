"""How much of ODB's lost balance falls at the epoch's end, and what a better end game could win at most (the
figures of ``docs/decisions/2026-12-02-epoch-end-flush.md`` and ``docs/decisions/2026-12-03-end-game.md``).

    python -m paper_repro.epoch_end [dist:N:W:per_rank[:cost] ...]   (one line per point)
    python -m paper_repro.epoch_end --report [dist:N:W:per_rank ...]  (`REPORT_POINTS` by default: the bounds
        and both prototypes below, through the step-time model; writes ``epoch_end_<yyyymm>.{json,md}``)

Legend
    c_rk        rank r's batch cost at step k, in budgets (`CostModel.utilisation`; 0 for a filler)
    lost        the sum over steps of ``max_r c_rk - mean_r c_rk``: what straggler efficiency misses
                (`bench_metrics.metrics`: ``lost = step_time * (1 - straggler_eff)``)
    epoch end   every step from the first round in which some rank with data posts that its source is
                exhausted (the policy summary's flag, read from the posted headers); the rounds before: ``flowing``
    straggler   ``sum_k mean_r c_rk / sum_k max_r c_rk`` (the scale grid's ``straggler_eff``, budget cost), of
                the whole epoch, of the flowing rounds and of the epoch end
    R_r, R_rj   rank r's cost over the epoch end's steps, and over its round j

ODB runs as it ships (`odb.core.sim`, dealt sharding, the default policy, PAD), on the scale grid's lengths
(`paper_repro.bench_grid.point`), budget 8,192.

Two bounds on what a better end game could give, the flowing rounds kept as they are and no sample moved
between ranks (each reported as the straggler efficiency with the epoch end's loss at the bound):

* ``per_round``: in every round of the epoch end each rank's batches of equal cost, the same samples per rank
  and round (a partition rule alone).  A round's loss is at least ``max_r R_rj - mean_r R_rj``: the sum over
  its steps of the max is at least the max over ranks of the sum;
* ``joint``: the whole epoch end one partition of each rank's samples there into equal-cost batches over common
  steps: a loss of at least ``max_r R_r - mean_r R_r``.  Reaching it needs each rank to know those samples when
  the end begins; part of them are not dealt yet, so it bounds every end game that moves no sample.

``joint >= per_round`` always.  Both hold for the same split of the work between the flowing rounds and the
end (a rule that changes the split changes R), and neither counts that batches are not divisible.

Two PROTOTYPES (not what ships), with ``--report`` measured by straggler efficiency and by predicted throughput
over sorted GMT's (the scale grid's step-time model, `paper_repro.scale_grid._predicted`, ODB's round
collectives charged as there):

* ``equal`` (`equal_end_game`): each rank's samples of each end round re-cut into the round's steps, the
  costliest batch as cheap as it can be: a partition rule alone, aiming at ``per_round``;
* ``flow`` (`flow_until_all`): another rule 1 for the rounds in which some, not every, rank has run dry; its
  own run of the same lengths.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

__all__ = ["epoch_end", "split_loss", "equal_groups", "equal_end_game", "flow_until_all", "render", "main"]

DEFAULT_POINTS = ("sharegpt4o:64:256:2048", "release:64:256:2048", "mmmix:64:256:2048", "llava:64:256:2048",
                  "sharegpt4o:256:256:2048")
# --report: the default's window and the smallest, at 64 to 1,024 ranks (8 W samples per rank)
REPORT_POINTS = tuple(f"{d}:64:{w}:{8 * w}" for w in (1024, 256)
                      for d in ("llava", "ultrachat", "mmmix", "sharegpt4o", "release")) + (
    "sharegpt4o:256:1024:8192", "release:256:1024:8192", "sharegpt4o:1024:256:2048", "release:1024:256:2048")


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


def epoch_end(dist: str, world: int, window: int, per_rank: int, kind: str = "padded", budget: int = 8192,
              seed: int = 0, report: bool = False) -> dict:
    """ODB's schedule on one point and where its lost balance falls (module docstring); `report`: the two
    prototypes and the step-time model's figures too (padded cost only)."""
    from odb import LoaderSettings
    from odb.batching import default_policy
    from odb.core.header import header_layout
    from odb.core.sim import simulate

    from .bench_grid import _exactly_once, point
    from .bench_metrics import metrics

    t0 = time.perf_counter()
    pt = point(dist, world, budget, kind, per_rank, seed)
    layout = header_layout(default_policy().summary_len, window)
    first: list[int] = []

    def on_round(rnd, posts):
        if not first:
            heads = [layout.decode(p.header) for p in posts]
            if any(h.n > 0 and h.summary[2] for h in heads):  # BalancedPolicy's summary: [tag, n, exhausted, ...]
                first.append(rnd)
        return False

    sim = simulate([[] for _ in range(world)], LoaderSettings(token_budget=None, cost=pt.cost, buffer_size=window,
                                                             placement=None, first_window=None),
                   deal=pt.sizes, on_round=on_round)
    _exactly_once(sim.batches, len(pt.sizes), f"epoch end {dist} N={world} W={window}")
    m = metrics(sim.batches, pt.sizes, pt.cost)

    def lost(m) -> float:  # sum over steps of max - mean: the metrics' step time less their mean rank's
        return m["step_time"] * (1.0 - m["straggler_eff"])

    steps = max(len(r) for r in sim.batches)
    end_round = first[0] if first else sim.rounds
    start = sum(sim.targets[:end_round]) if first else steps
    c = np.zeros((world, steps))
    for r, row in enumerate(sim.batches):
        for k, b in enumerate(row):
            if b:
                c[r, k] = pt.cost.utilisation([pt.sizes[i] for i in b])
    out = {"dist": dist, "world": world, "window": window, "per_rank": per_rank, "cost": kind, "steps": steps,
           "rounds": sim.rounds, "end_round": end_round, "end_step": start,
           "lost": lost(m), "lost_at_end": lost(metrics([r[start:] for r in sim.batches], pt.sizes, pt.cost)),
           **split_loss(c, sim.targets, end_round), "sim_s": time.perf_counter() - t0}
    if abs(out["straggler"] - m["straggler_eff"]) > 1e-9:
        raise RuntimeError(f"straggler {out['straggler']} here, {m['straggler_eff']} by bench_metrics")
    if not report:
        return out
    if kind != "padded":
        raise ValueError("the end-game prototypes cut padded batches only")
    from . import cluster_sim as cs
    from .bench_grid import schedules
    from .scale_grid import _plan, _predicted

    eq = equal_end_game(sim.batches, pt.sizes, budget, default_policy().attention, sim.targets, end_round)
    _exactly_once(eq, len(pt.sizes), f"equal end game {dist} N={world} W={window}")
    gmt = schedules(pt, world, window, ["gmt"])["gmt"][0]
    filler = sorted(s[0] for s in pt.sizes)[len(pt.sizes) // 2]  # as the scale grid's PAD filler
    r_s = cs.odb_round_latency(cs.H20_2B, world, window, layout.length)[0]

    def sps(rows, rounds):
        return _predicted(_plan(rows, pt.sizes, world, filler), world, "pad", r_s, rounds, 1)["samples_per_s"]

    g = _predicted(_plan(gmt, pt.sizes, world, filler), world, "pad", 0.0, 0, 1)["samples_per_s"]
    out.update(throughput_vs_gmt=sps(sim.batches, sim.rounds) / g, equal_throughput_vs_gmt=sps(eq, sim.rounds) / g,
               equal_straggler=metrics(eq, pt.sizes, pt.cost)["straggler_eff"])
    # the second prototype: another rule 1, its own run of the same lengths
    fl = simulate([[] for _ in range(world)], LoaderSettings(token_budget=None, cost=pt.cost, buffer_size=window,
                                                             policy=flow_until_all(), placement=None,
                                                             first_window=None),
               deal=pt.sizes)
    _exactly_once(fl.batches, len(pt.sizes), f"flow until all {dist} N={world} W={window}")
    out.update(flow_straggler=metrics(fl.batches, pt.sizes, pt.cost)["straggler_eff"],
               flow_throughput_vs_gmt=sps(fl.batches, fl.rounds) / g)
    out["point_s"] = time.perf_counter() - t0
    return out


def split_loss(c: np.ndarray, targets: list[int], end_round: int) -> dict:
    """The figures of the module docstring from ``c[r, k]`` (each rank's batch cost at step k, in budgets), each
    round's target (PAD mode: round j is ``targets[j]`` steps on every rank; the last may be cut short) and the
    epoch end's first round."""
    steps = c.shape[1]
    if sum(targets) < steps or not 0 <= end_round <= len(targets):
        raise ValueError(f"{sum(targets)} steps in {len(targets)} rounds, {steps} released, the end from {end_round}")
    rnd = np.repeat(np.arange(len(targets)), targets)[:steps]
    end = rnd >= end_round
    mx, mean = c.max(axis=0), c.mean(axis=0)
    loss = mx - mean
    per_round = 0.0
    for j in np.unique(rnd[end]):
        tot = c[:, rnd == j].sum(axis=1)
        per_round += tot.max() - tot.mean()
    R = c[:, end].sum(axis=1)
    flowing, base, tot = loss[~end].sum(), mean.sum(), c.sum(axis=1)
    return {"end_rounds": int(len(np.unique(rnd[end]))), "straggler": float(base / mx.sum()),
            "ceiling": float(tot.mean() / tot.max()),
            "flowing_straggler": float(mean[~end].sum() / mx[~end].sum()) if (~end).any() else 1.0,
            "end_straggler": float(mean[end].sum() / mx[end].sum()) if end.any() else 1.0,
            "per_round": float(base / (base + flowing + per_round)),
            "joint": float(base / (base + flowing + R.max() - R.mean()))}


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


def equal_end_game(rows, sizes, budget: int, a: float, targets: list[int], end_round: int) -> list[list]:
    """PROTOTYPE, not what ships: ODB's batches (``rows[rank][step]``, PAD mode) with each rank's samples of each
    round from `end_round` on re-cut into that round's steps by `equal_groups` (no sample leaves its rank or its
    round; fillers where a rank has fewer samples than steps).  A partition rule alone would do it: a rank
    knows the samples it emits in a round when it partitions them."""
    steps = max(map(len, rows))
    out = [list(r) + [None] * (steps - len(r)) for r in rows]
    s0 = 0
    for j, t in enumerate(targets):
        a0, b0 = s0, min(steps, s0 + t)
        s0 += t
        if j < end_round or a0 >= b0:
            continue
        for r in range(len(rows)):
            mine = [(sizes[i][0], i) for b in out[r][a0:b0] if b for i in b]
            gs = equal_groups(mine, b0 - a0, budget, a)
            out[r][a0:b0] = gs + [None] * (b0 - a0 - len(gs))
    return out


def render(rows: list[dict]) -> str:
    """The ``--report`` table (markdown)."""
    head = ("| point (samples per rank) | steps at the epoch end | its share of the lost balance | straggler now "
            "| while data flows | at the end | bound: per round | bound: joint | `equal` | `flow` "
            "| predicted throughput / GMT's: now, `equal`, `flow` |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    return head + "\n".join(
        f"| {r['dist']}, N = {r['world']:,}, W = {r['window']:,} ({r['per_rank']:,}) "
        f"| {r['steps'] - r['end_step']} of {r['steps']} ({r['end_rounds']} of {r['rounds']} rounds) "
        f"| {r['lost_at_end'] / r['lost']:.0%} | {r['straggler']:.3f} | {r['flowing_straggler']:.3f} "
        f"| {r['end_straggler']:.3f} | {r['per_round']:.3f} | {r['joint']:.3f} | {r['equal_straggler']:.3f} "
        f"| {r['flow_straggler']:.3f} | {r['throughput_vs_gmt']:.3f}, {r['equal_throughput_vs_gmt']:.3f}, "
        f"{r['flow_throughput_vs_gmt']:.3f} |" for r in rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    report = "--report" in args
    pts = [a for a in args if a != "--report"] or (REPORT_POINTS if report else DEFAULT_POINTS)
    rows = []
    for p in pts:
        f = p.split(":")
        r = epoch_end(f[0], int(f[1]), int(f[2]), int(f[3]), *(f[4:5]), report=report)
        rows.append(r)
        share = r["lost_at_end"] / r["lost"] if r["lost"] else 0.0
        print(f"{p}: lost {r['lost']:.1f}, at the epoch end {r['lost_at_end']:.1f} ({share:.0%}) over steps "
              f"{r['end_step']}-{r['steps']} of {r['steps']}; the end from round {r['end_round']} of {r['rounds']}; "
              f"straggler {r['straggler']:.3f} (flowing {r['flowing_straggler']:.3f}, at the end "
              f"{r['end_straggler']:.3f}; bounds {r['per_round']:.3f} per round, {r['joint']:.3f} joint)", flush=True)
    if report:
        from .provenance import RESULTS
        from .scale_grid import stamp

        cmd = "python -m paper_repro.epoch_end --report" + "".join(" " + p for p in args if p != "--report")
        tag = time.strftime("%Y%m")
        (RESULTS / f"epoch_end_{tag}.json").write_text(
            json.dumps({"command": cmd, "rows": rows, "provenance": stamp()}, indent=1))
        text = (f"# Where the default's lost balance falls, and what a better end game could win\n\nCommand: `{cmd}`; "
                f"{time.strftime('%Y-%m-%d')}; dealt, the default policy, padded cost, budget 8,192 (the columns: "
                "`paper_repro/epoch_end.py`'s docstring).\n\n" + render(rows))
        (RESULTS / f"epoch_end_{tag}.md").write_text(text)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
