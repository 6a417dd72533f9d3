"""One rank's round collective on the loader's own gloo group: headers all-gathered, loss counts reduced.

Each round every rank posts one `odb.core.header.Post`: an int64 header of the same length on every
rank (`odb.core.header.HeaderLayout.length`), all-gathered, and 3W int64 counts, all-reduced twice:
their sum (exact loss scaling) and the max of every batch's tokens (the straggler estimate).  Three
fixed-shape collectives, in this order, every round, on every rank.  A rank receives N headers of
``7 + S + 4 + L`` ints and 4W reduced ints: what it receives for the counts does not grow with N.
`HeaderGather` is what the engine runs and what ``make bench`` times
(`paper_repro.bench_runtime.collective_scaling`), so the measured cost of a round is the runtime's.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch

from ..core.header import Gathered, Post, reduce_posts

__all__ = ["HeaderGather"]


class HeaderGather:
    """Post a rank's `Post`, then collect the round's `Gathered` (``group`` None: world size 1, the rank's own).

    ``post`` starts the three collectives and returns at once; ``collect`` waits at most ``timeout_s`` for
    all of them together and returns the N headers as lists of ints with the reduced counts, raising what
    gloo raises (timeout, a peer closed the connection).  One post, then one collect, per round, in the same
    order on every rank."""

    def __init__(self, group, world_size: int):
        self.group, self.world_size = group, world_size
        self._works = self._recv = self._solo = self._sums = self._maxes = None

    def post(self, post: Post) -> None:
        """SYNC: every rank must reach this, once per round, in the same order."""
        if self.group is None:
            self._solo, self._works = reduce_posts([post]), None
            return
        send = torch.tensor(post.header, dtype=torch.int64)
        self._sums = torch.tensor(post.counts, dtype=torch.int64)
        self._maxes = self._sums[0::3].clone()  # each batch's tokens
        self._recv = [torch.empty_like(send) for _ in range(self.world_size)]
        op = torch.distributed.ReduceOp
        # SYNC: every rank must reach these, in this order (three fixed-shape collectives per round)
        self._works = [torch.distributed.all_gather(self._recv, send, group=self.group, async_op=True),
                       torch.distributed.all_reduce(self._sums, op=op.SUM, group=self.group, async_op=True),
                       torch.distributed.all_reduce(self._maxes, op=op.MAX, group=self.group, async_op=True)]

    def collect(self, timeout_s: float) -> Gathered:
        if self._works is None:
            return self._solo
        deadline = time.monotonic() + timeout_s
        try:
            for w in self._works:  # one deadline for the round, not one per collective
                w.wait(timeout=timedelta(seconds=max(0.001, deadline - time.monotonic())))
        finally:
            self._works = None
        return Gathered([t.tolist() for t in self._recv], self._sums.tolist(), self._maxes.tolist())

    def release(self) -> None:
        """Drop the hold on the group and the buffers (a group kept alive past the pass would be destroyed
        during interpreter finalization)."""
        self.group = self._works = self._recv = self._solo = self._sums = self._maxes = None
