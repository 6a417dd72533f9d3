"""A tiny expression language for the DGAP table, with a concrete interpreter.

Legend: an expression is an immutable tree of `Expr` nodes.  Leaves name the
values a guard or an update may read:

    Const(v)     an integer or boolean literal
    Field(f)     a field of the acting rank's local state (see `table.FIELDS`)
    Input(i)     a value the environment hands to the rank at this step: the data
                 source's answer, or the reduced result of a collective
    Hdr(h)       a field of one rank's posted header (only inside an `Aggregate`)
    Cfg(c)       a configuration constant: the window ``W`` or the ``mode``
    Param(p)     a value chosen by the rank's grouping policy within bounds the row states
    Let(name)    a named derived expression of the table (expanded on evaluation)

Inner nodes are `Op(op, args)` with ``op`` in `OPS`.  Booleans and integers
share one domain in the concrete interpreter (``True == 1``); the z3 interpreter
(`to_z3`) keeps them apart, so the table must be well typed (`typecheck`).

Why not lambdas: Python's ``and``/``or``/``if``/``min`` do not lift to z3 terms,
and ``==`` on z3 terms silently compares syntax.  A tree can also be rendered,
hashed and mutated, which the proofs need.

Neither torch nor z3 is imported here; `to_z3` imports z3 when it is called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple, Union

__all__ = [
    "Expr", "Const", "Field", "Input", "Hdr", "Cfg", "Param", "Let", "Op", "OPS", "Lazy",
    "add", "sub", "mn", "mx", "eq", "ne", "le", "lt", "ge", "gt", "and_", "or_", "not_",
    "ite", "implies", "lift", "evaluate", "compiled", "compiled_tuple", "render", "leaves", "typecheck", "to_z3",
    "Scope",
]


class Expr:
    """Base class of expression nodes.  Arithmetic operators build `Op` nodes."""

    __slots__ = ()

    def __add__(self, other: "ExprLike") -> "Op":
        return add(self, other)

    def __radd__(self, other: "ExprLike") -> "Op":
        return add(other, self)

    def __sub__(self, other: "ExprLike") -> "Op":
        return sub(self, other)

    def __rsub__(self, other: "ExprLike") -> "Op":
        return sub(other, self)


ExprLike = Union[Expr, int, bool]


@dataclass(frozen=True)
class Const(Expr):
    value: int | bool


@dataclass(frozen=True)
class Field(Expr):
    name: str


@dataclass(frozen=True)
class Input(Expr):
    name: str


@dataclass(frozen=True)
class Hdr(Expr):
    name: str


@dataclass(frozen=True)
class Cfg(Expr):
    name: str


@dataclass(frozen=True)
class Param(Expr):
    name: str


@dataclass(frozen=True)
class Let(Expr):
    name: str


# op -> (arity, result kind, argument kind); kinds: "int", "bool", "any" (same as other arg)
OPS: dict[str, tuple[int, str, str]] = {
    "+": (2, "int", "int"),
    "-": (2, "int", "int"),
    "min": (2, "int", "int"),
    "max": (2, "int", "int"),
    "==": (2, "bool", "any"),
    "!=": (2, "bool", "any"),
    "<=": (2, "bool", "int"),
    "<": (2, "bool", "int"),
    ">=": (2, "bool", "int"),
    ">": (2, "bool", "int"),
    "and": (2, "bool", "bool"),
    "or": (2, "bool", "bool"),
    "not": (1, "bool", "bool"),
    "ite": (3, "any", "any"),
}


@dataclass(frozen=True)
class Op(Expr):
    op: str
    args: tuple[Expr, ...]

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown operator {self.op!r}; valid: {sorted(OPS)}")
        if len(self.args) != OPS[self.op][0]:
            raise ValueError(f"operator {self.op!r} takes {OPS[self.op][0]} arguments, got {len(self.args)}")


def lift(x: ExprLike) -> Expr:
    """Wrap a Python int/bool as `Const`; pass expressions through."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, (bool, int)):
        return Const(x)
    raise TypeError(f"cannot use {type(x).__name__} {x!r} in a table expression")


def implies(a: ExprLike, b: ExprLike) -> Op:
    return or_(not_(a), b)  # type: ignore[return-value]


def _op(op: str, *args: ExprLike) -> Op:
    return Op(op, tuple(lift(a) for a in args))


def add(a: ExprLike, b: ExprLike) -> Op: return _op("+", a, b)
def sub(a: ExprLike, b: ExprLike) -> Op: return _op("-", a, b)
def mn(a: ExprLike, b: ExprLike) -> Op: return _op("min", a, b)
def mx(a: ExprLike, b: ExprLike) -> Op: return _op("max", a, b)
def eq(a: ExprLike, b: ExprLike) -> Op: return _op("==", a, b)
def ne(a: ExprLike, b: ExprLike) -> Op: return _op("!=", a, b)
def le(a: ExprLike, b: ExprLike) -> Op: return _op("<=", a, b)
def lt(a: ExprLike, b: ExprLike) -> Op: return _op("<", a, b)
def ge(a: ExprLike, b: ExprLike) -> Op: return _op(">=", a, b)
def gt(a: ExprLike, b: ExprLike) -> Op: return _op(">", a, b)
def not_(a: ExprLike) -> Op: return _op("not", a)
def ite(c: ExprLike, a: ExprLike, b: ExprLike) -> Op: return _op("ite", c, a, b)


def and_(*args: ExprLike) -> Expr:
    """Left-nested conjunction; ``and_()`` is ``True``."""
    if not args:
        return Const(True)
    out = lift(args[0])
    for a in args[1:]:
        out = _op("and", out, a)
    return out


def or_(*args: ExprLike) -> Expr:
    """Left-nested disjunction; ``or_()`` is ``False``."""
    if not args:
        return Const(False)
    out = lift(args[0])
    for a in args[1:]:
        out = _op("or", out, a)
    return out


class Scope(NamedTuple):
    """What an expression may read during one evaluation.

    Each mapping is looked up by leaf kind.  `lets` maps a name to its
    expression; a `Let` leaf is evaluated in the same scope.  A missing name
    raises `KeyError` naming the leaf, so an incomplete environment is never
    silently read as zero.  A NamedTuple: the runtime builds two or three per
    step, at half a frozen dataclass's cost.
    """

    fields: Mapping[str, int] = None  # type: ignore[assignment]
    inputs: Mapping[str, int] = None  # type: ignore[assignment]
    hdr: Mapping[str, int] = None  # type: ignore[assignment]
    cfg: Mapping[str, int] = None  # type: ignore[assignment]
    params: Mapping[str, int] = None  # type: ignore[assignment]
    lets: Mapping[str, Expr] = None  # type: ignore[assignment]
    resolve: Callable[[Expr, "Scope"], int] | None = None
    """Evaluates node kinds this module does not know (e.g. the quantifiers of ``models.logic``)."""


def evaluate(e: Expr, s: Scope) -> int:
    """Concrete value of `e` in scope `s` (booleans come back as bool).

    The tree is compiled once into a Python function (`compiled`) and cached on
    the node, so the runtime's per-step guard evaluation does not walk the tree.
    Semantics are those of the tree: ``and``/``or``/``ite`` evaluate lazily,
    left to right, so an input is looked up only when the evaluation reaches it.
    """
    return compiled(e)(s)


_COMPILED: dict = {}  # cache key -> (the objects the key's ids name, kept alive so no id is reused; the function)


def _cached(key: tuple, alive: tuple, build: Callable[[], Callable]) -> Callable:
    hit = _COMPILED.get(key)
    if hit is not None and all(x is y for x, y in zip(hit[0], alive)):
        return hit[1]
    fn = build()
    if len(_COMPILED) > 200_000:  # bound the cache when many throwaway expressions are built
        _COMPILED.clear()
    _COMPILED[key] = (alive, fn)
    return fn


def compiled(e: Expr) -> Callable[[Scope], int]:
    """`e` as a function of a `Scope` (cached per node, nodes being immutable, and per shape: a tree built again
    for each evaluation, as ``Let("target")`` often is, is generated once)."""
    return _cached((id(e),), (e,), lambda: _by_shape(e))


_SHAPES: dict = {}


def _by_shape(e: Expr) -> Callable[[Scope], int]:
    key = _shape(e)
    fn = _SHAPES.get(key)
    if fn is None:
        if len(_SHAPES) > 20_000:
            _SHAPES.clear()
        fn = _SHAPES[key] = _generate([e], None, False)
    return fn


def _shape(e: Expr) -> tuple:
    """A key equal for two trees only if they evaluate alike: node kinds, names, operators and constants with
    their types (``Const(True)`` is not ``Const(1)``, though the two compare equal)."""
    if isinstance(e, Op):
        return (e.op, *map(_shape, e.args))
    if isinstance(e, Const):
        return (Const, type(e.value), e.value)
    return (type(e), e)


def compiled_tuple(exprs: tuple[Expr, ...], lets: Mapping[str, Expr] | None = None) -> Callable[[Scope], tuple]:
    """The values of `exprs`, evaluated in order, as one function of a `Scope` returning a tuple: what `evaluate`
    gives for each in turn, in one call.  With `lets`, a `Let` that names one of them is expanded where it is
    read, so the function must be called with ``Scope(lets=lets)`` (the interpreter passes its table's
    ``let_map``); a `Let` that names none of them still raises when it is reached.  Cached per tuple of nodes
    and `lets` mapping."""
    return _cached((*map(id, exprs), id(lets)), (*exprs, lets), lambda: _generate(list(exprs), lets, True))


# A leaf kind's scope attribute and the local name the generated code reads it through.
_LEAF = {Field: ("fields", "F"), Input: ("inputs", "I"), Hdr: ("hdr", "H"), Cfg: ("cfg", "C"),
         Param: ("params", "P")}
_INFIX_PY = {"+": "+", "-": "-", "==": "==", "!=": "!=", "<=": "<=", "<": "<", ">=": ">=", ">": ">"}
_DEPTH = 40  # a subtree deeper than this is a call of its own function: CPython's parser nests 200 brackets


class Lazy(dict):
    """A scope mapping that reads a name when it is first looked up (its `__missing__`): ``in`` tells which names
    were read, so a leaf that finds its name absent looks it up (`_read`) instead of calling it unbound."""

    __slots__ = ()


def _read(t: Mapping | None, kind: str, name: str) -> int:
    """A leaf's read past the generated code's fast path (the name not yet in `t`)."""
    if t is None or not (isinstance(t, Lazy) or name in t):
        raise KeyError(f"{kind}({name!r}) is not bound in this scope")
    return t[name]


def _let(s: Scope, name: str) -> int:
    if s.lets is None or name not in s.lets:
        raise KeyError(f"Let({name!r}) is not defined")
    return compiled(s.lets[name])(s)


def _resolve(s: Scope, e: Expr) -> int:
    if s.resolve is None:
        raise KeyError(f"no resolver for node {e!r}")
    return s.resolve(e, s)


def _generate(exprs: list[Expr], lets: Mapping[str, Expr] | None, as_tuple: bool) -> Callable[[Scope], object]:
    """One generated Python function of a `Scope` returning the value of `exprs`' single expression, or (as_tuple)
    the tuple of their values in order: the tree's semantics operator for operator, without a call per node
    (`_source` writes the text, from the tree only)."""
    env: dict = {"_read": _read, "_let": _let, "_resolve": _resolve, "min": min, "max": max}
    used: set = set()
    parts = [_source(e, env, used, lets, 0) for e in exprs]
    body = (f"({', '.join(parts)},)" if parts else "()") if as_tuple else parts[0]
    reads = "".join(f"    {var} = s.{attr}\n" for attr, var in sorted(used))
    exec(f"def _f(s):\n{reads}    return {body}\n", env)  # noqa: S102
    return env["_f"]


def _bind(env: dict, value: object) -> str:
    name = f"_v{len(env)}"
    env[name] = value
    return name


def _source(e: Expr, env: dict, used: set, lets: Mapping[str, Expr] | None, depth: int) -> str:
    """Python text of `e` (`_generate`): the objects it names are bound in `env`, the leaf kinds it reads added
    to `used`; a `Let` of `lets` is expanded.  A leaf reads its name directly where ``in`` finds it, else through
    `_read`, which raises unless the name is bound (a `Lazy` mapping, the interpreter's inputs, reads it then)."""
    if isinstance(e, Const):
        return repr(e.value) if type(e.value) in (bool, int) else _bind(env, e.value)
    leaf = next((k for k in _LEAF if isinstance(e, k)), None)
    if leaf is not None:
        var, n = _LEAF[leaf][1], repr(e.name)
        used.add(_LEAF[leaf])
        return f"({var}[{n}] if {var} is not None and {n} in {var} else _read({var}, {leaf.__name__!r}, {n}))"
    if depth >= _DEPTH:
        return f"{_bind(env, compiled(e))}(s)"
    if isinstance(e, Let):
        if lets is not None and e.name in lets:
            return _source(lets[e.name], env, used, lets, depth + 1)
        return f"_let(s, {e.name!r})"
    if not isinstance(e, Op):
        return f"_resolve(s, {_bind(env, e)})"
    a = [_source(x, env, used, lets, depth + 1) for x in e.args]
    op = e.op
    if op == "ite":
        return f"({a[1]} if {a[0]} else {a[2]})"
    if op in ("and", "or"):
        return f"bool({a[0]} {op} {a[1]})"
    if op == "not":
        return f"(not {a[0]})"
    if op in ("min", "max"):
        return f"{op}({a[0]}, {a[1]})"
    return f"({a[0]} {_INFIX_PY[op]} {a[1]})"


_INFIX = {"+", "-", "==", "!=", "<=", "<", ">=", ">", "and", "or"}


def render(e: Expr) -> str:
    """Human-readable infix form, used by the Markdown table and the hash."""
    if isinstance(e, Const):
        return str(e.value).lower() if isinstance(e.value, bool) else str(e.value)
    if isinstance(e, Field):
        return e.name
    if isinstance(e, Input):
        return f"in.{e.name}"
    if isinstance(e, Hdr):
        return f"hdr.{e.name}"
    if isinstance(e, Cfg):
        return e.name
    if isinstance(e, Param):
        return f"?{e.name}"
    if isinstance(e, Let):
        return f"${e.name}"
    assert isinstance(e, Op)
    if e.op in _INFIX:
        return f"({render(e.args[0])} {e.op} {render(e.args[1])})"
    if e.op == "not":
        return f"!{render(e.args[0])}"
    if e.op == "ite":
        return f"({render(e.args[0])} ? {render(e.args[1])} : {render(e.args[2])})"
    return f"{e.op}({', '.join(render(a) for a in e.args)})"


def leaves(e: Expr) -> set[Expr]:
    """Every leaf node of `e` (not expanding `Let`)."""
    if isinstance(e, Op):
        out: set[Expr] = set()
        for a in e.args:
            out |= leaves(a)
        return out
    return {e}


def typecheck(e: Expr, kinds: Mapping[Expr, str], lets: Mapping[str, Expr] | None = None) -> str:
    """Return "int" or "bool" for `e`, given the kind of each leaf; raise TypeError if ill typed.

    `kinds` maps leaf nodes (e.g. ``Field("x")``) to "int" or "bool"; constants
    are typed by their Python type.
    """
    if isinstance(e, Const):
        return "bool" if isinstance(e.value, bool) else "int"
    if isinstance(e, Let):
        if lets is None or e.name not in lets:
            raise TypeError(f"Let({e.name!r}) is not defined")
        return typecheck(lets[e.name], kinds, lets)
    if not isinstance(e, Op):
        if e not in kinds:
            raise TypeError(f"{e!r} has no declared kind")
        return kinds[e]
    _, result, argkind = OPS[e.op]
    got = [typecheck(a, kinds, lets) for a in e.args]
    if e.op == "ite":
        if got[0] != "bool" or got[1] != got[2]:
            raise TypeError(f"ill-typed ite {render(e)}: {got}")
        return got[1]
    if argkind == "any":
        if got[0] != got[1]:
            raise TypeError(f"ill-typed {render(e)}: {got}")
    elif any(g != argkind for g in got):
        raise TypeError(f"ill-typed {render(e)}: wants {argkind}, got {got}")
    return result


def to_z3(e: Expr, leaf: Callable[[Expr], object], lets: Mapping[str, Expr] | None = None):
    """The z3 term of `e`; `leaf` maps each non-constant leaf to a z3 term.

    z3 is imported here, not at module import.
    """
    import z3

    if isinstance(e, Const):
        return z3.BoolVal(e.value) if isinstance(e.value, bool) else z3.IntVal(e.value)
    if isinstance(e, Let):
        if lets is None or e.name not in lets:
            raise KeyError(f"Let({e.name!r}) is not defined")
        return to_z3(lets[e.name], leaf, lets)
    if not isinstance(e, Op):
        return leaf(e)
    a = [to_z3(x, leaf, lets) for x in e.args]
    op = e.op
    if op == "+": return a[0] + a[1]
    if op == "-": return a[0] - a[1]
    if op == "min": return z3.If(a[0] <= a[1], a[0], a[1])
    if op == "max": return z3.If(a[0] >= a[1], a[0], a[1])
    if op == "==": return a[0] == a[1]
    if op == "!=": return a[0] != a[1]
    if op == "<=": return a[0] <= a[1]
    if op == "<": return a[0] < a[1]
    if op == ">=": return a[0] >= a[1]
    if op == ">": return a[0] > a[1]
    if op == "and": return z3.And(a[0], a[1])
    if op == "or": return z3.Or(a[0], a[1])
    if op == "not": return z3.Not(a[0])
    if op == "ite": return z3.If(a[0], a[1], a[2])
    raise AssertionError(op)
