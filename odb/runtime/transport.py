"""One rank's round collective: its header all-gathered with every rank's, on the loader's own gloo group.

Each round every rank posts one int64 vector of the same length (`odb.core.header.HeaderLayout`) and
collects all N in rank order.  `HeaderGather` is what the engine runs and what ``make bench`` times
(`paper_repro.bench_runtime.collective_scaling`), so the measured cost of a round is the runtime's.
"""

from __future__ import annotations

from datetime import timedelta

import torch

__all__ = ["HeaderGather"]


class HeaderGather:
    """Post a header, then collect every rank's (``group`` None: world size 1, the rank's own only).

    ``post`` starts the all-gather and returns at once; ``collect`` waits at most ``timeout_s`` and
    returns the N headers as lists of ints, raising what gloo raises (timeout, a peer closed the
    connection).  One post, then one collect, per round, in the same order on every rank."""

    def __init__(self, group, world_size: int):
        self.group, self.world_size = group, world_size
        self._work = self._recv = self._solo = None

    def post(self, header: list[int]) -> None:
        """SYNC: every rank must reach this, once per round, in the same order."""
        if self.group is None:
            self._solo, self._work = [header], None
            return
        send = torch.tensor(header, dtype=torch.int64)
        self._recv = [torch.empty_like(send) for _ in range(self.world_size)]
        # SYNC: every rank must reach this (one fixed-shape all-gather per round)
        self._work = torch.distributed.all_gather(self._recv, send, group=self.group, async_op=True)

    def collect(self, timeout_s: float) -> list[list[int]]:
        if self._work is None:
            return self._solo
        try:
            self._work.wait(timeout=timedelta(seconds=timeout_s))
        finally:
            self._work = None
        return [t.tolist() for t in self._recv]

    def release(self) -> None:
        """Drop the hold on the group and the buffers (a group kept alive past the pass would be destroyed
        during interpreter finalization)."""
        self.group = self._work = self._recv = self._solo = None
