"""Concrete semantics of the table for one rank: which row fires, and its effect.

This is the only interpreter of rows.  The runtime calls `step` once per
``step()``; the explicit-state model checker calls `successors` (every enabled
row and every allowed choice); the trace checker replays logged steps through
`fire`.  None of them re-implements a guard, an update or the decision.

A rank's local state is a plain ``dict`` field -> int/bool.  ``ph`` is set
from the row's ``phase_to`` (rows never list it among their updates).
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import ProtocolError
from .expr import Cfg, Const, Expr, Hdr, Lazy, Op, Scope, compiled_tuple, evaluate, leaves
from .table import Aggregate, Choice, Row, Table

__all__ = ["Step", "initial_local", "candidate_rows", "enabled_rows", "choice_bounds", "fire",
           "step", "run", "successors", "aggregate", "collective_inputs"]


class Step(NamedTuple):
    """The result of firing one row (a NamedTuple: the runtime builds one per step, at a third of a
    frozen dataclass's cost)."""

    row: str
    before: dict
    after: dict
    params: dict
    inputs: dict          # the inputs the row actually read
    effect: str           # the row's effect kind
    payload: dict | None  # header posted ("post" rows)
    count: int | None     # samples handed out ("emit" rows)


def initial_local(table: Table, cfg: Mapping[str, int]) -> dict:
    return {f.name: evaluate(f.init, Scope(cfg=cfg)) for f in table.fields}


def candidate_rows(table: Table, local: Mapping) -> list[Row]:
    """The rows leaving the rank's phase, in table order."""
    return table.rows_from(local["ph"])


class _Recording(Lazy):
    """Inputs looked up lazily: an input is requested from the environment only when an evaluation reaches it
    (``and`` short-circuits left to right), once; the mapping holds those read, in the order read."""

    __slots__ = ("_source",)

    def __init__(self, source: Mapping | Callable[[str], int]):
        super().__init__()
        self._source = source

    def __missing__(self, k: str):
        src = self._source
        if callable(src):
            v = src(k)
        elif k in src:
            v = src[k]
        else:
            raise KeyError(f"Input({k!r}) is not bound in this scope")
        self[k] = v
        return v


def _scope(table: Table, local: Mapping, inputs: Mapping, cfg: Mapping, params: Mapping | None = None) -> Scope:
    return Scope(fields=local, inputs=inputs, cfg=cfg, params={} if params is None else params, lets=table.let_map)


def enabled_rows(table: Table, local: Mapping, inputs: Mapping, cfg: Mapping) -> list[Row]:
    """Rows of the rank's phase whose guard holds (each guard evaluated, in table order)."""
    rows, guards = _guards(table, local["ph"])
    s = _scope(table, local, inputs, cfg)  # guards read no params: one scope serves every row
    return [r for r, g in zip(rows, guards(s)) if g]


def _guards(table: Table, phase: int) -> tuple[list[Row], Callable[[Scope], tuple]]:
    """The rows leaving `phase` and the function of a scope giving their guards' values in table order (cached
    per table and phase)."""
    cache = table.__dict__.setdefault("_guards", {})
    hit = cache.get(phase)
    if hit is None:
        rows = table.rows_from(phase)
        hit = cache[phase] = (rows, compiled_tuple(tuple(r.guard for r in rows), table.let_map))
    return hit


def choice_bounds(table: Table, row: Row, choice: Choice, local: Mapping, inputs: Mapping,
                  cfg: Mapping, params: Mapping) -> tuple[int, int]:
    return _bounds(table, choice, _scope(table, local, inputs, cfg, params))


def _bounds(table: Table, choice: Choice, s: Scope) -> tuple[int, int]:
    cache = table.__dict__.setdefault("_bounds", {})
    hit = cache.get(id(choice))
    if hit is None or hit[0] is not choice:
        hit = cache[id(choice)] = (choice, compiled_tuple((choice.lo, choice.hi), table.let_map))
    lo, hi = hit[1](s)
    return int(lo), int(hi)


def fire(table: Table, row: Row, local: Mapping, inputs: Mapping, cfg: Mapping, params: Mapping) -> Step:
    """Apply `row` (whose guard must hold) with the given choice values.

    Raises ProtocolError if the guard is false or a choice is out of its bounds.
    Updates are simultaneous (every right-hand side reads the old state).
    """
    rec = inputs if isinstance(inputs, _Recording) else _Recording(inputs)
    s = _scope(table, local, rec, cfg, params)
    if local["ph"] != row.phase_from or not evaluate(row.guard, s):
        raise ProtocolError(f"row {row.name} is not enabled in state {dict(local)}")
    return _apply(table, row, local, rec, cfg, params, s)


def _apply(table: Table, row: Row, local: Mapping, rec: _Recording, cfg: Mapping, params: Mapping, s: Scope) -> Step:
    """`fire` past its guard check: `row`'s guard holds in `s` (the scope of `local`, `rec`, `cfg`, `params`)."""
    for c in row.choices:
        lo, hi = _bounds(table, c, s)
        v = params.get(c.name)
        if v is None or not lo <= v <= hi:
            raise ProtocolError(
                f"row {row.name}: choice {c.name}={v} outside its contract [{lo}, {hi}] in state {dict(local)}")
    targets, posted, values = _row_values(table, row)
    v = values(s)  # the updates, then the payload and its shape (a post) or the count (an emit), in this order
    after = dict(local)
    after.update(zip(targets, v))
    after["ph"] = row.phase_to
    k, eff = len(targets), row.effect
    payload = dict(zip(posted, v[k:])) if eff.kind == "post" else None
    count = v[k] if eff.kind == "emit" else None
    return Step(row.name, dict(local), after, dict(params), dict(rec), eff.kind, payload, count)


def _row_values(table: Table, row: Row) -> tuple[tuple[str, ...], tuple[str, ...], Callable[[Scope], tuple]]:
    """(the fields `row` updates, the names its post's payload holds, shape last; the function of a scope giving
    the updates' values, then the payload's or the emit's count), cached per table and row."""
    cache = table.__dict__.setdefault("_row_values", {})
    hit = cache.get(row.name)
    if hit is not None and hit[0] is row:
        return hit[1]
    eff = row.effect
    exprs = [e for _, e in row.updates]
    posted: tuple[str, ...] = ()
    if eff.kind == "post":
        posted = (*(n for n, _ in eff.payload), "shape")
        exprs += [*(e for _, e in eff.payload), eff.shape]
    elif eff.kind == "emit":
        exprs.append(eff.count)
    out = (tuple(t for t, _ in row.updates), posted, compiled_tuple(tuple(exprs), table.let_map))
    cache[row.name] = (row, out)
    return out


def step(table: Table, local: Mapping, inputs: Mapping | Callable[[str], int], cfg: Mapping,
         choose: Callable[[Row, Choice, int, int, dict], int],
         selected: Callable[[Row], None] | None = None) -> Step:
    """Fire the one enabled row of this rank (the runtime's ``step()``).

    `inputs` may be a callable: an input is then requested only when a guard
    needs it (or, for an input no guard read, when an update, a choice bound or
    the effect's payload reads it).  `choose(row, choice, lo, hi, params_so_far)`
    supplies each choice.  `selected(row)`, if given, is called once the row is
    known and before its choices and effect are evaluated: the runtime prepares
    a ``post`` row's header there, so an error in preparing it can still change
    an input the payload has not read yet (``in.quit``).  Raises ProtocolError
    unless exactly one row is enabled.
    """
    rec, params = _Recording(inputs), {}
    s = _scope(table, local, rec, cfg, params)  # one scope: `params` fills in as the choices are made
    row = _the_enabled_row(*_guards(table, local["ph"]), s, local, rec)  # `enabled_rows` (guards read no params)
    if selected is not None:
        selected(row)
    for c in row.choices:
        lo, hi = _bounds(table, c, s)
        params[c.name] = int(choose(row, c, lo, hi, dict(params)))
    # the guard was just found true on these very reads (`rec` replays them; guards read no params), so
    # `fire`'s check of it is skipped; the choices' bounds are still checked
    return _apply(table, row, local, rec, cfg, params, s)


def _the_enabled_row(cands: list[Row], guards: Callable[[Scope], tuple], s: Scope, local: Mapping,
                     rec: Mapping) -> Row:
    """The one row of `cands` whose guard holds in `s`; ProtocolError unless exactly one does."""
    rows = [r for r, g in zip(cands, guards(s)) if g]
    if len(rows) != 1:
        raise ProtocolError(
            f"{len(rows)} rows enabled ({[r.name for r in rows]}) in state {dict(local)} with inputs {dict(rec)}; "
            "the table must enable exactly one row per step")
    return rows[0]


def run(table: Table, local: dict, inputs: Callable[[str], int], cfg: Mapping,
        choose: Callable[[Row, Choice, int, int, dict], int], selected: Callable[[Row], None] | None,
        fired: Callable[[Row, Mapping, int | None], None], until: frozenset[str]) -> Step:
    """`step` repeated on one rank until a row whose effect kind is in `until` fires: that row's `Step`.

    Every row fires as `step` fires it (its phase's guards in table order, exactly one enabled, its
    choices within their bounds, its updates simultaneous), in the same order, on the same inputs: `local` (the
    caller's own dict) is updated in place, and each row before the last is reported as ``fired(row, inputs
    read, emit count or None)`` instead of a `Step`, its updates already applied.  What `step` raises, this
    raises; the rows fired before stay applied to `local`."""
    rec, params = _Recording(inputs), {}
    s = _scope(table, local, rec, cfg, params)  # one scope for the run: `local`, `rec` and `params` change in place
    phases: dict = {}  # this run's `_guards` and `_row_values`, looked up once
    updates: dict = {}
    while True:
        rec.clear()
        params.clear()
        ph = local["ph"]
        hit = phases.get(ph)
        if hit is None:
            hit = phases[ph] = _guards(table, ph)
        row = _the_enabled_row(*hit, s, local, rec)
        eff = row.effect
        if eff.kind in until:
            if selected is not None:
                selected(row)
            for c in row.choices:
                lo, hi = _bounds(table, c, s)
                params[c.name] = int(choose(row, c, lo, hi, dict(params)))
            return _apply(table, row, local, rec, cfg, params, s)
        for c in row.choices:
            lo, hi = _bounds(table, c, s)
            v = params[c.name] = int(choose(row, c, lo, hi, dict(params)))
            if not lo <= v <= hi:
                raise ProtocolError(
                    f"row {row.name}: choice {c.name}={v} outside its contract [{lo}, {hi}] in state {dict(local)}")
        hit = updates.get(row.name)
        if hit is None:
            hit = updates[row.name] = _row_values(table, row)
        targets, _, values = hit
        v = values(s)  # every right-hand side read from the old state, then assigned
        for t, x in zip(targets, v):
            local[t] = x
        local["ph"] = row.phase_to
        fired(row, rec, v[len(targets)] if eff.kind == "emit" else None)


def successors(table: Table, local: Mapping, inputs: Mapping, cfg: Mapping) -> Iterator[Step]:
    """Every (row, choice values) firing enabled in `local` under `inputs` (for the model checker)."""
    for row in enabled_rows(table, local, inputs, cfg):
        yield from _expand(table, row, local, inputs, cfg, list(row.choices), {})


def _expand(table, row, local, inputs, cfg, todo, params) -> Iterator[Step]:
    if not todo:
        yield fire(table, row, local, inputs, cfg, params)
        return
    c, rest = todo[0], todo[1:]
    lo, hi = choice_bounds(table, row, c, local, inputs, cfg, params)
    for v in range(lo, hi + 1):
        yield from _expand(table, row, local, inputs, cfg, rest, {**params, c.name: v})


_HDR_NAMES: dict[int, tuple[Expr, tuple[str, ...]]] = {}


def _hdr_names(e: Expr) -> tuple[str, ...]:
    """The header fields `e` reads (its `Hdr` leaves), in name order (cached per node, as `compiled`)."""
    hit = _HDR_NAMES.get(id(e))
    if hit is None or hit[0] is not e:
        hit = _HDR_NAMES[id(e)] = (e, tuple(sorted({x.name for x in leaves(e) if isinstance(x, Hdr)})))
    return hit[1]


def aggregate(agg: Aggregate, headers: "list[Mapping] | Mapping[str, Sequence]", cfg: Mapping) -> int:
    """``agg.op`` over every header of ``agg.of``.  The expression reads a header only through its
    `Hdr` leaves, so it is evaluated once per distinct header as those fields see it (a few among N
    headers: N lookups instead of N interpretations); a header missing a field raises KeyError as
    the interpreter would.  `headers`: one mapping per rank, or (columns) each field's values, one
    per rank (`collective_inputs`)."""
    return _aggregate(agg, _distinct(headers, _hdr_names(agg.of)), cfg)


def _distinct(headers: "list[Mapping] | Mapping[str, Sequence]", names: tuple[str, ...]) -> list[dict]:
    """The distinct projections of `headers` (per rank, or columns) on `names`, as headers."""
    if isinstance(headers, Mapping):
        cols = [headers[k] for k in names]  # KeyError on a missing field
        size = len(next(iter(headers.values()), ()))
    else:
        cols = [[h[k] for h in headers] for k in names]
        size = len(headers)
    if not size:
        raise ValueError("an aggregate over no headers")
    seen = set(zip(*cols)) if names else {()}
    return [dict(zip(names, v)) for v in seen]


def _aggregate(agg: Aggregate, distinct: list[dict], cfg: Mapping) -> int:
    names = _hdr_names(agg.of)
    own = {tuple(h[k] for k in names) for h in distinct}  # the fields this aggregate reads
    vals = [evaluate(agg.of, Scope(hdr=dict(zip(names, v)), cfg=cfg)) for v in own]
    return max(vals) if agg.op == "max" else min(vals)


# Column values at most this large in magnitude are evaluated as int64 arrays (`_columns`): every sum the
# table's aggregates take of two of them (or of one and a constant) is then exact, as the interpreter's ints are.
_COLUMN_LIMIT = 1 << 40

_ARRAY_OPS: dict[str, Callable] = {
    "+": np.add, "-": np.subtract, "min": np.minimum, "max": np.maximum, "==": np.equal, "!=": np.not_equal,
    "<=": np.less_equal, "<": np.less, ">=": np.greater_equal, ">": np.greater,
    "and": np.logical_and, "or": np.logical_or,  # the interpreter's bool(x) and bool(y): a value's truth, per rank
}
_ARRAY_FNS: dict[int, tuple[Expr, Callable | None]] = {}


def _array_fn(e: Expr) -> Callable | None:
    """`e` as a function of ``(columns, cfg)`` evaluating every rank's header at once with numpy's elementwise
    operations (the interpreter's operators one for one; ``ite`` as `numpy.where`: the branches are pure), or
    None if `e` holds a node other than a constant, a header field, a setting or one of those operators.
    Cached per node, as `expr.compiled`."""
    hit = _ARRAY_FNS.get(id(e))
    if hit is not None and hit[0] is e:
        return hit[1]
    fn = _array_compile(e)
    if len(_ARRAY_FNS) > 200_000:  # bound the cache when many throwaway expressions are built
        _ARRAY_FNS.clear()
    _ARRAY_FNS[id(e)] = (e, fn)
    return fn


def _array_compile(e: Expr) -> Callable | None:
    if isinstance(e, Const):
        v = e.value
        return lambda c, cfg: v
    if isinstance(e, Hdr):
        name = e.name
        return lambda c, cfg: c[name]
    if isinstance(e, Cfg):
        name = e.name
        return lambda c, cfg: cfg[name]
    if not isinstance(e, Op):
        return None
    args = [_array_compile(x) for x in e.args]
    if None in args:
        return None
    if e.op == "ite":
        x, t, f = args
        return lambda c, cfg: np.where(x(c, cfg), t(c, cfg), f(c, cfg))
    if e.op == "not":
        x = args[0]
        return lambda c, cfg: np.logical_not(x(c, cfg))
    fn = _ARRAY_OPS.get(e.op)
    if fn is None or len(args) != 2:
        return None
    x, y = args
    return lambda c, cfg: fn(x(c, cfg), y(c, cfg))


def _columns(headers: Mapping[str, Sequence], names: tuple[str, ...]) -> dict | None:
    """The columns `names` of `headers` as int arrays, if each is one within `_COLUMN_LIMIT`; else None."""
    cols = {}
    for k in names:
        col = headers[k]  # KeyError on a missing field, as the interpreter
        # signed ints only: an unsigned column's difference would wrap below zero
        if not (isinstance(col, np.ndarray) and col.dtype.kind == "i" and col.ndim == 1 and len(col)):
            return None
        if int(col.max()) > _COLUMN_LIMIT or int(col.min()) < -_COLUMN_LIMIT:  # (abs of int64's least wraps)
            return None
        cols[k] = col
    return cols


def _array_inputs(table: Table, headers: Mapping[str, Sequence], names: tuple[str, ...], cfg: Mapping) -> dict | None:
    """Every aggregate of `table` over the header columns at once (`_array_fn`), or None where some column
    is not an int array within `_COLUMN_LIMIT` or some aggregate has no array form (the interpreter then
    evaluates them)."""
    cols = _columns(headers, names)
    fns = [_array_fn(a.of) for a in table.aggregates]
    if cols is None or None in fns:
        return None
    out = {}
    for a, fn in zip(table.aggregates, fns):
        v = np.asarray(fn(cols, cfg))
        r = v.max() if a.op == "max" else v.min()
        out[a.name] = bool(r) if v.dtype == bool else int(r)
    return out


def collective_inputs(table: Table, headers: "list[Mapping] | Mapping[str, Sequence]", proposal: int,
                      cfg: Mapping) -> dict:
    """The collective inputs every rank reads at its ``collect`` row.

    `headers` are all ranks' posted headers, in rank order: one mapping per rank,
    or (columns, what the runtime's N headers come as) a mapping of each field to
    every rank's values; `proposal` is the alignment policy's output for these
    headers.  Raises ProtocolError if the posted shapes differ (a collective mismatch).
    """
    shapes = set(headers.get("shape", (None,))) if isinstance(headers, Mapping) else {h.get("shape") for h in headers}
    if len(shapes) > 1:
        raise ProtocolError(f"collective mismatch: posted header shapes differ across ranks: {sorted(shapes)}")
    names = tuple(sorted({k for a in table.aggregates for k in _hdr_names(a.of)}))
    out = _array_inputs(table, headers, names, cfg) if isinstance(headers, Mapping) else None
    if out is None:
        if isinstance(headers, Mapping):  # the interpreter reads ints, not numpy scalars
            headers = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in headers.items()}
        distinct = _distinct(headers, names)  # one pass over the N headers for every aggregate
        out = {a.name: _aggregate(a, distinct, cfg) for a in table.aggregates}
    out["proposal"] = int(proposal)
    out["ready"] = True
    return out
