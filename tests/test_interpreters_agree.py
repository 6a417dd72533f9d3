"""The two interpreters of the table agree: `expr.evaluate` vs `expr.to_z3`, and the explicit
successors of `models.env.Model` vs the z3 transition relation of `proofs.symbolic`.

Invariant checked here: for every state reachable at small N, the set of (row, acting rank,
choices, successor state) that z3 admits equals the explicit one (the environment's complete
and quit transitions included; every rank may be told to stop, as in the all-N proofs), and
every conjunct of the auxiliary invariant holds.  If the encodings drifted apart, the all-N proofs would be about
another system.
"""

from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace

import numpy as np
import pytest
import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from models.env import Model, SysState
from models.logic import holds
from odb.protocol import machine
from odb.protocol.expr import Cfg, Const, Field, Hdr, Input, Let, Op, Param, Scope, evaluate, leaves, to_z3
from odb.protocol.table import DGAP, JOIN, PAD, QUOTA, Aggregate
from proofs.symbolic.encode import ENV_ARRAYS, MAILBOX, QUIT, Encoder
from proofs.symbolic.invariants import INVARIANT, rounds_bound_value

# -- (a) evaluate == z3 model evaluation, on random well-typed expressions ---------------------
INT_LEAVES = [Field("a"), Field("b"), Input("c"), Cfg("W"), Param("p"), Let("L")]
BOOL_LEAVES = [Field("x"), Input("y"), Let("B")]
LETS = {"L": Op("+", (Field("a"), Const(2))), "B": Op("<", (Field("b"), Input("c")))}
INT_BIN = ["+", "-", "min", "max"]
CMP = ["==", "!=", "<=", "<", ">=", ">"]


def _exprs(kind: str, depth: int):
    if kind == "int":
        leaf = st.one_of(st.sampled_from(INT_LEAVES), st.integers(-4, 4).map(Const))
    else:
        leaf = st.one_of(st.sampled_from(BOOL_LEAVES), st.booleans().map(Const))
    if depth == 0:
        return leaf
    sub_i, sub_b = _exprs("int", depth - 1), _exprs("bool", depth - 1)
    if kind == "int":
        inner = st.one_of(
            st.tuples(st.sampled_from(INT_BIN), sub_i, sub_i).map(lambda t: Op(t[0], (t[1], t[2]))),
            st.tuples(sub_b, sub_i, sub_i).map(lambda t: Op("ite", t)),
        )
    else:
        inner = st.one_of(
            st.tuples(st.sampled_from(CMP), sub_i, sub_i).map(lambda t: Op(t[0], (t[1], t[2]))),
            st.tuples(st.sampled_from(["==", "!="]), sub_b, sub_b).map(lambda t: Op(t[0], (t[1], t[2]))),
            st.tuples(st.sampled_from(["and", "or"]), sub_b, sub_b).map(lambda t: Op(t[0], (t[1], t[2]))),
            sub_b.map(lambda a: Op("not", (a,))),
            st.tuples(sub_b, sub_b, sub_b).map(lambda t: Op("ite", t)),
        )
    return st.one_of(leaf, inner)


ENVS = st.fixed_dictionaries({
    "a": st.integers(-6, 6), "b": st.integers(-6, 6), "c": st.integers(-6, 6), "W": st.integers(1, 6),
    "p": st.integers(-6, 6), "x": st.booleans(), "y": st.booleans(),
})


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["int", "bool"]), data=st.data(), env=ENVS)
def test_evaluate_equals_z3_model_eval(kind, data, env):
    e = data.draw(_exprs(kind, 3))
    scope = Scope(fields={"a": env["a"], "b": env["b"], "x": env["x"]}, inputs={"c": env["c"], "y": env["y"]},
                  cfg={"W": env["W"]}, params={"p": env["p"]}, lets=LETS)
    consts = {n: (z3.Bool(n) if isinstance(v, bool) else z3.Int(n)) for n, v in env.items()}

    def leaf(node):
        return consts[node.name]

    sv = z3.Solver()
    sv.add(*[consts[n] == v for n, v in env.items()])
    assert sv.check() == z3.sat
    got = sv.model().eval(to_z3(e, leaf, LETS), model_completion=True)
    want = evaluate(e, scope)
    if kind == "bool":
        assert z3.is_true(got) == bool(want), e
    else:
        assert got.as_long() == want, e


# -- (a'') the generated evaluator == a tree walk, value and reads --------------------------------------
def _walk(e, env, reads):
    """The tree's semantics by hand (a test oracle, not the runtime's): lazy and/or/ite, left to right; each
    input read appended to `reads` the first time."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Let):
        return _walk(LETS[e.name], env, reads)
    if isinstance(e, Input) and e.name not in reads:
        reads.append(e.name)
    if not isinstance(e, Op):
        return env[e.name]
    a = [lambda x=x: _walk(x, env, reads) for x in e.args]
    return {"+": lambda: a[0]() + a[1](), "-": lambda: a[0]() - a[1](), "min": lambda: min(a[0](), a[1]()),
            "max": lambda: max(a[0](), a[1]()), "==": lambda: a[0]() == a[1](), "!=": lambda: a[0]() != a[1](),
            "<=": lambda: a[0]() <= a[1](), "<": lambda: a[0]() < a[1](), ">=": lambda: a[0]() >= a[1](),
            ">": lambda: a[0]() > a[1](), "and": lambda: bool(a[0]() and a[1]()),
            "or": lambda: bool(a[0]() or a[1]()), "not": lambda: not a[0](),
            "ite": lambda: a[1]() if a[0]() else a[2]()}[e.op]()


@settings(max_examples=300, deadline=None)
@given(data=st.data(), env=ENVS)
def test_the_generated_evaluator_reads_and_computes_as_the_tree(data, env):
    """`evaluate` and `compiled_tuple` (lets expanded) against the tree walk: the same values, and the same
    inputs read in the same order through the interpreter's lazy inputs (an input no evaluation reaches is
    never requested: a source answer or a collective result the row does not need)."""
    from odb.protocol.expr import compiled_tuple
    from odb.protocol.machine import _Recording

    exprs = tuple(data.draw(_exprs(k, 3)) for k in ("int", "bool", "int"))
    want_reads: list = []
    want = [_walk(e, env, want_reads) for e in exprs]
    for lets in (None, LETS):
        asked: list = []
        rec = _Recording(lambda k: asked.append(k) or env[k])
        scope = Scope(fields={"a": env["a"], "b": env["b"], "x": env["x"]}, inputs=rec, cfg={"W": env["W"]},
                      params={"p": env["p"]}, lets=LETS)
        got = compiled_tuple(exprs, lets)(scope)
        assert list(got) == want and [type(v) for v in got] == [type(v) for v in want], exprs
        assert asked == want_reads and list(rec) == want_reads, (exprs, asked, want_reads)
        assert [evaluate(e, scope) for e in exprs] == want


def test_a_deep_expression_evaluates_past_the_parsers_nesting_limit():
    """An expression nested far deeper than Python's parser allows in one text (200 brackets) is split into
    functions, with its value and its laziness kept."""
    from odb.protocol.expr import and_, compiled_tuple

    e = Const(0)
    for i in range(1, 301):
        e = Op("+", (e, Const(i))) if i % 2 else Op("ite", (Op("<", (Field("a"), Const(i))), e, Input("never")))
    scope = Scope(fields={"a": 0}, inputs={}, lets={})
    assert evaluate(e, scope) == sum(range(1, 301, 2)) and compiled_tuple((e, e))(scope) == (22500, 22500)
    chain = and_(*[Op("<=", (Field("a"), Const(i))) for i in range(300)], Input("c"))
    assert evaluate(chain, Scope(fields={"a": 0}, inputs={"c": True})) is True
    assert evaluate(chain, Scope(fields={"a": 1}, inputs={})) is False  # stops before the unbound input


@pytest.mark.parametrize("leaf", [Field("f"), Input("i"), Hdr("h"), Cfg("c"), Param("p")])
@pytest.mark.parametrize("bound", [None, {}, {"other": 1}])
def test_every_leaf_kind_unbound_raises_naming_it(leaf, bound):
    from odb.protocol.expr import compiled_tuple
    from odb.protocol.machine import _Recording

    attr = {Field: "fields", Input: "inputs", Hdr: "hdr", Cfg: "cfg", Param: "params"}[type(leaf)]
    scopes = [Scope(**{attr: bound})]
    if attr == "inputs" and bound is not None:
        scopes.append(Scope(inputs=_Recording(bound)))  # the interpreter's lazy inputs over a mapping
    for scope in scopes:
        for fn in (lambda: evaluate(Op("+", (leaf, Const(1))), scope), lambda: compiled_tuple((leaf,), {})(scope)):
            with pytest.raises(KeyError, match=rf"{type(leaf).__name__}\('{leaf.name}'\) is not bound"):
                fn()
    ok = Scope(**{attr: {leaf.name: 41}})
    assert evaluate(Op("+", (leaf, Const(1))), ok) == 42


def test_a_tree_built_again_reuses_its_function_and_keeps_its_constants_types():
    """`compiled` generates one function per shape (a decision's ``Let("target")`` is built for every round), and
    a shape tells ``true`` from ``1`` (equal in Python): a boolean expression still evaluates to a bool."""
    from odb.protocol.expr import compiled

    assert compiled(Let("target")) is compiled(Let("target"))
    assert compiled(Op("+", (Field("a"), Const(1)))) is compiled(Op("+", (Field("a"), Const(1))))
    s = Scope(fields={"x": True})
    for first, second in ((Const(1), Const(True)), (Const(True), Const(1))):
        a, b = (evaluate(Op("ite", (Field("x"), c, c)), s) for c in (first, second))
        assert (type(a), type(b)) == (type(first.value), type(second.value)) and a == b


def test_a_let_missing_from_the_scope_raises_when_reached_only():
    from odb.protocol.expr import compiled_tuple

    e = Op("ite", (Field("x"), Let("nowhere"), Const(3)))
    assert compiled_tuple((e,), {})(Scope(fields={"x": False})) == (3,)
    with pytest.raises(KeyError, match=r"Let\('nowhere'\) is not defined"):
        compiled_tuple((e,), {})(Scope(fields={"x": True}, lets={}))


# -- (a') the aggregates over header columns (numpy, every rank at once) == the interpreter per header ----
HDR_INT = [Hdr("st"), Hdr("n"), Hdr("m"), Cfg("W")]


def _hdr_exprs(kind: str, depth: int):
    """Well-typed header expressions: `_exprs`' operators over header fields, the window and constants."""
    if kind == "int":
        leaf = st.one_of(st.sampled_from(HDR_INT), st.integers(-4, 4).map(Const))
    else:
        leaf = st.booleans().map(Const)
    if depth == 0:
        return leaf
    sub_i, sub_b = _hdr_exprs("int", depth - 1), _hdr_exprs("bool", depth - 1)
    if kind == "int":
        return st.one_of(leaf, st.tuples(st.sampled_from(INT_BIN), sub_i, sub_i).map(lambda t: Op(t[0], (t[1], t[2]))),
                         st.tuples(sub_b, sub_i, sub_i).map(lambda t: Op("ite", t)))
    return st.one_of(leaf, st.tuples(st.sampled_from(CMP), sub_i, sub_i).map(lambda t: Op(t[0], (t[1], t[2]))),
                     st.tuples(st.sampled_from(["and", "or"]), sub_b, sub_b).map(lambda t: Op(t[0], (t[1], t[2]))),
                     sub_b.map(lambda a: Op("not", (a,))), st.tuples(sub_b, sub_b, sub_b).map(lambda t: Op("ite", t)))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(1, 40), big=st.booleans())
def test_aggregates_over_header_columns_equal_the_interpreter_per_header(data, n, big):
    """What a rank computes from the gathered headers as int64 columns (`machine._array_inputs`) is what the
    interpreter computes header by header, value and type; a column past the exact range (``big``) is left
    to the interpreter."""
    aggs = tuple(Aggregate(f"a{k}", data.draw(st.sampled_from(["max", "min"])),
                           data.draw(_hdr_exprs(data.draw(st.sampled_from(["int", "bool"])), 3)), "")
                 for k in range(3))
    table = SimpleNamespace(aggregates=aggs)
    top = (1 << 63) - 1 if big else 9  # big: sums past int64 (the interpreter's ints do not wrap)
    cols = {f: data.draw(st.lists(st.integers(-top - big, top), min_size=n, max_size=n)) for f in ("st", "n", "m")}
    cfg = {"W": data.draw(st.integers(1, 6))}
    per_header = [{f: cols[f][r] for f in cols} for r in range(n)]
    arrays = {f: np.asarray(v, dtype=np.int64) for f, v in cols.items()}
    want = machine.collective_inputs(table, per_header, 0, cfg)
    got = machine.collective_inputs(table, arrays, 0, cfg)
    assert got == want and [type(got[a.name]) for a in aggs] == [type(want[a.name]) for a in aggs]
    names = tuple(sorted({x.name for a in aggs for x in leaves(a.of) if isinstance(x, Hdr)}))
    in_range = max(abs(v) for f in names for v in cols[f]) <= 1 << 40 if names else True
    assert (machine._array_inputs(table, arrays, names, cfg) is not None) == in_range  # the array path was taken


# -- (b) explicit successors == z3 successors, on every reachable state at small N -------------
W = 2
# Data vectors (one per initial state) per N, with a sampling stride: every reachable state of
# each vector (every `stride`-th one, in a fixed exploration order) is compared.  Every rank may
# stop (QUITS >= N, as in the all-N encoding), which multiplies the state space ~3x at N=2 and
# ~15x at N=3; z3 costs ~15-25 ms per state on 2 cores, so the scope keeps this file near a
# minute: all of N=1 (d <= 2), all of N=2 with a drained rank, a sample of uneven N=2 with a
# carry, and a sample of N=3 with and without an empty rank.  The exhaustive N <= 6 exploration is the
# explicit engine's job.
AGREE = {1: (((0,), 1), ((1,), 1), ((2,), 1)),
         2: (((0, 1), 1), ((1, 2), 8)),
         3: (((0, 1, 1), 32), ((1, 1, 1), 48))}
MODES = (PAD, JOIN, QUOTA)
QUITS = 3  # >= every N here: any number of ranks may stop, as in the all-N encoding
# The invariant is evaluated (cheaply, in Python) on more states: every rank may stop up to N=2,
# one rank may stop at N=3.
INV_DATA = (((0,), (1,), (2,), (3,), (0, 1), (1, 2), (2, 2), (0, 3)), QUITS), \
           (((0, 1, 1), (1, 1, 1)), 1)


def _reachable(model: Model, vectors) -> list[SysState]:
    seen: dict[SysState, None] = {}
    for data in vectors:
        todo = [model.initial(data)]
        seen.setdefault(todo[0])
        while todo:
            s = todo.pop()
            for _, t in model.successors(s):
                if t not in seen:
                    seen[t] = None
                    todo.append(t)
    return list(seen)


@lru_cache(maxsize=None)
def _states(mode: int, vectors: tuple, quits: int = QUITS, xchg: int = 0) -> tuple[SysState, ...]:
    return tuple(_reachable(Model(W=W, mode=mode, quits=quits, xchg=xchg), vectors))


def _sampled(mode: int, n: int, xchg: int = 0) -> list[SysState]:
    out: list[SysState] = []
    for data, stride in AGREE[n]:
        out += _states(mode, (data,), xchg=xchg)[::stride]
    return out


class _Z3Successors:
    """The z3 transition relation at a fixed N, with scalar post-state variables (one per rank and field)."""

    def __init__(self, mode: int, n: int, xchg: int = 0):
        self.n = n
        self.enc = enc = Encoder(DGAP, mode, tag=f"#{mode}.{n}.{xchg}")
        self.pre = enc.state("pre")
        self.fields = list(DGAP.field_names) + list(ENV_ARRAYS)
        kind = {f.name: f.kind for f in DGAP.fields}
        self.post = {(f, j): (z3.Bool if kind.get(f) == "bool" else z3.Int)(f"post.{f}.{j}")
                     for f in self.fields for j in range(n)}
        self.gpost = {g: z3.Int(f"post.{g}") for g in self.pre.globals}
        self.row_id, self.actor = z3.Int("row_id"), z3.Int("actor")
        self.names = [r.name for r in DGAP.rows] + ["complete", QUIT]
        self.choice = {}   # (row, choice name) -> z3 param
        alts = []
        for idx, step in enumerate(enc.steps(self.pre, "t")):
            eqs = [self.post[(f, j)] == step.post.arr(f)[j] for f in self.fields for j in range(n)]
            eqs += [self.gpost[g] == step.post.globals[g] for g in self.gpost]
            label = [self.row_id == idx, self.actor == (-1 if step.rank is None else step.rank)]
            chosen = {"row": lambda: [c.name for c in DGAP.rows[idx].choices], "complete": lambda: ["proposal"],
                      "quit": lambda: []}[step.kind]()
            for c in chosen:
                self.choice[(step.name, c)] = step.params[c]
            alts.append(z3.And(*step.guard, *label, *eqs))
        # built once: z3's Python layer is a bottleneck here
        self.pre_terms = [(f, j, self.pre.arr(f)[j]) for f in self.fields for j in range(n)]
        self.post_keys = list(self.post)
        self.post_terms = [self.post[key] for key in self.post_keys]
        self.gnames = list(self.gpost)
        # One solver; each transition is guarded by a selector literal and checked under that
        # assumption, so z3 never searches the disjunction unless asked for "any other successor".
        cfg = enc.cfg
        self.selectors = [z3.Bool(f"sel.{name}") for name in self.names]
        self.any = z3.Bool("sel.any")
        self.solver = z3.Solver()
        self.solver.set("timeout", 20_000)
        self.solver.add(*enc.background, enc.N == n, cfg["W"] == W, cfg["header_len"] == 1, cfg["xchg"] == xchg,
                        *[z3.Implies(b, alt) for b, alt in zip(self.selectors, alts)],
                        z3.Implies(self.any, z3.Or(*self.selectors)))

    def _pins(self, succ) -> tuple[int, list]:
        """The z3 equalities that say "this transition, with these choices, to this state"."""
        row, actor, params, t = succ
        idx = self.names.index(row)
        if row == QUIT:
            actor, params = dict(params)["rank"], ()
        pins = [self.row_id == idx, self.actor == (-1 if actor is None else actor)]
        pv = dict(params)
        pins += [p == pv[c] for (rn, c), p in self.choice.items() if rn == row]
        pins += [self.post[(f, j)] == t.rank_value(j, f) for f, j in self.post_keys]
        pins += [term == t.global_value(g) for g, term in self.gpost.items()]
        return idx, pins

    def _decode(self, m: z3.ModelRef, s: SysState):
        ev = lambda t: m.eval(t, model_completion=True)  # noqa: E731
        row = self.names[ev(self.row_id).as_long()]
        actor = ev(self.actor).as_long()
        params = tuple(sorted((c, ev(p).as_long()) for (rn, c), p in self.choice.items() if rn == row))
        post = {key: _py(ev(t)) for key, t in zip(self.post_keys, self.post_terms)}
        ranks = tuple(tuple(post[(f, j)] for f in self.fields) for j in range(self.n))
        gv = {g: ev(self.gpost[g]).as_long() for g in self.gnames}
        label = (row, None, (("rank", actor),)) if row == QUIT else (row, None if actor < 0 else actor, params)
        return label + (SysState(s.table_fields, ranks, gv["k"], tuple(gv[g] for g in MAILBOX), s.cfg_items),)

    def compare(self, s: SysState, want: set) -> tuple[set, set]:
        """(successors only z3 admits, successors only `want` has) from state `s`.

        Each wanted successor is one pinned query under its row's selector (must be sat); then,
        with every wanted successor excluded, "any transition at all" must be unsat; each model
        of it is decoded, reported and excluded in turn (so a mismatch lists all of them)."""
        sv = self.solver
        sv.push()
        sv.add(*[t == s.rank_value(j, f) for f, j, t in self.pre_terms],
               *[term == s.global_value(g) for g, term in self.pre.globals.items()])
        only_explicit, only_z3 = set(), set()
        excluded = []
        for succ in want:
            idx, pins = self._pins(succ)
            sv.push()
            sv.add(*pins)
            r = sv.check(self.selectors[idx])
            sv.pop()
            assert r != z3.unknown, sv.reason_unknown()
            if r == z3.unsat:
                only_explicit.add(succ)
            excluded.append(z3.Not(z3.And(*pins)))
        sv.add(*excluded)
        while True:
            r = sv.check(self.any)
            assert r != z3.unknown, sv.reason_unknown()
            if r == z3.unsat:
                break
            succ = self._decode(sv.model(), s)
            only_z3.add(succ)
            sv.add(z3.Not(z3.And(*self._pins(succ)[1])))
        sv.pop()
        return only_z3, only_explicit


def _py(v):
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    return v.as_long()


def _explicit(model: Model, s: SysState) -> set:
    return {(lab.row, lab.actor, lab.params, t) for lab, t in model.successors(s)}


@pytest.mark.parametrize("mode", MODES, ids=["pad", "join", "quota"])
@pytest.mark.parametrize("n, xchg", ((1, 0), (2, 0), (3, 0), (2, 1)), ids=["N1", "N2", "N3", "N2-exchange"])
def test_z3_successors_equal_explicit_successors(mode, n, xchg):
    model = Model(W=W, mode=mode, quits=QUITS, xchg=xchg)
    z = _Z3Successors(mode, n, xchg)
    states = _sampled(mode, n, xchg)
    fired = set()
    for s in states:
        want = _explicit(model, s)
        only_z3, only_explicit = z.compare(s, want)
        assert not only_z3 and not only_explicit, (f"state {s}\nonly z3: {sorted(map(str, only_z3))}\n"
                                                   f"only explicit: {sorted(map(str, only_explicit))}")
        fired |= {r for r, *_ in want}
    # the comparison exercised every transition the mode can fire (fillers: pad, N >= 2), aborts included
    expected = {r.name for r in DGAP.rows} | {"complete", QUIT}
    if mode != PAD or n == 1:
        expected.discard("emit_filler")
    if not xchg:
        expected.discard("return_flush")  # the round exchange's flush round
    assert fired == expected, sorted(expected - fired)


class _WithR:
    """A `SysState` seen with the rounds bound R as a global (for ``GV("R")``)."""

    def __init__(self, s: SysState, r: int):
        self._s, self._r = s, r
        self.n, self.cfg = s.n, s.cfg

    def rank_value(self, i, name):
        return self._s.rank_value(i, name)

    def global_value(self, name):
        return self._r if name == "R" else self._s.global_value(name)


@pytest.mark.parametrize("mode", MODES, ids=["pad", "join", "quota"])
def test_every_invariant_conjunct_holds_on_every_reachable_state(mode):
    checked, aborted = 0, 0
    for s in (x for data, quits in INV_DATA for x in _states(mode, data, quits)):
        data = tuple(s.rank_value(j, "d") for j in range(s.n))
        view = _WithR(s, rounds_bound_value(mode, data))
        for c in INVARIANT:
            if mode in c.modes:
                assert holds(c.formula, view), f"{c.name} fails in reachable state {s}"
                checked += 1
        aborted += any(s.rank_value(j, "aborted") for j in range(s.n))
    assert aborted > 100   # the states after an abort are among them
    assert checked > 20_000


@pytest.mark.parametrize("mode", MODES, ids=["pad", "join", "quota"])
def test_deadlock_query_ingredients_match_the_explicit_model(mode):
    """`local_enabled` and `complete_disabled` (the deadlock query's parts) agree with the
    explicit model: a rank has a local successor iff z3 says it is enabled, and the environment
    has no successor iff z3 says complete is disabled (every reachable state at N=2)."""
    model = Model(W=W, mode=mode, quits=QUITS)
    n = 2
    enc = Encoder(DGAP, mode, tag=f"#en{mode}")
    pre = enc.state("pre")
    terms = [(f, j, pre.arr(f)[j]) for f in list(DGAP.field_names) + list(ENV_ARRAYS) for j in range(n)]
    sv = z3.Solver()
    sv.set("timeout", 20_000)
    cfg = enc.cfg
    sv.add(*enc.background, enc.N == n, cfg["W"] == W, cfg["header_len"] == 1, cfg["xchg"] == 0)
    enabled = [enc.local_enabled(pre, z3.IntVal(j)) for j in range(n)]
    disabled = enc.complete_disabled(pre)
    seen = set()
    for s in _sampled(mode, n):
        sv.push()
        sv.add(*[t == s.rank_value(j, f) for f, j, t in terms],
               *[term == s.global_value(g) for g, term in pre.globals.items()])
        for j in range(n):
            want = any(True for _ in model.local_successors(s, j))
            assert sv.check(enabled[j]) == (z3.sat if want else z3.unsat), (s, j)
            seen.add(("rank", want))
        want_env = any(True for _ in model.env_successors(s))
        assert sv.check(disabled) == (z3.unsat if want_env else z3.sat), s
        seen.add(("env", want_env))
        sv.pop()
    assert seen == {("rank", True), ("rank", False), ("env", True), ("env", False)}
