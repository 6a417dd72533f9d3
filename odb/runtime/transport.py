"""One rank's round collective on the loader's own gloo group: every rank's header and the loss counts.

Each round every rank posts one `odb.core.header.Post`: an int64 header of the same length H on every
rank (`odb.core.header.HeaderLayout.length`) and 3W int64 counts; `collect` returns the same `Gathered`
on every rank (the N headers, the counts summed over the ranks, each batch's largest token count), in one
of two ways fixed at construction from N and W alone (`counts_mode`), so every rank takes the same one:

    gather   one all-gather of header + counts (N (H + 3W) ints received); sums and maxima computed
             locally.  While that is at most `GATHER_LIMIT` ints: the cheapest round here.
    reduce   two all-reduces: a SUM of one vector holding N header slots (each rank writes its own, the
             others are zero, so the sum is every rank's header) followed by the 3W counts, and a MAX of
             the W token counts.  A rank receives 2 (N-1)/N x (N H + 4W) ints: the counts' share does not
             grow with N.

Both are fixed-shape collectives in a fixed order on every rank; measured side by side in
docs/decisions/2026-12-01-counts-reduced.md (mixing an all-gather with all-reduces in one round was the
slowest on loopback gloo).  `HeaderGather` is what the engine runs and what ``make bench`` times
(`paper_repro.bench_runtime.collective_scaling`), so the measured cost of a round is the runtime's.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch

from ..core.header import Gathered, Post, reduce_posts

__all__ = ["HeaderGather", "counts_mode", "GATHER_LIMIT"]

GATHER_LIMIT = 1 << 17  # ints a rank may receive per round in the all-gather (1 MiB); above it, reduce


def counts_mode(world_size: int, header_len: int, window: int) -> str:
    """"gather" or "reduce" for N ranks, headers of `header_len` ints and window W (module docstring)."""
    return "gather" if world_size * (header_len + 3 * window) <= GATHER_LIMIT else "reduce"


class HeaderGather:
    """Post a rank's `Post`, then collect the round's `Gathered` (``group`` None: world size 1, the rank's own).

    ``post`` starts the round's collectives (`counts_mode`) and returns at once; ``collect`` waits at most
    ``timeout_s`` for all of them together and returns the N headers as an ``(N, H)`` int64 array with the reduced
    counts, raising what gloo raises (timeout, a peer closed the connection).  One post, then one collect,
    per round, in the same order on every rank."""

    def __init__(self, group, world_size: int, mode: str = "reduce"):
        if mode not in ("gather", "reduce"):
            raise ValueError(f"mode must be 'gather' or 'reduce', not {mode!r}")
        self.group, self.world_size, self.mode = group, world_size, mode
        self.rank = 0 if group is None else torch.distributed.get_rank(group=group)
        self._works = self._sums = self._maxes = self._recv = self._solo = None
        self._h = 0

    def post(self, post: Post) -> None:
        """SYNC: every rank must reach this, once per round, in the same order."""
        if self.group is None:
            self._solo, self._works = reduce_posts([post]), None
            return
        n, h = self.world_size, len(post.header)
        self._h = h
        dist, op = torch.distributed, torch.distributed.ReduceOp
        if self.mode == "gather":
            send = torch.tensor([*post.header, *post.counts], dtype=torch.int64)
            self._recv = [torch.empty_like(send) for _ in range(n)]
            # SYNC: every rank must reach this (one fixed-shape all-gather per round)
            self._works = [dist.all_gather(self._recv, send, group=self.group, async_op=True)]
            return
        self._sums = torch.zeros(n * h + len(post.counts), dtype=torch.int64)
        self._sums[self.rank * h:(self.rank + 1) * h] = torch.tensor(post.header, dtype=torch.int64)
        self._sums[n * h:] = torch.tensor(post.counts, dtype=torch.int64)
        self._maxes = torch.tensor(post.counts[0::3], dtype=torch.int64)  # each batch's tokens
        # SYNC: every rank must reach these, in this order (two fixed-shape all-reduces per round)
        self._works = [dist.all_reduce(self._sums, op=op.SUM, group=self.group, async_op=True),
                       dist.all_reduce(self._maxes, op=op.MAX, group=self.group, async_op=True)]

    def collect(self, timeout_s: float) -> Gathered:
        if self._works is None:
            return self._solo
        deadline = time.monotonic() + timeout_s
        try:
            for w in self._works:  # one deadline for the round, not one per collective
                w.wait(timeout=timedelta(seconds=max(0.001, deadline - time.monotonic())))
        finally:
            self._works = None
        n, h = self.world_size, self._h
        if self.mode == "gather":  # every rank's header and counts: the sums and maxima computed here
            a = torch.stack(self._recv).numpy()
            return Gathered(a[:, :h], a[:, h:].sum(axis=0).tolist(), a[:, h::3].max(axis=0).tolist())
        # the headers as the (N, H) int64 array (decoded a field at a time: `odb.core.header.Headers`)
        return Gathered(self._sums[:n * h].view(n, h).numpy(), self._sums[n * h:].tolist(), self._maxes.tolist())

    def release(self) -> None:
        """Drop the hold on the group and the buffers (a group kept alive past the pass would be destroyed
        during interpreter finalization)."""
        self.group = self._works = self._sums = self._maxes = self._recv = self._solo = None
