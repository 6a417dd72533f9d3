"""A stated step-time model: the seconds of training steps on GPUs from the exact batches each rank runs.

`predict` turns a plan (per step, every rank's batch as a list of sample lengths) into seconds, samples/s and
straggler efficiency; `odb_round_latency` is one ODB round collective's cost.  `odb plan` (`odb.plan`) and the
repository's cluster simulation (``paper_repro/cluster_sim.py``) read ODB's batches through it.

Legend
    N       world size (ranks = GPUs)
    L       a sample's post-pipeline length in tokens
    step    one optimizer step: every rank runs one batch (or idles: a PAD filler costs a full
            forward/backward of one sample, a JOIN-finished rank 0)

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["StepModel", "H20_2B", "Plan", "predict", "odb_round_latency", "odb_reduced_bytes"]

# A plan: one entry per step; each entry is a list over ranks of that rank's batch
# (a list of sample lengths), [] for an idle/joined rank, or ("filler", L) for a PAD filler.
Plan = list


@dataclass(frozen=True, kw_only=True)
class StepModel:
    """The step-time model's constants (the module docstring states each); the default is `H20_2B`."""

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


def predict(plan: Plan, world_size: int, model: StepModel = H20_2B, num_rounds: int = 0,
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
