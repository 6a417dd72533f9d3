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
"""

from .release import ReleasePolicy
from .offline import (Schedule, ScheduleSampler, batch_lower_bound, bucketed_max_tokens, global_max_tokens,
                      memory_equivalent_batch_size, standard, step_lower_bound)

__all__ = ["Schedule", "ScheduleSampler", "standard", "memory_equivalent_batch_size", "global_max_tokens",
           "bucketed_max_tokens", "step_lower_bound", "batch_lower_bound", "ReleasePolicy"]
