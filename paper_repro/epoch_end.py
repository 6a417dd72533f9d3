"""How much of ODB's lost balance falls at the epoch's end (the figures of
``docs/decisions/2026-12-02-epoch-end-flush.md``).

    python -m paper_repro.epoch_end [dist:N:W:per_rank[:cost] ...]

Legend
    lost        the sum over steps of (the costliest rank's budget cost - the mean rank's): what straggler
                efficiency misses (`bench_metrics.metrics`: ``lost = step_time * (1 - straggler_eff)``)
    epoch end   every step from the first round in which some rank with data posts that its source is
                exhausted (the policy summary's flag, read from the posted headers)

ODB runs as it ships (`odb.core.sim`, dealt sharding, the default policy, PAD), on the scale grid's lengths
(`paper_repro.bench_grid.point`), budget 8,192.  Prints one line per point: the lost balance, the part at the
epoch end and its share, the steps there, the rounds.
"""

from __future__ import annotations

import sys

__all__ = ["epoch_end", "main"]

DEFAULT_POINTS = ("sharegpt4o:64:256:2048", "release:64:256:2048", "mmmix:64:256:2048", "llava:64:256:2048",
                  "sharegpt4o:256:256:2048")


def epoch_end(dist: str, world: int, window: int, per_rank: int, kind: str = "padded", budget: int = 8192,
              seed: int = 0) -> dict:
    """ODB's schedule on one point and where its lost balance falls (module docstring)."""
    from odb.batching import default_policy
    from odb.core.sim import simulate
    from odb.runtime.engine import header_layout

    from .bench_grid import point
    from .bench_metrics import metrics

    pt = point(dist, world, budget, kind, per_rank, seed)
    layout = header_layout(default_policy().summary_len, window)
    first: list[int] = []

    def on_round(rnd, posts):
        if not first:
            heads = [layout.decode(p.header) for p in posts]
            if any(h.n > 0 and h.summary[2] for h in heads):  # BalancedPolicy's summary: [tag, n, exhausted, ...]
                first.append(rnd)
        return False

    sim = simulate([[] for _ in range(world)], pt.cost, window=window, mode="pad", deal=pt.sizes, on_round=on_round)

    def lost(rows) -> float:  # sum over steps of max - mean: the metrics' step time less their mean rank's
        m = metrics(rows, pt.sizes, pt.cost)
        return m["step_time"] * (1.0 - m["straggler_eff"])

    steps = max(len(r) for r in sim.batches)
    start = sum(sim.targets[:first[0]]) if first else steps
    return {"dist": dist, "world": world, "window": window, "per_rank": per_rank, "cost": kind, "steps": steps,
            "rounds": sim.rounds, "end_round": first[0] if first else sim.rounds, "end_step": start,
            "lost": lost(sim.batches), "lost_at_end": lost([r[start:] for r in sim.batches])}


def main(argv: list[str] | None = None) -> int:
    pts = (sys.argv[1:] if argv is None else argv) or DEFAULT_POINTS
    for p in pts:
        f = p.split(":")
        r = epoch_end(f[0], int(f[1]), int(f[2]), int(f[3]), *(f[4:5]))
        share = r["lost_at_end"] / r["lost"] if r["lost"] else 0.0
        print(f"{p}: lost {r['lost']:.1f}, at the epoch end {r['lost_at_end']:.1f} ({share:.0%}) over steps "
              f"{r['end_step']}-{r['steps']} of {r['steps']}; the end from round {r['end_round']} of {r['rounds']}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
