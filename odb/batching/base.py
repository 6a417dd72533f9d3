"""Interfaces between the runtime and the batching policies (pure; no torch).

A sample enters batching as its *sizes*: a tuple of non-negative ints, one per
resource (resource 0 is always tokens; a multimodal cost model may add image
patches, etc.).  A `CostModel` says what a batch of such samples costs and
whether it fits the budget.  An `AlignmentPolicy` does the three things the
DGAP table leaves open:

1. ``summarize``: a fixed-length int vector describing this rank's window; it
   travels in the round's header (so its length must not depend on local state).
2. ``propose``: the round's target from every rank's summary.  Pure and
   deterministic: every rank calls it with identical arguments and must get the
   same answer.  The table clamps it (``target = max(1, min(proposal, hi))``).
3. ``partition``: split this rank's window into exactly ``real`` non-empty,
   disjoint groups for the round's target; window positions left out are
   carried to the next round.  Each group fits the budget unless it is a single
   over-budget sample.  The runtime also hands it, as the keyword
   ``summaries=``, the round's gathered summaries (every rank's, in rank order,
   identical on every rank; the same list ``propose`` saw), so a policy can
   shape its groups to a per-step cost profile every rank computes alike.

A policy subclasses `AlignmentPolicy`; its optional members are declared there
with their defaults, and a policy overrides the ones it has (nothing is
discovered by probing):

- ``summary_arrays`` (False): True hands the summaries as one read-only
  ``(N, summary_len)`` int64 numpy array (`odb.core.header.Headers.summary_array`,
  a view of the gathered headers) instead of N tuples: at 1,024 ranks the rows
  are about 40,000 Python ints a round (`summaries_for`).
- ``attention`` (0.0): the weight of attention work in a batch's fill, which the
  round exchange posts (`odb.batching.exchange.batch_fill`).
- ``groups(window, cost)`` (None): the whole groups ``partition`` emits from, so
  the dealer can bound a rank's intake (`odb.batching.intake.policy_intake`); None
  makes no promise (the dealer then tops the rank up to the whole window).

The runtime checks every result against the table's contract and raises
`odb.ProtocolError` on a violation, so a buggy policy cannot desynchronise ranks.
"""

from __future__ import annotations

import abc
from itertools import chain
from typing import Protocol, Sequence, runtime_checkable

from ..errors import ConfigError

__all__ = ["Sizes", "CostModel", "AlignmentPolicy", "check_policy", "check_partition", "summaries_for"]

Sizes = tuple[int, ...]


@runtime_checkable
class CostModel(Protocol):
    """What a batch costs, per resource, and whether it fits the budget."""

    name: str

    def batch_cost(self, batch: Sequence[Sizes]) -> tuple[float, ...]:
        """Cost of one batch, one value per budgeted resource."""

    def fits(self, batch: Sequence[Sizes]) -> bool:
        """True if the batch is within every resource's budget."""

    def utilisation(self, batch: Sequence[Sizes]) -> float:
        """Largest cost/budget ratio over resources (1.0 = exactly full)."""


class AlignmentPolicy(abc.ABC):
    """What the DGAP table leaves to the batching policy (module docstring): subclass it, set
    `summary_len`, define the three methods, and override the optional members you have."""

    summary_len: int
    """Ints in `summarize`'s result: a constant (the header's shape must not depend on local state)."""

    summary_arrays: bool = False
    """True: `propose` and `partition` get the summaries as one read-only int64 array (module docstring)."""

    attention: float = 0.0
    """The weight of attention work in a batch's fill, per token of context (0: the budget fill)."""

    def groups(self, window: Sequence[Sizes], cost: CostModel) -> list | None:
        """The whole groups (`odb.batching.grouping.Group`) `partition` emits from, or when asked for more,
        the whole window; None (the default): no such promise, the dealer bounds this rank's intake by W."""
        return None

    @abc.abstractmethod
    def summarize(self, window: Sequence[Sizes], cost: CostModel, exhausted: bool) -> list[int]:
        """This rank's summary of its window, posted in the round's header.

        Must return exactly `summary_len` ints and be a pure function of its arguments.  An exception
        here is this rank's local error: its header posts ``st = FAILED`` and every rank leaves in this
        round through the table's abort (no other rank ever reads the placeholder summary).
        """
        ...

    @abc.abstractmethod
    def propose(self, summaries: Sequence[Sequence[int]], window: int) -> int:
        """The round's target from every rank's summary (rank order) and the window W.

        A replicated decision: every rank calls it with identical arguments and must return the same
        int; it may read nothing else (no rank-local value, no clock, no randomness: a divergence is
        caught by the next round's digest and fails every rank).  Must lie in the table's bounds
        ``[1, W]`` (checked; ProtocolError otherwise); the table then clamps it by the gathered windows.
        Not called in a round whose headers already decide an abort.
        """
        ...

    @abc.abstractmethod
    def partition(self, window: Sequence[Sizes], target: int, real: int, cost: CostModel, *,
                  summaries: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
        """Exactly `real` non-empty, disjoint groups of window positions for the round's `target`.

        Positions left out are carried to the next round (never dropped).  Each group fits the budget
        unless it is one over-budget sample.  `summaries` are the round's gathered summaries (the list
        `propose` saw).  Local to this rank; a result that breaks the contract (checked by
        `check_partition`) is this rank's local error, and every rank leaves through the abort.
        """
        ...


def check_policy(policy) -> None:
    """ConfigError unless `policy` is an `AlignmentPolicy` (a subclass's instance: its optional members
    then have their declared defaults) with an int ``summary_len`` >= 0."""
    if not isinstance(policy, AlignmentPolicy):
        raise ConfigError(f"policy={policy!r} is not an odb.batching.AlignmentPolicy: subclass it (it declares the "
                          "optional members summary_arrays, attention and groups with their defaults)")
    n = getattr(policy, "summary_len", None)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"policy {type(policy).__name__} has summary_len={n!r}: it must be an int >= 0 (the "
                          "ints its summarize returns)")


def summaries_for(policy: AlignmentPolicy, rows) -> "Sequence[Sequence[int]]":
    """What `policy`'s ``propose`` and ``partition`` read of the gathered headers `rows`
    (`odb.core.header.Headers`): the summaries as one array if the policy sets ``summary_arrays``
    (module docstring), else as rows.  Either is kept by `rows`, so both calls of a round get the
    same object."""
    return rows.summary_array if policy.summary_arrays is True else rows.summaries


def check_partition(groups: Sequence[Sequence[int]], n: int, real: int, window: Sequence[Sizes],
                    cost: CostModel) -> None:
    """Raise ValueError unless `groups` satisfies the partition contract above."""
    if len(groups) != real:
        raise ValueError(f"partition returned {len(groups)} groups, the table decided {real}")
    flat = list(chain.from_iterable(groups))
    if not (all(groups) and len(set(flat)) == len(flat) and (not flat or 0 <= min(flat) and max(flat) < n)):
        seen: set[int] = set()  # some group is at fault: name the first position that is
        for g in groups:
            if not g:
                raise ValueError("partition returned an empty group")
            for p in g:
                if not 0 <= p < n or p in seen:
                    raise ValueError(f"partition position {p} is out of range or repeated (window of {n})")
                seen.add(p)
    over = getattr(cost, "first_over", None)  # a `BudgetCost`: every group in one pass per resource
    k = over(groups, window) if over is not None else next(
        (k for k, g in enumerate(groups) if len(g) > 1 and not cost.fits([window[p] for p in g])), None)
    if k is not None:
        raise ValueError(f"partition group {list(groups[k])} exceeds the budget")
