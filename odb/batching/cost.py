"""Cost models: what a batch costs and whether it fits the budget (pure; no torch).

Legend
    L       a sample's size in resource r (``sizes[r]``; resource 0 is tokens)
    B       the budget of a resource
    batch   a sequence of samples' sizes (tuples of non-negative ints)

Kinds of per-resource cost (every one is monotone: removing samples from a
batch never raises its cost, which the grouping and the property tests rely on):

    padded      ``len(batch) * max(L)``: what a padded ``[batch, longest]`` tensor
                holds.  B is the padded-token budget (the released package's unit).
    packed      ``sum(L)``: padding-free packing (varlen attention,
                ``DataCollatorWithFlattening``).  B is the real-token budget.
    quadratic   ``sum(a * L + b * L**2)``: attention-aware, padding-free.  Defaults
                ``a = 1``, ``b = 1 / 24576`` (the workload estimate ``24576 L + L^2``
                that verl uses, scaled so one token costs about 1).  B is then in
                *linear-token equivalents*: a batch of short samples holds about B
                tokens; one sample of length L alone costs ``L * (1 + L / 24576)``,
                so the longest single sample that fits B = 8192 is 6,442 tokens
                and B = 16384 fits 11,374.

A multi-resource model gives each resource its own kind and budget (e.g. tokens
packed under 8192 and image patches packed under 4096); a batch fits when it
fits every one.  A callable model wraps ``fn(batch) -> float | tuple`` with one
budget per returned value; it must itself be monotone (not checkable here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import itemgetter
from typing import Callable, Mapping, Sequence

from ..errors import ConfigError
from .base import CostModel, Sizes

__all__ = ["Resource", "BudgetCost", "CallableCost", "make_cost_model", "KINDS",
           "QUADRATIC_A", "QUADRATIC_B"]

KINDS = ("padded", "packed", "quadratic")
QUADRATIC_A = 1.0
QUADRATIC_B = 1.0 / 24576.0


@dataclass(frozen=True, kw_only=True)
class Resource:
    """One budgeted resource: ``sizes[index]`` costed by `kind` under `budget`."""

    name: str
    index: int
    kind: str
    budget: float
    a: float = QUADRATIC_A
    b: float = QUADRATIC_B

    def item(self, s: Sizes) -> float:
        """The cost one sample adds to an additive (packed/quadratic) batch."""
        L = s[self.index] if self.index < len(s) else 0
        if self.kind == "quadratic":
            return self.a * L + self.b * L * L
        return L

    def figures(self, batch: Sequence[Sizes]) -> list:
        """Each sample's figure, in order: its size of this resource (none if it lacks it); for quadratic, `item`."""
        i = self.index
        if self.kind != "quadratic":
            try:  # every sample carries this resource (the common case): one C-level pass
                return list(map(itemgetter(i), batch))
            except IndexError:  # a sample without it has none of it
                return [s[i] if i < len(s) else 0 for s in batch]
        return list(map(self.item, batch))

    def cost(self, batch: Sequence[Sizes]) -> float:
        if not batch:
            return 0.0
        f = self.figures(batch)
        return len(f) * max(f) if self.kind == "padded" else sum(f)


@dataclass(frozen=True)
class BudgetCost:
    """A cost model of one or more `Resource`s (see the module docstring)."""

    name: str
    resources: tuple[Resource, ...]

    @property
    def budgets(self) -> tuple[float, ...]:
        return tuple(r.budget for r in self.resources)

    def batch_cost(self, batch: Sequence[Sizes]) -> tuple[float, ...]:
        return tuple(r.cost(batch) for r in self.resources)

    def fits(self, batch: Sequence[Sizes]) -> bool:
        for r in self.resources:
            if r.cost(batch) > r.budget:
                return False
        return True

    def utilisation(self, batch: Sequence[Sizes]) -> float:
        return max(r.cost(batch) / r.budget for r in self.resources)

    def first_over(self, groups: Sequence[Sequence[int]], window: Sequence[Sizes]) -> int | None:
        """The first of `groups` (positions into `window`) of two or more samples that `fits` refuses, or None:
        what a loop over `fits` finds, each resource's per-sample figures read once (the same costs, summed in
        the same order)."""
        first = len(groups)
        for r in self.resources:
            get, padded, B = r.figures(window).__getitem__, r.kind == "padded", r.budget
            for k in range(first):
                g = groups[k]
                if len(g) > 1 and (len(g) * max(map(get, g)) if padded else sum(map(get, g))) > B:
                    first = k
                    break
        return first if first < len(groups) else None

    def additive_lower_bound(self) -> bool:
        """True: the sum of single-sample costs never exceeds a batch's cost (used by the step lower bound)."""
        return True


@dataclass(frozen=True)
class CallableCost:
    """``fn(batch) -> float | tuple[float, ...]`` under one budget per value.

    `fn` must be deterministic and monotone (a sub-batch never costs more); the
    grouping calls it O(window * group size) times per round.
    """

    name: str
    fn: Callable[[Sequence[Sizes]], float | Sequence[float]]
    budgets: tuple[float, ...]

    def batch_cost(self, batch: Sequence[Sizes]) -> tuple[float, ...]:
        v = self.fn(batch)
        out = (float(v),) if isinstance(v, (int, float)) else tuple(float(x) for x in v)
        if len(out) != len(self.budgets):
            raise ConfigError(
                f"cost callable {self.name!r} returned {len(out)} values for {len(self.budgets)} budgets "
                f"({self.budgets}); every batch would be judged against the wrong budget; "
                "return one value per budget")
        return out

    def fits(self, batch: Sequence[Sizes]) -> bool:
        return all(c <= b for c, b in zip(self.batch_cost(batch), self.budgets))

    def utilisation(self, batch: Sequence[Sizes]) -> float:
        return max(c / b for c, b in zip(self.batch_cost(batch), self.budgets))

    def additive_lower_bound(self) -> bool:
        return False


def _budget(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(
            f"budget for {name!r} must be a positive finite number, got {v!r}; "
            "no batch could be formed; pass e.g. 8192")
    return float(v)


def _kind(v: str) -> str:
    if v not in KINDS:
        raise ConfigError(f"unknown cost kind {v!r}; valid kinds: {list(KINDS)} (or a callable, or a mapping)")
    return v


def make_cost_model(spec, budget=None) -> CostModel:
    """Build a cost model.

    :param spec: ``"padded" | "packed" | "quadratic"``; a callable
        ``fn(batch) -> float | tuple`` (then `budget` is a number or a tuple,
        one per value); a mapping resource name -> budget or ``(kind, budget)``
        (the i-th entry budgets ``sizes[i]``; the first must be ``"tokens"``;
        a bare budget means ``packed``); or an existing `CostModel` (returned
        as is when `budget` is None).
    :param budget: the budget for a string or callable spec.  With a string
        spec it may also be a mapping resource name -> budget, which applies
        the spec's kind to every resource.
    :raises ConfigError: unknown kind, non-positive budget, a budget given
        twice or missing, or a mapping that does not start with ``"tokens"``.
    """
    if isinstance(spec, (BudgetCost, CallableCost)) or (
            not isinstance(spec, (str, Mapping)) and not callable(spec) and isinstance(spec, CostModel)):
        if budget is not None:
            raise ConfigError(f"a ready cost model {spec.name!r} was given together with budget={budget!r}; "
                              "the budget would be ignored; pass only one")
        return spec
    if isinstance(spec, str):
        kind = _kind(spec)
        if budget is None:
            raise ConfigError(f"cost {spec!r} needs a budget; batches cannot be sized; pass budget=8192")
        if isinstance(budget, Mapping):
            return _from_mapping({k: (kind, v) for k, v in budget.items()})
        return BudgetCost(kind, (Resource(name="tokens", index=0, kind=kind, budget=_budget("tokens", budget)),))
    if isinstance(spec, Mapping):
        if budget is not None:
            raise ConfigError(f"a per-resource mapping {dict(spec)!r} already holds the budgets, "
                              f"but budget={budget!r} was also given; pass only the mapping")
        return _from_mapping(spec)
    if callable(spec):
        if budget is None:
            raise ConfigError("a callable cost needs budget= (a number, or one per returned value)")
        bs = (budget,) if isinstance(budget, (int, float)) else tuple(budget)
        name = getattr(spec, "__name__", "callable")
        return CallableCost(name, spec, tuple(_budget(name, b) for b in bs))
    raise ConfigError(f"cost spec {spec!r} of type {type(spec).__name__} is not understood; valid: "
                      f"{list(KINDS)}, a callable, a mapping resource -> budget, or a CostModel")


def _from_mapping(spec: Mapping) -> BudgetCost:
    names = list(spec)
    if not names or names[0] != "tokens":
        raise ConfigError(f"a multi-resource budget must list 'tokens' first (resource 0), got {names}; "
                          "reorder it, e.g. {'tokens': 8192, 'image_patches': 4096}")
    res = []
    for i, (name, v) in enumerate(spec.items()):
        kind, b = (v if isinstance(v, tuple) else ("packed", v))
        res.append(Resource(name=str(name), index=i, kind=_kind(kind), budget=_budget(str(name), b)))
    label = "+".join(f"{r.name}:{r.kind}" for r in res)
    return BudgetCost(label, tuple(res))
