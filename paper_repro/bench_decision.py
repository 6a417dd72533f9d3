"""Decision time as one rank's process sees it, at cluster scale: N = 1024 ranks, W = 1024, GC on.

A simulation of N ranks in one process (`odb.core.sim.simulate`) holds every rank's state, so its
garbage collector walks N ranks' objects and its per-rank timings are not a rank's.  Here the
N-rank simulation only records the headers every round's collective returns (``on_round``); then a
fresh process (``python -m paper_repro.bench_decision --replay``) builds ONE rank's core, the
runtime's `RankCore` through `odb.core.sim.replay_rank`, and feeds it those headers.  The replay
checks that the rank posts exactly the recorded header every round, so what it times is the run
that was recorded.  The pass is replayed `passes` times in the same process, garbage kept and the
collector on, so the spread includes the collector's pauses.  A full collection walks every object of
the process, its imports' too (torch's among them: about 170,000), so it is replayed a second time
after ``gc.freeze()`` (``gc_frozen``: what a training script that freezes after its setup sees; the
collector then walks what was made since, the rank's own state).

With ``pool_size`` G > 1 (pooled windows, `odb.core.placement`) the simulation runs one core per pool and
records the P = N / G pool headers; the replayed rank is lane ``rank mod G``, a replica, fed the N
headers as the transport hands them (each pool's header G times: a pool's lanes post identical headers
or every rank raises).  The reduced counts are the pools' sums: their totals are the lanes' exactly,
their per-step maxima an upper bound (read by the rank's statistics only).  The replay checks the
rank's header every round; its counts, its lane's own, are not recorded.

With ``exchange`` (the round exchange, `odb.batching.exchange`) the WAIT row also plans the previous round's
batches across all N ranks from the gathered fills; the recording keeps the batches moved into the rank's pool
each round (``POSTS_NPZ.moved.json``), and the replay hands the rank those it expects (``receive``, in
``collect``), as its transport would.

Per round it reports (ms): ``policy`` (summarize + propose + partition: the alignment decision),
``collect`` (the WAIT row on the gathered headers: the replicated checks, the policy's propose and
partition, the deal), ``decode`` (the N headers as the transport hands them, an int64 array, into
`odb.core.header.Headers`), ``decision`` (``decode + collect``: all a rank computes between the
collective's return and its batches), ``replicated`` (``decode`` and `odb.core.replica.Replicated.decide`:
what reads the N headers, the part that grows with N; the rest of ``decision`` is this rank's own window:
its partition, the partition's contract check and the release of the last round's batches, the same work at
any N), ``plan`` (with ``exchange``, inside ``collect``: the round exchange's plan of the previous round's
batches across the N ranks, `odb.batching.exchange.plan_origins` and this rank's sends; 0 without), ``local``
(the EMIT/FILL rows before the post: per-sample work, counted in the loader's CPU per sample).  Each part also
gives each round's median over the passes
(``round_medians_ms``), so a p99 is traced to the round it comes from.  Decoding the headers grows with N;
the loss counts are reduced, not gathered (`odb.core.header`);
`paper_repro.bench_runtime.collective_scaling` times the collective itself.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import numpy as np

from odb.batching import make_cost_model
from odb.core.header import Gathered, Post, reduce_posts
from odb.core.placement import Exchanged, Pooled
from odb.core.sim import replay_rank, simulate
from odb.runtime.transport import counts_mode
from odb.settings import LoaderSettings

from .cpu import reference_ms
from .distributions import sample_lengths

__all__ = ["record", "replay", "as_rank_sees", "decision_at_scale", "TARGETS"]

# The targets for one rank's decision per round at N = 1024, W = 1024 (ms), read two ways: the policy's
# part, and the whole decision (``decision``: decoding the N headers and the WAIT row on them).
TARGETS = {"policy_median_ms": 1.0, "policy_p99_ms": 5.0, "decision_median_ms": 1.0, "decision_p99_ms": 5.0}
PARTS = ("policy", "collect", "decode", "decision", "replicated", "plan", "local")


class _Lengths(Sequence):
    """The epoch's sizes as one int array, read as ``(tokens,)`` tuples: a rank's process holds its dataset's
    lengths as data, not as millions of tuples that every full collection walks (which would put the
    benchmark's own list into the rank's pauses)."""

    def __init__(self, sizes: list):
        self._a = np.fromiter((s[0] for s in sizes), dtype=np.int64, count=len(sizes))

    def __len__(self) -> int:
        return len(self._a)

    def __getitem__(self, i):
        return (int(self._a[i]),)


def _setting(a: dict):
    sizes = _Lengths(sample_lengths(a["dist"], a["world"] * a["per_rank"], a["seed"]))
    return sizes, make_cost_model(a["kind"], a["budget"])


def _settings(a: dict, cost) -> LoaderSettings:
    """The loader settings `a` stands for (``pool_size``, ``exchange``, ``exchange_slack`` in basis points)."""
    G, slack = a.get("pool_size", 1), a.get("exchange_slack", 0)
    placement = Exchanged(pool=G, slack=slack / 10_000) if a.get("exchange") else Pooled(G) if G > 1 else None
    return LoaderSettings(token_budget=None, cost=cost, buffer_size=a["window"], placement=placement,
                          first_window=None)  # every round a full window: the decision's cost at W


def record(a: dict, path: str) -> dict:
    """Simulate `a` (dist, world, window, budget, kind, per_rank, seed, rounds, pool_size; dealt sharding,
    the default policy for the pool size) and save, for the first ``a["rounds"]`` rounds (None: the whole
    epoch), what rank
    ``a["rank"]`` posted and what the collective returned (the N headers, the P pools' when pooled, and the
    reduced counts) to `path` (.npz)."""
    sizes, cost = _setting(a)
    G = a.get("pool_size", 1)
    mine = a["rank"] // G  # the post the rank's own matches: its pool's (one core per pool)
    keep: dict[str, list] = {"heads": [], "totals": [], "maxes": [], "mine_h": [], "mine_c": []}

    def on_round(k, posts):
        g = reduce_posts(posts)
        for name, v in (("heads", g.rows), ("totals", g.totals), ("maxes", g.tokens_max),
                        ("mine_h", posts[mine].header), ("mine_c", posts[mine].counts)):
            keep[name].append(np.asarray(v, dtype=np.int64))
        # with the exchange a round's moves come after its collect: record one round more, kept below if moved
        return a["rounds"] is not None and len(keep["heads"]) >= a["rounds"] + int(bool(a.get("exchange")))

    moved: list[list] = []

    def on_moved(k, by_core):  # the batches moved into the rank's core (its pool's), as plain data
        moved.append([[list(o), list(b.positions), list(b.indices), list(b.sizes), list(b.counts)]
                      for o, b in by_core.get(mine, {}).items()])

    t0 = time.perf_counter()
    xchg = a.get("exchange", False)
    simulate([[] for _ in range(a["world"])], _settings(a, cost), deal=sizes, on_round=on_round,
             on_moved=on_moved if xchg else None)
    if xchg:  # the rounds whose collect ran (a round cut short by `rounds` moved nothing)
        keep = {k: v[:len(moved)] for k, v in keep.items()}
    arrs = {k: np.stack(v) for k, v in keep.items()}
    np.savez(path, **arrs)
    if xchg:
        with open(path + ".moved.json", "w") as f:
            json.dump(moved, f)
    return {"rounds": len(keep["heads"]), "header_ints": int(arrs["heads"].shape[2]),
            "reduced_ints": int(arrs["totals"].shape[1] + arrs["maxes"].shape[1]), "record_s": time.perf_counter() - t0}


def as_rank_sees(mine: Post, recorded: Gathered, pool_size: int = 1) -> tuple[Post, Gathered]:
    """One recorded round as `replay_rank` takes it: unpooled, as recorded; pooled (one post per pool
    recorded), each pool's header `pool_size` times (what the transport hands a lane) and the post's counts
    dropped (the pool's sums, not the lane's own: only the header is checked)."""
    if pool_size == 1:
        return mine, recorded
    rows = np.repeat(np.asarray(recorded.rows), pool_size, axis=0)
    return Post(mine.header, None), recorded._replace(rows=rows)


def replay(a: dict, path: str) -> list[dict]:
    """In this process: rank ``a["rank"]`` alone, ``a["passes"]`` passes over the recorded rounds."""
    sizes, cost = _setting(a)
    z = dict(np.load(path))
    G = a.get("pool_size", 1)

    class Rounds:  # each round as the transport hands it to the core (the headers an int64 array, the reduced
        # counts int lists), built when it is reached:
        # a rank holds one round's headers at a time, so the collector sees what a rank's process holds
        def __len__(self):
            return z["heads"].shape[0]

        def __iter__(self):
            for k in range(len(self)):
                yield as_rank_sees(Post(z["mine_h"][k].tolist(), z["mine_c"][k].tolist()),
                                   Gathered(z["heads"][k].copy(), z["totals"][k].tolist(), z["maxes"][k].tolist()), G)

    rounds, received = Rounds(), None
    if a.get("exchange"):
        with open(path + ".moved.json") as f:
            received = [{tuple(o): rest for o, *rest in r} for r in json.load(f)]
    if a.get("gc_freeze"):  # what a training script may do after its setup: the collector skips what exists now
        gc.freeze()
    out = []
    for _ in range(a["passes"]):
        out += replay_rank(a["rank"], rounds, [[] for _ in range(a["world"])], _settings(a, cost), deal=sizes,
                           received=received)
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _replay_process(a: dict, path: str) -> list[dict]:
    """`replay` in a fresh process (what one rank's process holds: its imports, one rank's state)."""
    proc = subprocess.run([sys.executable, "-m", "paper_repro.bench_decision", "--replay", json.dumps(a), path],
                          capture_output=True, text=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"replay failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _parts(rows: list[dict], rounds: int) -> dict:
    """Median / p99 / max ms per part over the replayed rounds, and the same past each pass's first two
    rounds (they deal the first N x W positions; the rest deal what was consumed)."""
    out = {}
    rows = [dict(r, decision_s=r["decode_s"] + r["collect_s"], replicated_s=r["decode_s"] + r["replicated_s"])
            for r in rows]
    later = [r for i, r in enumerate(rows) if i % rounds >= 2]
    for part in PARTS:
        xs = [1e3 * r[part + "_s"] for r in rows]
        out[part] = {"median_ms": statistics.median(xs), "p99_ms": _pct(xs, 0.99), "max_ms": max(xs)}
        if later:
            ys = [1e3 * r[part + "_s"] for r in later]
            out[part].update(later_median_ms=statistics.median(ys), later_p99_ms=_pct(ys, 0.99))
        # each round's median over the passes: which round of the epoch a p99 comes from
        out[part]["round_medians_ms"] = [statistics.median(xs[k::rounds]) for k in range(min(rounds, len(xs)))]
    return out


def decision_at_scale(dist: str = "sharegpt4o", world: int = 1024, window: int = 1024, budget: int = 16384,
                      kind: str = "padded", per_rank: int | None = None, rounds: int | None = None, passes: int = 16,
                      rank: int = 0, seed: int = 0, recorded: str | None = None, pool_size: int = 1,
                      exchange: bool = False, exchange_slack: int = 0) -> dict:
    """Record `rounds` rounds (None: a whole epoch, end game and flush included) of an N-rank simulation with
    `per_rank` samples per rank (None: 8 W, the issue's realistic epoch), replay them on one rank in a fresh process;
    median / p99 / max per part (ms) over rounds x passes, each replayed round's figures (``per_round``,
    pass-major), the same figures replayed after ``gc.freeze()`` (``gc_frozen``; module docstring), and the
    targets' verdicts (GC as it is).  ``recorded``: an .npz path to keep the recording at, or to
    reuse one already there (recording 1024 ranks takes minutes; the replay seconds).  ``pool_size``:
    pooled windows (module docstring), the window W per rank.  ``exchange`` (``exchange_slack``, basis
    points): the round exchange (module docstring), its plan in the WAIT row."""
    per_rank = 8 * window if per_rank is None else per_rank
    a = dict(dist=dist, world=world, window=window, budget=budget, kind=kind, per_rank=per_rank, seed=seed,
             rounds=rounds, passes=passes, rank=rank, pool_size=pool_size, exchange=exchange,
             exchange_slack=exchange_slack)
    with tempfile.TemporaryDirectory(prefix="odb_decision_") as tmp:
        path = recorded or os.path.join(tmp, "posts.npz")
        if recorded and os.path.exists(recorded) and (not exchange or os.path.exists(recorded + ".moved.json")):
            with np.load(recorded) as z:
                if z["heads"].shape[1] * pool_size != world:
                    raise ValueError(f"{recorded} holds {z['heads'].shape[1]} headers a round, "
                                     f"not {world} / {pool_size}")
                rec = {"rounds": int(z["heads"].shape[0]), "header_ints": int(z["heads"].shape[2]),
                       "reduced_ints": int(z["totals"].shape[1] + z["maxes"].shape[1]), "record_s": None}
        else:
            rec = record(a, path)
        machine_ms = reference_ms()  # the machine's speed just before the replay (a run's hours differ)
        t0 = time.perf_counter()
        rows, frozen = (_replay_process(dict(a, gc_freeze=f), path) for f in (False, True))
        replay_s = time.perf_counter() - t0
    h, red = rec["header_ints"], rec["reduced_ints"]  # red = 4W: 3W counts and W tokens
    mode = counts_mode(world, h, window)  # what the transport runs at this N and W, and receives per round
    got = world * (h + red * 3 // 4) if mode == "gather" else 2 * (world - 1) / world * (world * h + red)
    out = {**a, **rec, "replay_s": replay_s, "samples": len(rows), "header_bytes": 8 * h, "transport": mode,
           "received_bytes": 8 * got, "reference_ms_before_replay": machine_ms}
    out.update(_parts(rows, rec["rounds"]))
    out["per_round"] = [{k: round(1e3 * v, 4) for k, v in r.items()} for r in rows]  # ms
    out["gc_frozen"] = _parts(frozen, rec["rounds"])
    out["verdicts"] = {k: out[k.split("_", 1)[0]][k.split("_", 1)[1]] < v for k, v in TARGETS.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replay", nargs=2, metavar=("ARGS_JSON", "POSTS_NPZ"), help="(internal) the replay process")
    ap.add_argument("--world", type=int, default=1024)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=None, help="rounds recorded (default: the whole epoch)")
    ap.add_argument("--passes", type=int, default=16)
    ap.add_argument("--per-rank", type=int, default=None, help="samples per rank in the epoch (default: 8 W)")
    ap.add_argument("--pool-size", type=int, default=1, help="pooled windows of this many ranks (W per rank)")
    ap.add_argument("--exchange", action="store_true", help="the round exchange (its plan in the WAIT row)")
    ap.add_argument("--exchange-slack", type=int, default=0, help="the exchange's budget balance, basis points")
    ap.add_argument("--recorded", default=None, help="keep (or reuse) the recording at this .npz path")
    args = ap.parse_args(argv)
    if args.replay:
        print(json.dumps(replay(json.loads(args.replay[0]), args.replay[1])))
        return 0
    print(json.dumps(decision_at_scale(world=args.world, window=args.window, rounds=args.rounds,
                                       per_rank=args.per_rank, passes=args.passes, recorded=args.recorded,
                                       pool_size=args.pool_size, exchange=args.exchange,
                                       exchange_slack=args.exchange_slack), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
