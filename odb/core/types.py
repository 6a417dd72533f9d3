"""The values that cross rooms: a sample from the source to the core, a batch from the core to the
consumer or the transport, and a rank's stop status.  Pure: no torch.

Legend
    raw item   what a data source returns: ``(position, index, sample, measure)``, ``measure`` being
               ``(sizes, label tokens)``, None (a drop) or a `Failure`
    status     a rank's stop status, the table's ``in.quit``: OK, CLOSED (the consumer stopped), FAILED
               (a local error); the first non-OK value stays
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["OK", "CLOSED", "FAILED", "Failure", "Item", "Batch", "Interrupted"]

OK, CLOSED, FAILED = 0, 1, 2


class Interrupted(Exception):
    """Raised by a data source's ``next`` that gave up waiting because the rank must stop."""


class Failure(NamedTuple):
    """An exception raised while preprocessing (``stage="preprocessing"``) or measuring one sample."""

    stage: str
    type: str
    message: str
    tb: str


class Item(NamedTuple):
    """One usable sample in the window."""

    pos: int
    index: Any
    sample: Any
    sizes: tuple
    labels: int


class Batch:
    """One batch on its way to the consumer: samples and, once released, their `StepInfo`.  ``counts``:
    (tokens, label tokens, samples); ``indices`` None for a zero-weight filler; ``lane``: the lane of its
    pool it runs on (`odb.core.placement`)."""

    __slots__ = ("samples", "positions", "indices", "sizes", "counts", "info", "lane")

    def __init__(self, samples, positions, indices, sizes, counts, info=None, lane=0):
        self.samples, self.positions, self.indices = samples, positions, indices
        self.sizes, self.counts, self.info, self.lane = sizes, counts, info, lane

    @property
    def filler(self) -> bool:
        return self.indices is None
