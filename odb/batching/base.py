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
   shape its groups to a per-step cost profile every rank computes alike.  The
   keyword is optional: a policy whose ``partition`` has no ``summaries``
   parameter (nor ``**kwargs``) is called without it (`call_partition`), and a
   direct call without it passes ``None``.

The summaries come as N rows (tuples of ints), or, to a policy whose class sets
``summary_arrays = True``, as one read-only ``(N, summary_len)`` int64 numpy
array (`odb.core.header.Headers.summary_array`, a view of the gathered headers):
at 1,024 ranks the rows are about 40,000 Python ints a round, which the default
policy does not need (`summaries_for`).

The runtime checks every result against the table's contract and raises
`odb.ProtocolError` on a violation, so a buggy policy cannot desynchronise ranks.
"""

from __future__ import annotations

import functools
import inspect
from itertools import chain
from typing import Protocol, Sequence, runtime_checkable

__all__ = ["Sizes", "CostModel", "AlignmentPolicy", "check_partition", "call_partition", "summaries_for"]

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


@runtime_checkable
class AlignmentPolicy(Protocol):
    """What the DGAP table leaves to the batching policy (module docstring)."""

    summary_len: int
    """Ints in `summarize`'s result: a constant (the header's shape must not depend on local state)."""

    def summarize(self, window: Sequence[Sizes], cost: CostModel, exhausted: bool) -> list[int]:
        """This rank's summary of its window, posted in the round's header.

        Must return exactly `summary_len` ints and be a pure function of its arguments.  An exception
        here is this rank's local error: its header posts ``st = FAILED`` and every rank leaves in this
        round through the table's abort (no other rank ever reads the placeholder summary).
        """
        ...

    def propose(self, summaries: Sequence[Sequence[int]], window: int) -> int:
        """The round's target from every rank's summary (rank order) and the window W.

        A replicated decision: every rank calls it with identical arguments and must return the same
        int; it may read nothing else (no rank-local value, no clock, no randomness: a divergence is
        caught by the next round's digest and fails every rank).  Must lie in the table's bounds
        ``[1, W]`` (checked; ProtocolError otherwise); the table then clamps it by the gathered windows.
        Not called in a round whose headers already decide an abort.
        """
        ...

    def partition(self, window: Sequence[Sizes], target: int, real: int, cost: CostModel, *,
                  summaries: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
        """Exactly `real` non-empty, disjoint groups of window positions for the round's `target`.

        Positions left out are carried to the next round (never dropped).  Each group fits the budget
        unless it is one over-budget sample.  `summaries` are the round's gathered summaries (the list
        `propose` saw).  Local to this rank; a result that breaks the contract (checked by
        `check_partition`) is this rank's local error, and every rank leaves through the abort.
        """
        ...


def _takes_summaries(fn) -> bool:
    f = getattr(fn, "__func__", fn)  # a bound method's function: the same object every round
    try:
        return _function_takes_summaries(f)
    except TypeError:  # an unhashable callable: look at it every time
        return _signature_takes_summaries(f)


@functools.lru_cache(maxsize=256)
def _function_takes_summaries(fn) -> bool:
    return _signature_takes_summaries(fn)


def _signature_takes_summaries(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: the old contract
        return False
    return any(p.name == "summaries" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
               or p.kind == p.VAR_KEYWORD for p in params)


def summaries_for(policy: AlignmentPolicy, rows) -> "Sequence[Sequence[int]]":
    """What `policy`'s ``propose`` and ``partition`` read of the gathered headers `rows`
    (`odb.core.header.Headers`): the summaries as one array if the policy sets ``summary_arrays``
    (module docstring), else as rows.  Either is kept by `rows`, so both calls of a round get the
    same object."""
    return rows.summary_array if getattr(policy, "summary_arrays", False) is True else rows.summaries


def call_partition(policy: AlignmentPolicy, window: Sequence[Sizes], target: int, real: int, cost: CostModel,
                   summaries: Sequence[Sequence[int]]) -> list[list[int]]:
    """``policy.partition(window, target, real, cost, summaries=summaries)``, or without the
    keyword when the policy's ``partition`` does not accept it (a policy written before the
    keyword existed keeps working, without the gathered summaries).  Deterministic: the
    choice depends only on the policy's signature, the same on every rank.  The result is
    not checked here; call `check_partition`.
    """
    if _takes_summaries(policy.partition):
        return policy.partition(window, target, real, cost, summaries=summaries)
    return policy.partition(window, target, real, cost)


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
