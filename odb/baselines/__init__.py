"""Offline and fixed-size baselines the paper compares against (pure; no torch).

Every baseline returns a `Schedule`: ``schedule[rank][step]`` is a list of
dataset indices (one batch) or ``None`` (a zero-weight filler, when a rank has
nothing left for a step the others still run).  `ScheduleSampler` turns one
rank's row into a ``batch_sampler`` for ``torch.utils.data.DataLoader``.

    standard            fixed per-device batch size over a DistributedSampler-style
                        strided shard (``standard(..., batch_size=1)`` is the paper's
                        setting; `memory_equivalent_batch_size` gives the largest fixed
                        size whose worst case fits the same budget)
    global_max_tokens   GMT: sort the whole dataset by a precomputed length cache,
                        pack greedily to the budget, deal batches across ranks
    bucketed_max_tokens BMT: the same inside consecutive buckets of 4096 samples
    step_lower_bound    no schedule of this data under this budget has fewer steps

Peers, RE-IMPLEMENTED FROM THEIR PUBLIC DESCRIPTIONS (`odb.baselines.peers`; its table `PEERS`
says, as data, which need a length cache and which move samples between ranks):

    global_max_tokens_shuffled  GMT with the batch order shuffled (fairseq-style), seeded
    hf_rebalance                HF Trainer's BatchRebalanceSampler (transformers PR #47340)
    dp_balanced_packing         Megatron-Core's DpBalancedScheduler (DP-balanced packing)
    kk_micro_batches            verl / OpenRLHF: Karmarkar-Karp micro-batches, workload 24576 L + L^2
"""

from .kk import karmarkar_karp
from .offline import (
                      Schedule,
                      ScheduleSampler,
                      batch_lower_bound,
                      bucketed_max_tokens,
                      global_max_tokens,
                      memory_equivalent_batch_size,
                      standard,
                      step_lower_bound,
)
from .peers import PEERS, Peer, dp_balanced_packing, global_max_tokens_shuffled, hf_rebalance, kk_micro_batches
from .release import ReleasePolicy

__all__ = ["Schedule", "ScheduleSampler", "standard", "memory_equivalent_batch_size", "global_max_tokens",
           "bucketed_max_tokens", "step_lower_bound", "batch_lower_bound", "ReleasePolicy",
           "global_max_tokens_shuffled", "hf_rebalance", "dp_balanced_packing", "kk_micro_batches", "karmarkar_karp",
           "Peer", "PEERS"]
