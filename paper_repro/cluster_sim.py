"""Cluster-scale prediction: a stated step-time model fed with the exact batches each method emits.

Legend
    N       world size (ranks = GPUs)
    L       a sample's post-pipeline length in tokens
    step    one optimizer step: every rank runs one batch (or idles: a PAD filler
            costs a full forward/backward of one sample, a JOIN-finished rank 0)

Step-time model (per step, seconds)::

    compute_r = c_fixed + (A * padded_tokens_r + B_ATT * sum_i Lpad_i^2) / (MFU * PEAK)
    step      = max_r compute_r + max(0, t_allreduce(N) - OVERLAP * (2/3) * max_r compute_r)

with padded_tokens_r = len(batch) * max(L) (pad collate), Lpad_i = max(L) for
every row; a packed (varlen) collate runs sum L tokens and sum L_i^2 (no padding);
and the gradient all-reduce a ring over the slowest link:
``t_allreduce = 2 (N-1)/N * GRAD_BYTES / BW + 2 (N-1) * ALPHA``.

Constants and where they come from (all stated, none fitted to the paper):
    A        6 * 2.1e9 FLOP/token: fwd+bwd of a 2.1B-parameter decoder (the
             6P rule, Kaplan et al. 2020); Qwen3-VL-2B's LM is about 2B.
    B_ATT    6 * n_layers * d_model = 6 * 28 * 2048 FLOP per L^2 (causal
             attention scores + values, fwd+bwd, halved for causality).
    PEAK     148e12 FLOP/s dense BF16 (NVIDIA H20 datasheet).
    MFU      0.40 at saturation, and ``tokens / (tokens + KNEE)`` below it
             with KNEE = 1024 tokens: a batch of one short sample leaves the
             GPU mostly idle (the paper's premise for batch-1 Standard).
    c_fixed  0.030 s: optimizer step over 2.1B params with full AdamW state
             per rank (about 64 GB of HBM traffic at 4.0 TB/s, H20 datasheet)
             plus about 1,000 kernel launches at ~10 us.
    GRAD     2.1e9 * 2 bytes (BF16 gradients).
    BW       intra-node (N <= 8): 300 GB/s ring bus bandwidth over NVLink
             (H20: 900 GB/s NVLink, derated for ring all-reduce);
             inter-node (N > 8): 45 GB/s per GPU (one 400 Gb/s NIC per GPU).
    ALPHA    5 us intra-node, 15 us inter-node per ring hop.
    OVERLAP  0.8 of the all-reduce hides behind the backward pass (DDP buckets).
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

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["StepModel", "H20_2B", "Plan", "simulate", "simulate_variable", "protocol_cost", "odb_reduced_bytes", "odb_round_latency",
           "standard_plan", "plan_stats"]

# A plan: one entry per step; each entry is a list over ranks of that rank's batch
# (a list of sample lengths), [] for an idle/joined rank, or ("filler", L) for a PAD filler.
Plan = list


@dataclass(frozen=True, kw_only=True)
class StepModel:
    flop_per_token: float = 6 * 2.1e9
    flop_per_l2: float = 6 * 28 * 2048
    peak: float = 148e12
    mfu: float = 0.40
    knee_tokens: float = 1024.0
    c_fixed: float = 0.030
    grad_bytes: float = 2.1e9 * 2
    bw_intra: float = 300e9
    bw_inter: float = 45e9
    alpha_intra: float = 5e-6
    alpha_inter: float = 15e-6
    overlap: float = 0.8
    gpus_per_node: int = 8

    def compute(self, batch: Sequence[int], collate: str = "pad") -> float:
        """Seconds of one rank's forward+backward+optimizer for a batch of these lengths: padded to its
        longest (``collate="pad"``), or packed into one varlen row (``"packed"``: tokens = sum L, attention
        sum L^2, no padding)."""
        if not batch:
            return 0.0
        if collate == "pad":
            lmax = max(batch)
            tokens, l2 = len(batch) * lmax, len(batch) * lmax * lmax
        elif collate == "packed":
            tokens, l2 = sum(batch), sum(x * x for x in batch)
        else:
            raise ValueError(f"collate must be 'pad' or 'packed', got {collate!r}")
        flops = self.flop_per_token * tokens + self.flop_per_l2 * l2
        eff = self.mfu * tokens / (tokens + self.knee_tokens)
        return self.c_fixed + flops / (eff * self.peak)

    def allreduce(self, world_size: int, nbytes: float | None = None) -> float:
        """Ring all-reduce latency of `nbytes` (default: the gradients)."""
        n = world_size
        if n == 1:
            return 0.0
        nbytes = self.grad_bytes if nbytes is None else nbytes
        bw, alpha = (self.bw_intra, self.alpha_intra) if n <= self.gpus_per_node else (self.bw_inter, self.alpha_inter)
        return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * alpha

    def allgather(self, world_size: int, bytes_per_rank: float) -> float:
        """Ring all-gather latency: (N-1) hops, each moving one rank's message."""
        n = world_size
        bw, alpha = (self.bw_intra, self.alpha_intra) if n <= self.gpus_per_node else (self.bw_inter, self.alpha_inter)
        return (n - 1) * (alpha + bytes_per_rank / bw)

    def step(self, per_rank: Sequence[Sequence[int]], world_size: int, collate: str = "pad") -> float:
        return self.step_of([self.compute(b, collate) for b in per_rank], world_size)

    def step_of(self, computes: Sequence[float], world_size: int) -> float:
        """A step's seconds from every rank's `compute`: the slowest, plus the exposed gradient all-reduce."""
        slowest = max(computes)
        exposed = max(0.0, self.allreduce(world_size) - self.overlap * (2 / 3) * slowest)
        return slowest + exposed


H20_2B = StepModel()


def _rank_batch(x) -> list[int]:
    if isinstance(x, tuple) and x and x[0] == "filler":
        return [int(x[1])]
    return [int(v) for v in x]


def simulate(plan: Plan, world_size: int, model: StepModel = H20_2B, num_rounds: int = 0,
             header_bytes: int = 0, round_s: float | None = None, collate: str = "pad", accum: int = 1) -> dict:
    """Predicted wall time and efficiency of a plan.

    :param num_rounds, header_bytes, round_s: ODB's protocol rounds, and what one costs: `round_s`
        seconds if given (`odb_round_latency`), else one all-gather of `header_bytes` per rank.
    :param collate: how a batch runs (`StepModel.compute`): "pad" or "packed".
    :param accum: micro-batches per optimizer step (DDP ``no_sync`` / gradient accumulation, the same
        count on every rank): ranks wait for each other, and all-reduce, once per `accum` plan steps, so
        a step lasts as long as the rank with the largest *sum* over its micro-batches; the overlap
        is with the last micro-batch's backward.  1: every plan step is an optimizer step.
    Returns seconds, real samples, samples/s, straggler efficiency (mean over optimizer steps of
    mean rank compute / max rank compute), padding fraction (0 when packed), and
    ``balanced_seconds``: the same batches with every optimizer step as long as its mean rank (what
    perfect balance of this plan's steps would give; rounds included).
    """
    if accum < 1:
        raise ValueError(f"accum must be >= 1, got {accum}")
    t = bal = 0.0
    samples = real = padded = 0
    eff = []
    memo: dict = {}  # many batches repeat (fillers, singletons): the model's arithmetic once per distinct batch
    for k in range(0, len(plan), accum):
        sums = [0.0] * len(plan[k])
        for step in plan[k:k + accum]:
            last = []
            for r, x in enumerate(step):
                b = tuple(_rank_batch(x))
                c = memo.get(b)
                if c is None:
                    c = memo[b] = model.compute(b, collate)
                sums[r] += c
                last.append(c)
            for x in step:
                if isinstance(x, tuple):
                    padded += int(x[1])
                    continue
                samples += len(x)
                real += sum(x)
                padded += (len(x) * max(x) if collate == "pad" else sum(x)) if x else 0
        slowest, hide = max(sums), model.overlap * (2 / 3) * max(last)
        ar = model.allreduce(world_size)
        t += slowest + max(0.0, ar - hide)
        mean = sum(sums) / len(sums)
        bal += mean + max(0.0, ar - hide)
        eff.append(mean / slowest if slowest > 0 else 1.0)
    rounds = num_rounds * (model.allgather(world_size, header_bytes) if round_s is None else round_s)
    t, bal = t + rounds, bal + rounds
    return {"seconds": t, "samples": samples, "samples_per_s": samples / t if t else 0.0,
            "straggler_eff": float(np.mean(eff)) if eff else 1.0, "pad_frac": 1 - real / padded if padded else 0.0,
            "steps": len(plan), "balanced_seconds": bal}


def simulate_variable(plan: Plan, world_size: int, model: StepModel = H20_2B, accum: int = 4, num_rounds: int = 0,
                      round_s: float = 0.0, collate: str = "pad") -> dict:
    """PROTOTYPE timing of variable micro-batch counts per optimizer step (DDP ``no_sync``; FSDP needs equal
    counts), not a mode the runtime has: each rank runs its own batches in order (fillers dropped: no count
    has to match); in each optimizer step a rank runs at least one, and the next one while that brings its
    sum nearer to `accum` mean batches of compute (the epoch's mean over every real batch).  A step lasts as
    long as its largest per-rank sum, plus the all-reduce less what hides behind the step's largest
    micro-batch (`simulate` hides it behind each rank's last one: a slightly larger overlap here).  One budget-full micro-batch is about
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


def odb_reduced_bytes(world_size: int, window: int, header_len: int, int_bytes: int = 8) -> tuple[int, int]:
    """The two vectors ODB all-reduces per round in its "reduce" mode (`odb.runtime.transport`): N header
    slots and 3W counts (sum), W tokens (max)."""
    return (world_size * header_len + 3 * window) * int_bytes, window * int_bytes


def odb_round_latency(model: "StepModel", world_size: int, window: int, header_len: int,
                      int_bytes: int = 8) -> tuple[float, float]:
    """(seconds, bytes received per rank) of one ODB round collective, in the mode the runtime picks for
    this N and W (`odb.runtime.transport.counts_mode`): one all-gather of header + 3W counts, or the two
    all-reduces of `odb_reduced_bytes`."""
    from odb.runtime.transport import counts_mode

    n = world_size
    if counts_mode(n, header_len, window) == "gather":
        per_rank = (header_len + 3 * window) * int_bytes
        return model.allgather(n, per_rank), n * per_rank
    red = odb_reduced_bytes(n, window, header_len, int_bytes)
    return sum(model.allreduce(n, b) for b in red), sum(2 * (n - 1) / n * b for b in red)


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
