"""Formulas over a whole system state (all ranks + environment), for properties and invariants.

Legend (leaf nodes, in addition to `odb.protocol.expr`):
    RF(i, f)     field ``f`` of rank variable ``i``: a table field (``buf``, ``ph``...)
                 or a per-rank environment field (`RANK_ENV`: ``src``, ``d``, ``posted``, ``pshape``)
    GV(g)        a global environment value (`GLOBAL_ENV`: ``k``, the collective
                 inputs of the last completed round) or a cfg constant (``W``, ``mode``)
    Forall(i, body), Exists(i, body)
                 quantifiers over ranks 0 <= i < N

The concrete evaluator is `holds`; the z3 engine interprets the same nodes over
arrays (``proofs/symbolic``).  Properties are written once, here and in
`models.properties`, never beside an engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from odb.protocol.expr import Expr, Scope, evaluate

__all__ = ["RF", "GV", "Forall", "Exists", "RANK_ENV", "GLOBAL_ENV", "holds", "value"]

# Per-rank environment fields (not visible to the rank's guards).
RANK_ENV = {
    "src": "samples the rank's data source still holds",
    "d": "samples the rank's data source held initially (constant)",
    "posted": "1 if the rank's header for the current collective is in the mailbox, else 0",
    "pn": "the posted header's n (meaningful when posted == 1)",
    "pshape": "the posted header's shape (meaningful when posted == 1)",
    "qt": "the rank's local stop status as the environment set it (0: running; 1: must stop)",
    "pst": "the posted header's status (meaningful when posted == 1)",
}
# Global environment values.
GLOBAL_ENV = {
    "k": "collectives completed so far",
    "max_st": "aggregate of the last completed collective",
    "max_n": "aggregate of the last completed collective",
    "min_n": "aggregate of the last completed collective",
    "min_pos_n": "aggregate of the last completed collective",
    "proposal": "the policy's proposal in the last completed collective",
}


@dataclass(frozen=True)
class RF(Expr):
    rank: str
    field: str


@dataclass(frozen=True)
class GV(Expr):
    name: str


@dataclass(frozen=True)
class Forall(Expr):
    var: str
    body: Expr


@dataclass(frozen=True)
class Exists(Expr):
    var: str
    body: Expr


def value(e: Expr, state, bind: Mapping[str, int] | None = None):
    """Concrete value of `e` in `state` (a `models.env.SysState`) under rank bindings `bind`."""
    bind = dict(bind or {})

    def resolve(node: Expr, s: Scope):
        if isinstance(node, RF):
            return state.rank_value(bind[node.rank], node.field)
        if isinstance(node, GV):
            return state.global_value(node.name)
        if isinstance(node, Forall):
            return all(value(node.body, state, {**bind, node.var: i}) for i in range(state.n))
        if isinstance(node, Exists):
            return any(value(node.body, state, {**bind, node.var: i}) for i in range(state.n))
        raise KeyError(f"unknown node {node!r}")

    return evaluate(e, Scope(cfg=state.cfg, resolve=resolve))


def holds(e: Expr, state, bind: Mapping[str, int] | None = None) -> bool:
    return bool(value(e, state, bind))
