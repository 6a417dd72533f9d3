"""Cluster-scale prediction: a stated step-time model fed with the exact batches each method emits.

Legend
    N       world size (ranks = GPUs)
    L       a sample's post-pipeline length in tokens
    step    one optimizer step: every rank runs one batch (or idles: a PAD filler
            costs a full forward/backward of one sample, a JOIN-finished rank 0)

Step-time model: `odb.plan.stepmodel` (stated there, constant by constant).
ODB additionally pays one round collective per round (`protocol_cost`), and
the simulation charges it.

Protocol cost: the released package all-gathers ``[slots, groups, size per
group..., token sum per group...]`` per rank per window (exact loss scaling),
up to ``2 + 2W`` integers per rank: O(N * W) received per rank and round.  ODB
posts a runtime header of ``11 + S + L`` integers (`odb.core.header.HeaderLayout`:
status, round, window size, epoch and the 3-int replicated digest, the policy
summary, the dealer's 4 ints, L = 2 log2(W) or fewer for the dealer's intake
bound) and 3 counts per batch of the previous round (exact loss scaling).  While
a rank would receive at most 1 MiB, one all-gather of both; past it
(`odb.runtime.transport.counts_mode`), one all-reduce of N header slots and the
summed counts, and one of each batch's tokens (max): O(N * (11 + S + L) + 4W)
integers, the counts' share independent of N.  `protocol_cost` gives bytes
received per rank and the ring latency of both.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

# the model itself lives in the package (`odb plan` reads batches through it); re-exported here
from odb.plan.stepmodel import H20_2B, Plan, StepModel, _rank_batch, odb_reduced_bytes, odb_round_latency  # noqa: F401
from odb.plan.stepmodel import predict as simulate  # noqa: F401

__all__ = ["StepModel", "H20_2B", "Plan", "simulate", "simulate_variable", "protocol_cost", "odb_reduced_bytes",
           "odb_round_latency", "standard_plan", "plan_stats"]

def simulate_variable(plan: Plan, world_size: int, model: StepModel = H20_2B, accum: int = 4, num_rounds: int = 0,
                      round_s: float = 0.0, collate: str = "pad") -> dict:
    """PROTOTYPE timing of variable micro-batch counts per optimizer step (DDP ``no_sync``; FSDP needs equal
    counts), not a mode the runtime has: each rank runs its own batches in order (fillers dropped: no count
    has to match); in each optimizer step a rank runs at least one, and the next one while that brings its
    sum nearer to `accum` mean batches of compute (the epoch's mean over every real batch).  A step lasts as
    long as its largest per-rank sum, plus the all-reduce less what hides behind the step's largest
    micro-batch (`simulate` hides it behind each rank's last one: a slightly larger overlap here).
    One budget-full micro-batch is about
    1 / `accum` of a step, so the counts quantize what they balance.  Returns seconds, samples, samples/s,
    straggler efficiency (mean over steps of mean / max per-rank sum) and the optimizer steps."""
    streams: list[list[float]] = [[] for _ in range(world_size)]
    samples = 0
    memo: dict = {}
    for step in plan:
        for r, x in enumerate(step):
            if isinstance(x, tuple) or not x:
                continue
            b = tuple(int(v) for v in x)
            c = memo.get(b)
            streams[r].append(c if c is not None else memo.setdefault(b, model.compute(b, collate)))
            samples += len(x)
    flat = [c for st in streams for c in st]
    tau = accum * sum(flat) / len(flat) if flat else 0.0
    pos, t, eff, steps = [0] * world_size, 0.0, [], 0
    while any(p < len(st) for p, st in zip(pos, streams)):
        sums, last = [0.0] * world_size, 0.0
        for r, st in enumerate(streams):
            while pos[r] < len(st) and (sums[r] == 0.0 or sums[r] + st[pos[r]] / 2 <= tau):  # the nearest sum
                sums[r] += st[pos[r]]
                last = max(last, st[pos[r]])
                pos[r] += 1
        slowest = max(sums)
        t += slowest + max(0.0, model.allreduce(world_size) - model.overlap * (2 / 3) * last)
        eff.append(sum(sums) / len(sums) / slowest)
        steps += 1
    t += num_rounds * round_s
    return {"seconds": t, "samples": samples, "samples_per_s": samples / t if t else 0.0,
            "straggler_eff": float(np.mean(eff)) if eff else 1.0, "steps": steps}


def standard_plan(lengths: Sequence[int], world_size: int, batch_size: int = 1, seed: int = 0) -> Plan:
    """Fixed batches: a seeded shuffle dealt round-robin to ranks (DistributedSampler-like,
    tail dropped to a multiple of world_size * batch_size so all ranks step together)."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    per = len(order) // (world_size * batch_size) * batch_size
    shards = [order[r::world_size][:per] for r in range(world_size)]
    return [[[int(lengths[i]) for i in shards[r][s:s + batch_size]] for r in range(world_size)]
            for s in range(0, per, batch_size)]


def plan_stats(plan: Plan) -> dict:
    return {"steps": len(plan), "samples": sum(len(x) for st in plan for x in st if not isinstance(x, tuple))}


def protocol_cost(world_size: int, window: int, header_len: int, model: StepModel = H20_2B,
                  int_bytes: int = 8) -> dict:
    """Bytes each rank receives, and latency, for one round.

    release: every rank sends [slots, groups, one size and one token sum per group] with up
    to `window` groups (its worst case: singletons), so N * (2 + 2 window) ints gathered.
    odb: its round collective in the runtime's mode (`odb_round_latency`).
    """
    n = world_size
    rel = (2 + 2 * window) * int_bytes
    lat, got = odb_round_latency(model, n, window, header_len, int_bytes)
    return {"world_size": n, "window": window, "release_bytes": n * rel, "odb_bytes": got,
            "release_latency_s": model.allgather(n, rel), "odb_latency_s": lat}
