"""Batchers a user could pick instead of ODB, RE-IMPLEMENTED FROM THEIR PUBLIC DESCRIPTIONS (pure; no torch).

Not their code: each function follows the public description named in its docstring, and says
where that description left a choice open.  Every one has `global_max_tokens`'s shape: the epoch's
sizes, the world size and a cost model in, a `Schedule` out (``schedule[rank][step]``: dataset
indices, or None for a filler), so the benchmark scores all of them with the same metrics.
`PEERS` (at the end) is the table of them, as data: which need a length cache, which move samples
between ranks, and where fillers come from.  The benchmark's method legend is rendered from it.

*Length cache*: the method reads every sample's length before the epoch starts.  *Moves
samples*: a sample loaded by one rank's shard may be trained on another rank (lengths are
gathered per global batch and samples rerouted, or a controller dispatches them).  Every peer
gives every rank the same number of steps; a rank with nothing for a step gets a filler (None).

Legend
    sizes   the epoch's samples as sizes tuples (``sizes[i][0]`` = tokens, the length L)
    N       world size; B the cost model's budget; u(s) = ``cost.utilisation([s])``
    step    one micro-batch per rank (the benchmark's unit: an optimizer step of G
            accumulated micro-batches is G steps here)
    m       samples each rank contributes to one global batch (one optimizer step); by
            default 4 budget-full micro-batches at the mean u: ``4 * max(1, int(1 / mean u))``
"""

from __future__ import annotations

import heapq
import math
import random
from itertools import accumulate
from typing import Callable, NamedTuple, Sequence

from ..batching.base import CostModel, Sizes
from ..batching.cost import QUADRATIC_B
from ..errors import ConfigError
from .kk import karmarkar_karp
from .offline import Schedule, checked_world, deal, greedy_batches

__all__ = ["global_max_tokens_shuffled", "hf_rebalance", "dp_balanced_packing", "kk_micro_batches",
           "VERL_WORKLOAD_A", "MICRO_BATCHES_PER_STEP", "Peer", "PEERS"]

VERL_WORKLOAD_A = 24576  # verl's per-token weight in its workload estimate 24576 L + L^2
MICRO_BATCHES_PER_STEP = 4  # the default global batch: this many budget-full micro-batches per rank


def _per_batch(sizes: Sequence[Sizes], cost: CostModel) -> int:
    """Samples in a budget-full batch at the mean single-sample cost (a user's batch-size guess)."""
    if not sizes:
        return 1
    mean_u = sum(cost.utilisation([s]) for s in sizes) / len(sizes)
    return max(1, int(1 / mean_u)) if mean_u > 0 else len(sizes)


def _fits(batch: Sequence[int], sizes: Sequence[Sizes], cost: CostModel) -> bool:
    """The benchmark's budget rule: within budget, or a single sample."""
    return len(batch) <= 1 or cost.fits([sizes[i] for i in batch])


def _positive(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{name} must be a positive int, got {v!r}")
    return v


def _seed(v) -> int:
    # random.Random(None) seeds from the clock: ranks would compute different plans
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"seed must be an int (every rank computes the same plan from it), got {v!r}")
    return v


def _non_negative(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ConfigError(f"{name} must be a finite number >= 0, got {v!r}")
    return float(v)


def global_max_tokens_shuffled(sizes: Sequence[Sizes], cost: CostModel, world_size: int,
                               seed: int = 0) -> Schedule:
    """GMT with a shuffled batch order, as fairseq-style samplers run it.

    Followed: fairseq's ``batch_by_size`` packs length-sorted indices under ``max_tokens``, and its
    epoch iterator shuffles the list of batches with a seed, then rank r takes batches r, r+N, ...
    Here the packing is `global_max_tokens`' (sorted longest first, next-fit), the shuffle is
    ``random.Random(seed)``, and `deal` hands step s batches ``s*N .. s*N+N-1`` (the same thing).
    Sorted order is a length curriculum and keeps similar batches in one step; shuffled order is
    what training usually runs, and a step then mixes a full batch with the epoch's few partial ones.
    Needs a length cache; moves no samples.
    """
    checked_world(world_size)
    batches = greedy_batches(range(len(sizes)), sizes, cost)
    random.Random(_seed(seed)).shuffle(batches)
    return deal(batches, world_size)


def _contiguous_groups(lens: Sequence[int], num_groups: int, alpha: float, intercept: float) -> list[int]:
    """Sizes of `num_groups` contiguous runs of `lens` (sorted longest first) that minimize the
    largest HF cost ``intercept + n * L + alpha * n * L^2`` (L = a run's first, longest, length).

    The iteration: bisect a common cost target; at each target every run takes as many samples as
    fit under it (``n = (target - intercept) / (L + alpha L^2)``); stop when the number of runs
    matches.  Runs left over are made by halving the costliest runs; 0-sized runs pad a global
    batch with fewer samples than groups."""
    n = len(lens)
    if n <= num_groups:
        return [1] * n + [0] * (num_groups - n)
    w = [L + alpha * L * L for L in lens]

    def runs(target: float) -> list[int]:
        out, p = [], 0
        while p < n:
            s = min(n - p, max(1, int((target - intercept) / w[p]))) if w[p] > 0 else n - p
            out.append(s)
            p += s
        return out

    # hi: one run holds everything (n + 1, not n: (n * w) / w can round to just below n)
    lo, hi = intercept + w[0], intercept + (n + 1) * w[0]
    for _ in range(50):  # the target is a float; 50 halvings are below any sample's weight
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if len(runs(mid)) <= num_groups else (mid, hi)
    sizes = runs(hi)
    assert len(sizes) <= num_groups  # invariant of the bisection: runs(hi) never has too many
    # fewer runs than groups: halve the costliest run that can be split (ties: the earliest), until enough
    starts = list(accumulate(sizes, initial=0))[:-1]
    done = [(a, c) for a, c in zip(starts, sizes) if c == 1]
    heap = [(-c * w[a], a, c) for a, c in zip(starts, sizes) if c > 1]
    heapq.heapify(heap)
    for _ in range(num_groups - len(sizes)):  # heap never empty here: n > num_groups
        _, a, c = heapq.heappop(heap)
        for a2, c2 in ((a, (c + 1) // 2), (a + (c + 1) // 2, c // 2)):
            if c2 > 1:
                heapq.heappush(heap, (-c2 * w[a2], a2, c2))
            else:
                done.append((a2, c2))
    return [c for _, c in sorted(done + [(a, c) for _, a, c in heap])]


def hf_rebalance(sizes: Sequence[Sizes], cost: CostModel, world_size: int, *, micro_batch_size: int | None = None,
                 grad_accum: int = MICRO_BATCHES_PER_STEP, alpha: float = QUADRATIC_B, intercept: float = 0.0,
                 seed: int = 0) -> Schedule:
    """HF Trainer's ``BatchRebalanceSampler`` (transformers PR #47340).

    Followed (the PR's docstring and review): a plan every rank computes alike from the dataset's
    lengths; global batches of ``per_device_batch_size * grad_accum * N`` samples; each partitioned
    into ``N * grad_accum`` groups by an iterative cost balancing that adjusts group SIZES, not
    sample assignments, under ``cost = intercept + bs * max_len + alpha * bs * max_len^2``; groups
    sorted by cost, costliest first, slot j (micro-batch j of the step) taking groups
    ``j*N .. j*N+N-1``, one per rank; a trailing partial global batch kept (``drop_last=False``).

    Chosen here, where the description is silent or has no budget:
    * the shuffle: ``random.Random(seed)`` over the dataset, then consecutive global batches;
    * the groups are contiguous runs of the global batch sorted longest first, balanced by
      `_contiguous_groups`'s bisection (the PR's own iteration is not described further);
    * defaults ``alpha = 1/24576`` (the quadratic kind's), ``intercept = 0`` (a constant per
      micro-batch does not change a balance of equally many groups), ``micro_batch_size`` the
      samples of a budget-full batch at the mean cost;
    * the budget: the PR has none (a group may be any size).  A global batch whose balanced groups
      do not all fit gets one more slot (N more groups) until they do, where a user would have
      to lower ``per_device_batch_size`` for the whole run; so this is the sampler's best case.
    Needs a length cache; moves no samples (each rank reads its own groups).
    """
    n = checked_world(world_size)
    bs = _positive("micro_batch_size", micro_batch_size) if micro_batch_size is not None else _per_batch(sizes, cost)
    ga = _positive("grad_accum", grad_accum)
    alpha, intercept = _non_negative("alpha", alpha), _non_negative("intercept", intercept)
    order = list(range(len(sizes)))
    random.Random(_seed(seed)).shuffle(order)
    rows: Schedule = [[] for _ in range(n)]
    step = n * ga * bs
    for g0 in range(0, len(order), step):
        gb = sorted(order[g0:g0 + step], key=lambda i: (-sizes[i][0], i))
        lens = [sizes[i][0] for i in gb]
        slots = ga
        while True:
            cuts = _contiguous_groups(lens, n * slots, alpha, intercept)
            starts = list(accumulate(cuts, initial=0))[:-1]
            groups = [gb[a:a + c] for a, c in zip(starts, cuts)]
            if all(_fits(g, sizes, cost) for g in groups):
                break
            slots += 1  # terminates: at N * slots >= len(gb) every group is one sample
        hf = [intercept + c * L + alpha * c * L * L if c else -1.0
              for c, L in zip(cuts, (lens[a] if a < len(lens) else 0 for a in starts))]
        ranked = sorted(range(len(groups)), key=lambda j: (-hf[j], j))
        for j in range(slots):
            for r in range(n):
                rows[r].append(groups[ranked[j * n + r]] or None)
    return rows


def dp_balanced_packing(sizes: Sequence[Sizes], cost: CostModel, world_size: int, *,
                        samples_per_rank: int | None = None) -> Schedule:
    """Megatron-Core's ``DpBalancedScheduler`` (``megatron/core/datasets/data_schedule.py``).

    Followed: every rank loads its own next ``m`` samples (DistributedSampler-style strided shards
    here, as the benchmark's fixed shards), the true lengths are all-gathered once per global batch
    (rank-major order), packed in that order, next-fit, up to the budget (Megatron: a sum of
    lengths up to ``max_seqlen_per_dp_cp_rank``; here `cost.fits`, the same for a packed cost);
    the number of packs is rounded up to a multiple of N by popping the last sample of the last
    multi-sample packs into packs of their own; micro-batch i gives pack ``i*N + r`` to rank r, and
    the samples are rerouted to the rank that runs their pack.

    Chosen here: ``samples_per_rank`` (m) defaults to `MICRO_BATCHES_PER_STEP` budget-full batches at
    the mean cost; where a global batch has fewer samples than N (the epoch's tail), Megatron
    asserts, and here the missing packs are fillers.  Needs no length cache; moves samples.
    """
    n = checked_world(world_size)
    m = (_positive("samples_per_rank", samples_per_rank) if samples_per_rank is not None
         else MICRO_BATCHES_PER_STEP * _per_batch(sizes, cost))
    shards = [list(range(r, len(sizes), n)) for r in range(n)]
    rows: Schedule = [[] for _ in range(n)]
    for off in range(0, len(shards[0]), m):
        packs: list[list[int]] = []
        for i in (i for sh in shards for i in sh[off:off + m]):
            if packs and _fits(packs[-1] + [i], sizes, cost):
                packs[-1].append(i)
            else:
                packs.append([i])
        need, j = -len(packs) % n, len(packs) - 1
        while need and j >= 0:  # Megatron's rounding: peel singletons off the last packs
            if len(packs[j]) > 1:
                packs.append([packs[j].pop()])
                need -= 1
            else:
                j -= 1
        packs += [[] for _ in range(need)]
        for s in range(len(packs) // n):
            for r in range(n):
                rows[r].append(packs[s * n + r] or None)
    return rows


def kk_micro_batches(sizes: Sequence[Sizes], cost: CostModel, world_size: int, *,
                     samples_per_rank: int | None = None, balance_ranks: bool = True) -> Schedule:
    """Karmarkar-Karp balancing of micro-batches, as verl (and OpenRLHF) describe it.

    Followed: the workload of a sample is ``24576 L + L^2`` (verl's ``calculate_workload``); a
    global batch of ``N * m`` samples is first split across the ranks by KK with equal sizes
    (verl's ``balance_batch``: the controller dispatches, so samples move); then each rank's share
    is cut into k micro-batches by KK with free sizes (``rearrange_micro_batches``), where k starts
    at ``ceil(sum of u)`` (verl: total tokens / ``max_token_len``) and is the same on every rank
    (its ``same_micro_num_in_dp``: the max over ranks); while a micro-batch is over budget, k grows
    by one on every rank and the cut is redone (verl PR #7553: the cap made strict); micro-batches
    run costliest workload first (verl PR #2452), so step j pairs each rank's j-th costliest.

    Chosen here: the global batch is the next ``N * m`` samples in dataset order (the benchmark's
    data is already shuffled), m as in the module legend; ``balance_ranks=False`` deals the global
    batch round-robin instead (``balance_batch`` off).  Needs no length cache; moves samples.
    """
    n = checked_world(world_size)
    m = (_positive("samples_per_rank", samples_per_rank) if samples_per_rank is not None
         else MICRO_BATCHES_PER_STEP * _per_batch(sizes, cost))
    work = [VERL_WORKLOAD_A * s[0] + s[0] * s[0] for s in sizes]
    rows: Schedule = [[] for _ in range(n)]
    for g0 in range(0, len(sizes), n * m):
        gb = list(range(g0, min(g0 + n * m, len(sizes))))
        if balance_ranks:
            parts = [[gb[p] for p in b] for b in karmarkar_karp([work[i] for i in gb], n, equal_size=True)]
        else:
            parts = [gb[r::n] for r in range(n)]
        k = max(1, max(math.ceil(sum(cost.utilisation([sizes[i]]) for i in p) - 1e-9) for p in parts))
        largest = max(len(p) for p in parts)
        while True:
            mbs = [[[p[j] for j in b] for b in karmarkar_karp([work[i] for i in p], k)] for p in parts]
            if all(_fits(b, sizes, cost) for row in mbs for b in row):
                break
            # at k >= the largest share, karmarkar_karp puts every sample alone (its docstring), and singles fit
            assert k < largest, f"karmarkar_karp left two of {largest} samples together in {k} buckets"
            k += 1
        for r in range(n):  # karmarkar_karp returns the heaviest bucket first: costliest first
            rows[r] += [b or None for b in mbs[r]]
    return rows


class Peer(NamedTuple):
    """One peer as the benchmark runs it (called as ``fn(sizes, cost, world_size)``)."""

    key: str             # its method name in the benchmark's report
    fn: Callable[..., Schedule]
    source: str          # whose public description it follows
    length_cache: bool   # reads every sample's length before the epoch starts
    moves_samples: bool  # a sample loaded by one rank's shard may be trained on another rank
    fillers: str         # where a rank gets a filler (None) so that every rank runs as many steps


PEERS: tuple[Peer, ...] = (
    Peer("gmt_shuffled", global_max_tokens_shuffled, "fairseq-style GMT, batch order shuffled", True, False,
         "the last step, when the batches do not divide by N"),
    Peer("hf_rebalance", hf_rebalance, "HF Trainer BatchRebalanceSampler (transformers PR #47340)", True, False,
         "a global batch (the epoch's last) with fewer samples than N x slots groups"),
    Peer("dp_balanced", dp_balanced_packing, "Megatron-Core DpBalancedScheduler", False, True,
         "a global batch whose packs cannot be split to a multiple of N (all singletons)"),
    Peer("kk_micro", kk_micro_batches, "verl / OpenRLHF Karmarkar-Karp micro-batches", False, True,
         "a rank whose share of a global batch makes fewer micro-batches than the common count"),
)
