"""The composed system (table + environment of `models.env`) as z3 terms, for every N.

Legend
    N            a symbolic number of ranks, N >= 1; ``rank(j) := 0 <= j < N``
    per-rank     every table field and every per-rank environment field (`models.logic.RANK_ENV`: src, d, posted,
                 pn, pshape, qt, pst) is a z3 function ``Int -> Int`` (``Int -> Bool`` for a bool field); see `Fn`
    globals      ``k`` (collectives completed) and the mailbox of the last completed collective: max_st, max_n,
                 min_n, min_pos_n, proposal
    cfg          one z3 constant per ``Table.cfg`` entry (``W >= 1``; ``mode`` fixed per proof); rigid: the same in
                 the pre- and post-state
    R            a rigid symbol for the rounds bound, read as ``GV("R")`` by the auxiliary invariants (see
                 `proofs.symbolic.invariants`)

Every transition is generated from the table through `odb.protocol.expr.to_z3`; nothing here knows a row by name.  A
local row at rank ``i`` is: its phase, its guard, its choices as existential parameters within their bounds (each
bound reads the choices before it, as `odb.protocol.machine.choice_bounds` does), and a post-state in which each
updated field is ``Store(f, i, e)`` (`Fn.store`) (updates are simultaneous: every right-hand side reads the
pre-state), ``ph`` is ``Store(ph, i, phase_to)``, and every other array and global is the pre-state's term itself
(the frame, generated from the row's update list).  The post-state is a term of the pre-state and the parameters, so
a frame can never be forgotten.  The environment effects are those of `models.env.Model`:

    fetch     ``src[i] -= 1`` iff the row read ``in.src_has`` (short-circuit evaluation, as `machine.fire` records it)
              and it was true
    post      ``posted[i] = 1``, ``pn[i] = payload n``, ``pst[i] = payload st``, ``pshape[i] = shape``
    complete  ``forall j. rank(j) => ph[j] = WAIT and rd[j] = k and posted[j] = 1 and pshape[j] = s`` (one common
              shape ``s``); each aggregate is a parameter ``m`` with ``forall j. of(j) <= m`` (max; ``>=`` for min)
              and a witness rank ``w`` with ``of(w) = m``; the proposal is a parameter within the table's proposal
              bounds; ``k += 1``; the mailbox slots get the aggregates in table order then the proposal; posted, pn,
              pshape and pst become 0 everywhere (qt is kept).
    quit      (`models.env.Model.quit_successors`, any number of ranks: the all-N proofs allow every rank to stop) at
              a rank ``i`` with ``qt[i] = 0`` and ``ph[i] != DONE``: ``qt[i] = 1``, everything else framed.

Inputs a guard reads (`models.env.Model.inputs`): ``src_has = src[i] > 0``, ``quit = qt[i]``,
``ready = (k == rd[i] + 1)``, the collective inputs = the mailbox globals.

Anything the table asks for that the environment does not provide (an unknown input, field, header field or
parameter, an ill-sorted update) raises `EncodingError`, which the prover turns into a failed verdict.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping

import z3

from models.logic import GV, RF, Exists, Forall
from odb.protocol.expr import Cfg, Expr, Field, Hdr, Input, Let, Op, Param, to_z3
from odb.protocol.table import DONE, WAIT, Row, Table

__all__ = ["EncodingError", "Encoder", "Sym", "Step", "ENV_ARRAYS", "MAILBOX", "GLOBALS", "QUIT"]

ENV_ARRAYS = ("src", "d", "posted", "pn", "pshape", "qt", "pst")
MAILBOX = ("max_st", "max_n", "min_n", "min_pos_n", "proposal")  # slot order of models.env.SysState.mb
HEADER = {"n": "pn", "st": "pst", "shape": "pshape"}  # header field -> the mailbox's per-rank copy
GLOBALS = ("k",) + MAILBOX
QUIT = "quit"  # the name of the environment's stop transition (models.env.Model.quit_successors)

_fresh = itertools.count()


class EncodingError(Exception):
    """The table asks for something the symbolic environment cannot give it."""


class Fn:
    """A per-rank field as a map rank -> z3 term: ``f[j]``.

    The pre-state's fields are z3 functions ``Int -> Int`` (or ``Bool``); a
    post-state's fields are terms of the pre-state (``store``, ``const``), so a
    transition needs no array theory and no frame equations: a field a row does
    not update *is* the pre-state's field.
    """

    __slots__ = ("_at",)

    def __init__(self, at):
        self._at = at

    def __getitem__(self, j):
        return self._at(z3.IntVal(j) if isinstance(j, int) else j)

    @staticmethod
    def function(name: str, rng) -> "Fn":
        fn = z3.Function(name, z3.IntSort(), rng)
        return Fn(lambda j: fn(j))

    def store(self, i, value) -> "Fn":
        """``Store(self, i, value)``."""
        return Fn(lambda j: value if z3.eq(j, i) else z3.If(j == i, value, self[j]))

    def store_if(self, cond, i, value) -> "Fn":
        """``If(cond, Store(self, i, value), self)``."""
        return Fn(lambda j: z3.If(z3.And(cond, j == i), value, self[j]))

    @staticmethod
    def const(value) -> "Fn":
        return Fn(lambda j: value)


@dataclass
class Sym:
    """One symbolic system state: per-rank fields (`Fn`) and globals (z3 terms)."""

    arrays: dict[str, Fn]
    globals: dict[str, z3.ArithRef]

    def arr(self, name: str) -> Fn:
        try:
            return self.arrays[name]
        except KeyError:
            raise EncodingError(f"no per-rank field {name!r}; fields: {sorted(self.arrays)}") from None


@dataclass
class Step:
    """One symbolic transition: its enabling constraints, its post-state and its parameters."""

    name: str                   # row name, "complete" or "quit"
    rank: z3.ArithRef | None    # acting rank (None for complete; the stopping rank for quit)
    guard: list                 # z3 Bool constraints on pre-state and parameters
    post: Sym
    params: dict[str, z3.ExprRef]
    kind: str = "row"           # "row" (a table row), "complete" or "quit" (environment transitions)


class Encoder:
    """Builds z3 terms for one table and one mode (or a symbolic mode if ``mode is None``)."""

    def __init__(self, table: Table, mode: int | None, tag: str = ""):
        self.table = table
        self.tag = tag
        self.lets = table.let_map
        self.N = z3.Int(f"N{tag}")
        self.R = z3.Int(f"R{tag}")
        self.cfg: dict[str, z3.ExprRef] = {}
        for name, kind in table.cfg:
            self.cfg[name] = z3.Bool(f"{name}{tag}") if kind == "bool" else z3.Int(f"{name}{tag}")
        if "W" not in self.cfg or "mode" not in self.cfg:
            raise EncodingError(f"table cfg must declare W and mode; got {[c for c, _ in table.cfg]}")
        clash = set(table.field_names) & set(ENV_ARRAYS)
        if clash:
            raise EncodingError(f"table fields {sorted(clash)} clash with the environment's per-rank fields")
        taken = {r.name for r in table.rows} & {"complete", QUIT}
        if taken:
            raise EncodingError(f"table rows {sorted(taken)} clash with the environment's transitions")
        if len(table.aggregates) != len(MAILBOX) - 1:
            raise EncodingError(
                f"the environment's mailbox has {len(MAILBOX) - 1} aggregate slots {MAILBOX[:-1]}; the table declares "
                f"{len(table.aggregates)} aggregates {[a.name for a in table.aggregates]}")
        self.kind = {f.name: f.kind for f in table.fields}
        self.background = [self.N >= 1, self.cfg["W"] >= 1]
        if mode is not None:
            self.background.append(self.cfg["mode"] == mode)
        if "W0" in self.cfg:  # the first round's window: any positive int (W0 >= W: no ramp)
            self.background.append(self.cfg["W0"] >= 1)
        if "xchg" in self.cfg:  # the round exchange: off (0) or on (1)
            self.background.append(z3.Or(self.cfg["xchg"] == 0, self.cfg["xchg"] == 1))

    # -- basics --------------------------------------------------------------
    def rank(self, j) -> z3.BoolRef:
        return z3.And(0 <= j, j < self.N)

    def fresh(self, base: str) -> z3.ArithRef:
        return z3.Int(f"{base}!{next(_fresh)}")

    def state(self, tag: str) -> Sym:
        arrays = {}
        for f in self.table.fields:
            rng = z3.BoolSort() if f.kind == "bool" else z3.IntSort()
            arrays[f.name] = Fn.function(f"{f.name}@{tag}{self.tag}", rng)
        for name in ENV_ARRAYS:
            arrays[name] = Fn.function(f"{name}@{tag}{self.tag}", z3.IntSort())
        return Sym(arrays, {g: z3.Int(f"{g}@{tag}{self.tag}") for g in GLOBALS})

    def _cfg(self, name: str):
        try:
            return self.cfg[name]
        except KeyError:
            raise EncodingError(f"unknown cfg {name!r}; cfg: {sorted(self.cfg)}") from None

    def _z3(self, e: Expr, leaf) -> z3.ExprRef:
        try:
            return to_z3(e, leaf, self.lets)
        except EncodingError:
            raise
        except (KeyError, TypeError, z3.Z3Exception, AttributeError, AssertionError) as exc:
            raise EncodingError(f"cannot encode {e!r}: {type(exc).__name__}: {exc}") from exc

    # -- a rank's view -------------------------------------------------------
    def _input(self, s: Sym, i, name: str):
        if name == "src_has":
            return s.arr("src")[i] > 0
        if name == "quit":
            return s.arr("qt")[i]
        if name == "ready":
            return s.globals["k"] == s.arr("rd")[i] + 1
        if name in MAILBOX:
            return s.globals[name]
        raise EncodingError(
            f"the environment provides no input {name!r}; inputs: ['src_has', 'quit', 'ready', *{MAILBOX}]")

    def local_leaf(self, s: Sym, i, params: Mapping[str, z3.ExprRef]):
        def leaf(node: Expr):
            if isinstance(node, Field):
                return s.arr(node.name)[i]
            if isinstance(node, Input):
                return self._input(s, i, node.name)
            if isinstance(node, Cfg):
                return self._cfg(node.name)
            if isinstance(node, Param):
                if node.name not in params:
                    raise EncodingError(f"parameter {node.name!r} is read where it is not chosen "
                                        f"(chosen: {sorted(params)})")
                return params[node.name]
            raise EncodingError(f"a rank's row cannot read {node!r}")
        return leaf

    def _reads(self, e: Expr, name: str, leaf) -> z3.BoolRef:
        """Whether concrete evaluation of `e` (short-circuit ``and``/``or``/``ite``) reads ``Input(name)``."""
        if isinstance(e, Input):
            return z3.BoolVal(e.name == name)
        if isinstance(e, Let):
            if e.name not in self.lets:
                raise EncodingError(f"Let({e.name!r}) is not defined")
            return self._reads(self.lets[e.name], name, leaf)
        if not isinstance(e, Op):
            return z3.BoolVal(False)
        r = [self._reads(a, name, leaf) for a in e.args]
        if e.op == "and":
            return z3.Or(r[0], z3.And(self._z3(e.args[0], leaf), r[1]))
        if e.op == "or":
            return z3.Or(r[0], z3.And(z3.Not(self._z3(e.args[0], leaf)), r[1]))
        if e.op == "ite":
            return z3.Or(r[0], z3.If(self._z3(e.args[0], leaf), r[1], r[2]))
        return z3.Or(*r) if len(r) > 1 else r[0]

    # -- transitions ---------------------------------------------------------
    def local_step(self, row: Row, s: Sym, i, tag: str) -> Step:
        """The symbolic firing of `row` at rank `i` (a z3 Int term) from `s`."""
        try:
            return self._local_step(row, s, i, tag)
        except EncodingError:
            raise
        except (KeyError, TypeError, ValueError, z3.Z3Exception, AttributeError) as exc:
            raise EncodingError(f"row {row.name}: {type(exc).__name__}: {exc}") from exc

    def _local_step(self, row: Row, s: Sym, i, tag: str) -> Step:
        guard_leaf = self.local_leaf(s, i, {})
        guard = [self.rank(i), s.arr("ph")[i] == row.phase_from, self._z3(row.guard, guard_leaf)]
        params: dict[str, z3.ExprRef] = {}
        for c in row.choices:
            leaf = self.local_leaf(s, i, dict(params))
            lo, hi = self._z3(c.lo, leaf), self._z3(c.hi, leaf)
            p = z3.Int(f"{row.name}.{c.name}@{tag}{self.tag}")
            guard += [lo <= p, p <= hi]
            params[c.name] = p
        leaf = self.local_leaf(s, i, params)
        arrays = dict(s.arrays)
        for tgt, e in row.updates:
            if tgt not in self.kind:
                raise EncodingError(f"row {row.name} updates unknown field {tgt!r}")
            val = self._z3(e, leaf)
            want = z3.BoolSort() if self.kind[tgt] == "bool" else z3.IntSort()
            if val.sort() != want:
                raise EncodingError(f"row {row.name}: update of {tgt} has sort {val.sort()}, the field is {want}")
            arrays[tgt] = s.arr(tgt).store(i, val)
        arrays["ph"] = s.arr("ph").store(i, z3.IntVal(row.phase_to))
        eff = row.effect
        if eff.kind == "fetch":
            # what the rank read: guard, choice bounds, updates (machine.fire records exactly these)
            exprs = [row.guard] + [b for c in row.choices for b in (c.lo, c.hi)] + [e for _, e in row.updates]
            read = z3.Or(*[self._reads(e, "src_has", leaf) for e in exprs])
            src = s.arr("src")
            arrays["src"] = src.store_if(z3.And(read, src[i] > 0), i, src[i] - 1)
        elif eff.kind == "post":
            payload = dict(eff.payload)
            if "n" not in payload or "st" not in payload or eff.shape is None:
                raise EncodingError(f"row {row.name}: a post must carry header field 'n', header field 'st' "
                                    f"and a shape (payload {sorted(payload)}, shape {eff.shape!r}); "
                                    f"models.env.Model stores exactly these")
            arrays["posted"] = s.arr("posted").store(i, z3.IntVal(1))
            for hf in ("n", "st"):
                val = self._z3(payload[hf], leaf)
                if val.sort() != z3.IntSort():
                    raise EncodingError(f"row {row.name}: header field {hf!r} has sort {val.sort()}, not Int")
                arrays[HEADER[hf]] = s.arr(HEADER[hf]).store(i, val)
            arrays["pshape"] = s.arr("pshape").store(i, self._z3(eff.shape, leaf))
        elif eff.kind not in ("none", "collect", "emit", "filler"):
            raise EncodingError(f"row {row.name}: unknown effect {eff.kind!r}")
        return Step(row.name, i, guard, Sym(arrays, dict(s.globals)), params)

    def _hdr_leaf(self, s: Sym, j):
        def leaf(node: Expr):
            if isinstance(node, Hdr):
                if node.name in HEADER:
                    return s.arr(HEADER[node.name])[j]
                raise EncodingError(f"the mailbox holds header fields {sorted(HEADER)}, not {node.name!r}")
            if isinstance(node, Cfg):
                return self._cfg(node.name)
            raise EncodingError(f"an aggregate can read only header fields and cfg, not {node!r}")
        return leaf

    def complete_step(self, s: Sym, tag: str) -> Step:
        """The environment's ``complete`` transition from `s`."""
        try:
            return self._complete_step(s, tag)
        except EncodingError:
            raise
        except (KeyError, TypeError, ValueError, z3.Z3Exception, AttributeError) as exc:
            raise EncodingError(f"complete: {type(exc).__name__}: {exc}") from exc

    def _complete_step(self, s: Sym, tag: str) -> Step:
        j = self.fresh("j")
        shape = z3.Int(f"complete.shape@{tag}{self.tag}")
        body = [s.arr("ph")[j] == WAIT, s.arr("rd")[j] == s.globals["k"], s.arr("posted")[j] == 1,
                s.arr("pshape")[j] == shape]
        guard = []
        params: dict[str, z3.ExprRef] = {"shape": shape}
        slots = []
        for idx, a in enumerate(self.table.aggregates):
            m = z3.Int(f"complete.{idx}.{a.name}@{tag}{self.tag}")
            w = z3.Int(f"complete.{idx}.witness@{tag}{self.tag}")
            of_j = self._z3(a.of, self._hdr_leaf(s, j))
            of_w = self._z3(a.of, self._hdr_leaf(s, w))
            body.append(of_j <= m if a.op == "max" else m <= of_j)  # models.env: op "max" or else min
            guard += [self.rank(w), of_w == m]
            params[f"{a.name}"] = m
            params[f"{a.name}.witness"] = w
            slots.append(m)
        guard.insert(0, z3.ForAll([j], z3.Implies(self.rank(j), z3.And(*body))))
        p = self.table.proposal
        cfg_leaf = self._cfg_leaf()
        v = z3.Int(f"complete.proposal@{tag}{self.tag}")
        guard += [self._z3(p.lo, cfg_leaf) <= v, v <= self._z3(p.hi, cfg_leaf)]
        params["proposal"] = v
        slots.append(v)
        g = {"k": s.globals["k"] + 1}
        g.update(zip(MAILBOX, slots))
        arrays = dict(s.arrays)
        zero = Fn.const(z3.IntVal(0))
        arrays.update(posted=zero, pn=zero, pshape=zero, pst=zero)
        return Step("complete", None, guard, Sym(arrays, g), params, kind="complete")

    def quit_step(self, s: Sym, i) -> Step:
        """The environment's ``quit`` transition at rank `i`: its local status turns 0 -> 1 before DONE."""
        qt = s.arr("qt")
        guard = [self.rank(i), qt[i] == 0, s.arr("ph")[i] != DONE]
        arrays = dict(s.arrays)
        arrays["qt"] = qt.store(i, z3.IntVal(1))
        return Step(QUIT, i, guard, Sym(arrays, dict(s.globals)), {}, kind="quit")

    def _cfg_leaf(self):
        def leaf(node: Expr):
            if isinstance(node, Cfg):
                return self._cfg(node.name)
            raise EncodingError(f"only cfg may be read here, not {node!r}")
        return leaf

    def steps(self, s: Sym, tag: str) -> list[Step]:
        """Every transition from `s`: each row at a fresh rank, then complete, then quit."""
        out = []
        for row in self.table.rows:
            i = z3.Int(f"i.{row.name}@{tag}{self.tag}")
            out.append(self.local_step(row, s, i, f"{tag}"))
        out.append(self.complete_step(s, tag))
        out.append(self.quit_step(s, z3.Int(f"i.{QUIT}@{tag}{self.tag}")))
        return out

    # -- enabledness (deadlock) ----------------------------------------------
    def row_enabled(self, row: Row, s: Sym, i) -> z3.BoolRef:
        """`row` can fire at rank `i` (phase, guard, and every choice has a value in its bounds)."""
        st = self.local_step(row, s, i, f"en.{row.name}.{next(_fresh)}")
        body = z3.And(*st.guard[1:])
        ps = list(st.params.values())
        return z3.Exists(ps, body) if ps else body

    def local_enabled(self, s: Sym, i) -> z3.BoolRef:
        """Some row of rank `i` can fire (guard true and every choice has a value in its bounds)."""
        return z3.Or(*[self.row_enabled(row, s, i) for row in self.table.rows])

    def complete_disabled(self, s: Sym) -> z3.BoolRef:
        """``complete`` has no successor: written existentially (some rank is not posted at round k,
        two posted shapes differ, or the proposal range is empty).  Only for top-level positive use
        (its ranks are free constants, i.e. implicitly existential)."""
        # Free constants rather than Exists: the formula is asserted positively at top level, so
        # this is the same, and the counterexample then names the rank that is not ready.
        j, j2, j3 = z3.Int("q.not_ready"), z3.Int("q.shape_a"), z3.Int("q.shape_b")
        not_ready = z3.And(self.rank(j), z3.Not(z3.And(
            s.arr("ph")[j] == WAIT, s.arr("rd")[j] == s.globals["k"], s.arr("posted")[j] == 1)))
        mismatch = z3.And(self.rank(j2), self.rank(j3), s.arr("pshape")[j2] != s.arr("pshape")[j3])
        p = self.table.proposal
        leaf = self._cfg_leaf()
        return z3.Or(not_ready, mismatch, self._z3(p.lo, leaf) > self._z3(p.hi, leaf))

    # -- initial states and formulas -----------------------------------------
    def init(self, s: Sym) -> z3.BoolRef:
        j = self.fresh("j")
        leaf = self._cfg_leaf()
        body = [s.arr(f.name)[j] == self._z3(f.init, leaf) for f in self.table.fields]
        body += [s.arr("src")[j] == s.arr("d")[j], s.arr("d")[j] >= 0,
                 s.arr("posted")[j] == 0, s.arr("pn")[j] == 0, s.arr("pshape")[j] == 0,
                 s.arr("qt")[j] == 0, s.arr("pst")[j] == 0]
        return z3.And(z3.ForAll([j], z3.Implies(self.rank(j), z3.And(*body))),
                      *[s.globals[g] == 0 for g in GLOBALS])

    def formula(self, e: Expr, s: Sym, bind: Mapping[str, z3.ExprRef] | None = None) -> z3.ExprRef:
        """A `models.logic` formula over state `s`; ``Forall``/``Exists`` range over ranks 0 <= j < N."""
        bind = dict(bind or {})

        def leaf(node: Expr):
            if isinstance(node, RF):
                if node.rank not in bind:
                    raise EncodingError(f"rank variable {node.rank!r} is not bound in {node!r}")
                return s.arr(node.field)[bind[node.rank]]
            if isinstance(node, GV):
                if node.name in s.globals:
                    return s.globals[node.name]
                if node.name == "R":
                    return self.R
                return self._cfg(node.name)
            if isinstance(node, (Forall, Exists)):
                j = self.fresh(node.var)
                body = self.formula(node.body, s, {**bind, node.var: j})
                if isinstance(node, Forall):
                    return z3.ForAll([j], z3.Implies(self.rank(j), body))
                return z3.Exists([j], z3.And(self.rank(j), body))
            raise EncodingError(f"a state formula cannot read {node!r}")

        return self._z3(e, leaf)
