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

The runtime checks every result against the table's contract and raises
`odb.ProtocolError` on a violation, so a buggy policy cannot desynchronise ranks.
"""

from __future__ import annotations

import inspect
from typing import Protocol, Sequence, runtime_checkable

__all__ = ["Sizes", "CostModel", "AlignmentPolicy", "check_partition", "call_partition"]

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
    summary_len: int

    def summarize(self, window: Sequence[Sizes], cost: CostModel, exhausted: bool) -> list[int]:
        ...

    def propose(self, summaries: Sequence[Sequence[int]], window: int) -> int:
        ...

    def partition(self, window: Sequence[Sizes], target: int, real: int, cost: CostModel, *,
                  summaries: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
        ...


def _takes_summaries(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: the old contract
        return False
    return any(p.name == "summaries" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
               or p.kind == p.VAR_KEYWORD for p in params)


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
    seen: set[int] = set()
    for g in groups:
        if not g:
            raise ValueError("partition returned an empty group")
        for p in g:
            if not 0 <= p < n or p in seen:
                raise ValueError(f"partition position {p} is out of range or repeated (window of {n})")
            seen.add(p)
        if len(g) > 1 and not cost.fits([window[p] for p in g]):
            raise ValueError(f"partition group {list(g)} exceeds the budget")
