"""Compile the state formulas of `models.properties` to Python closures.

Legend
    R      the list of rank tuples of a state (duplicates may be dropped: the
           property language quantifies with Forall/Exists only, which are
           idempotent on duplicate ranks, and it has no rank count)
    G      the global environment values (``k``, ``max_n``...) and cfg

The formula is translated node by node into one Python expression (``Forall`` ->
``all(...)``, ``RF(i, f)`` -> ``r_i[index of f]``...), so the meaning is the one
of `models.logic.value`; `tests/test_explicit.py` checks the compiled closure
against `models.logic.holds` on every reachable state at small N.  A compiled
property reports whether it reads a non-cfg global, so callers may memoise on
the rank set alone when it does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from models.logic import GV, RF, Exists, Forall
from odb.protocol.expr import Cfg, Const, Expr, Let, Op

__all__ = ["Compiled", "compile_formula"]

_PY = {"+": "+", "-": "-", "==": "==", "!=": "!=", "<=": "<=", "<": "<", ">=": ">=", ">": ">"}


@dataclass(frozen=True)
class Compiled:
    """``fn(R, G) -> bool``; `reads_globals` is True if the formula reads ``k`` or the mailbox."""

    fn: Callable
    source: str
    reads_globals: bool


def compile_formula(e: Expr, index: Mapping[str, int], cfg: Mapping[str, int],
                    lets: Mapping[str, Expr] | None = None) -> Compiled:
    """Translate `e` for rank tuples laid out by `index` (field name -> position).

    Raises KeyError for a field or a node the language does not have.
    """
    reads = [False]

    def go(x: Expr) -> str:
        if isinstance(x, Const):
            return repr(x.value)
        if isinstance(x, RF):
            return f"r_{x.rank}[{index[x.field]}]"
        if isinstance(x, GV):
            if x.name in cfg:
                return repr(cfg[x.name])
            reads[0] = True
            return f"G[{x.name!r}]"
        if isinstance(x, Cfg):
            return repr(cfg[x.name])
        if isinstance(x, Let):
            if lets is None or x.name not in lets:
                raise KeyError(f"Let({x.name!r}) is not defined")
            return go(lets[x.name])
        if isinstance(x, Forall):
            return f"all(({go(x.body)}) for r_{x.var} in R)"
        if isinstance(x, Exists):
            return f"any(({go(x.body)}) for r_{x.var} in R)"
        if isinstance(x, Op):
            a = [go(y) for y in x.args]
            if x.op in _PY:
                return f"({a[0]} {_PY[x.op]} {a[1]})"
            if x.op in ("min", "max"):
                return f"{x.op}({a[0]}, {a[1]})"
            if x.op == "and":
                return f"(bool({a[0]}) and bool({a[1]}))"
            if x.op == "or":
                return f"(bool({a[0]}) or bool({a[1]}))"
            if x.op == "not":
                return f"(not {a[0]})"
            if x.op == "ite":
                return f"({a[1]} if {a[0]} else {a[2]})"
        raise KeyError(f"cannot compile node {x!r}")

    body = go(e)
    src = f"lambda R, G: bool({body})"
    return Compiled(eval(compile(src, "<property>", "eval")), src, reads[0])  # noqa: S307 (our own AST)
