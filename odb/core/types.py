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

__all__ = ["OK", "CLOSED", "FAILED", "Failure", "Item", "Counts", "COUNTS_LEN", "NO_COUNTS", "counts_at", "put_counts",
           "Batch", "Interrupted", "FillerContent"]

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


class Counts(NamedTuple):
    """A batch's counts, as a rank posts them for the round's sum over the ranks (`odb.core.header.Post`): its
    real tokens, its label tokens and its samples (0, 0, 0 for a filler).  `odb.core.info.LOSS_BASES` indexes it."""

    tokens: int
    labels: int
    samples: int


COUNTS_LEN = len(Counts._fields)  # ints a batch slot takes in a round's vector of counts
NO_COUNTS = Counts(0, 0, 0)


def counts_at(vector, k: int) -> Counts:
    """Batch slot `k`'s counts in a round's vector of counts (`COUNTS_LEN` ints a slot)."""
    return Counts._make(vector[COUNTS_LEN * k:COUNTS_LEN * (k + 1)])


def put_counts(vector: list, k: int, counts) -> None:
    """Batch slot `k`'s counts into a round's vector of counts, in place."""
    vector[COUNTS_LEN * k:COUNTS_LEN * (k + 1)] = counts


class Batch:
    """One batch on its way to the consumer: samples and, once released, their `StepInfo`.  ``counts``: its
    `Counts` (a plain triple is taken as one); ``indices`` None for a zero-weight filler; ``lane``: the lane of
    its pool it runs on (`odb.core.placement`)."""

    __slots__ = ("samples", "positions", "indices", "sizes", "counts", "info", "lane")

    def __init__(self, samples, positions, indices, sizes, counts, info=None, lane=0):
        self.samples, self.positions, self.indices = samples, positions, indices
        self.counts = counts if type(counts) is Counts else Counts._make(counts)
        self.sizes, self.info, self.lane = sizes, info, lane

    @property
    def filler(self) -> bool:
        return self.indices is None


class FillerContent:
    """What a rank's zero-weight fillers replay: the cheapest sample within the budget it has seen (never an
    over-budget one); while none fits, `build` asks ``make(fallback)``, the cheapest over-budget sample seen
    (None if none), for one (the loader cuts it to the budget or finds another; it may raise)."""

    __slots__ = ("sample", "_cost", "_fallback", "_fallback_cost", "_make")

    def __init__(self, make):
        self.sample: Any = None
        self._cost = 0
        self._fallback: Any = None
        self._fallback_cost = 0
        self._make = make

    def see(self, sample: Any, cost: int, fits: bool) -> None:
        """A usable sample of `cost` entered the window."""
        if fits:  # fillers replay the cheapest sample within budget seen (never an oversize one)
            if self.sample is None or cost < self._cost:
                self.sample, self._cost = sample, cost
        elif self.sample is None and (self._fallback is None or cost < self._fallback_cost):
            self._fallback, self._fallback_cost = sample, cost

    def build(self) -> None:
        """No sample within the budget seen yet: ask for one (may raise)."""
        self.sample = self._make(self._fallback)
