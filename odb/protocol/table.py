"""The DGAP protocol of ODB as one transition table (data, not code).

Legend
    N       number of ranks (any N >= 1; never appears in the table)
    W       window: samples a rank holds per round, carry included (cfg ``W`` >= 1)
    W0      the first round's window (cfg ``W0`` >= 1): a pass's round r holds at most ``cap = min(W, W0 2^r)``
            samples, so its first batches wait for W0 samples, not W; ``W0 >= W``: every round holds W
    mode    PAD (0), JOIN (1) or QUOTA (2) (cfg ``mode``)
    xchg    1 with the round exchange (`odb.core.rank`), else 0 (cfg ``xchg``)
    round   one header collective (an all-gather of a fixed-size header), then the decided number of local batches

One round, as every rank runs it (one row = one ``step()`` of the runtime):

    FILL --take_sample/see_exhausted--> FILL      ask the data source, one sample at a time
    FILL --post_header------------------> WAIT    SYNC: post ``n = buf`` (``buf = cap`` unless exhausted or
                                                  stopping) to the round's collective
    WAIT --return_abort-----------------> DONE    some rank posted a non-zero status: every rank stops
    WAIT --return_stop------------------> DONE    the gathered headers say the epoch is over
    WAIT --return_flush-----------------> FILL    the same, with the round exchange (cfg ``xchg = 1``): one
                                                  more round (``fl``) that takes no sample and posts the
                                                  same windows, so its collective stops again; the rank
                                                  core releases the last round's exchanged batches there
    WAIT --return_go--------------------> EMIT    target ``T`` from the gathered headers only
    EMIT --emit_group / emit_filler-----> EMIT    one local batch per step
    EMIT --end_round--------------------> FILL    the next round's cap: ``min(W, 2 cap)``

Grouping is a contract, not modelled sample by sample: at ``return_go`` the rank's grouping policy picks ``use``
(samples to emit this round, the rest is carried to the next round) within ``[real, buf]``; each ``emit_group`` picks
``take`` (the batch's sample count) so that the ``real`` batches are non-empty and together hold exactly ``use``
samples.  The bounds are part of the rows and are checked at run time and in every trace.

Aborts are part of the table, not a side channel: a rank that must stop (its consumer closed the loader, or its data
source raised) sees ``in.quit > 0`` (its own local status: 1 closed, 2 failed), stops fetching, and posts its next
header with ``st = in.quit``.  The collective's ``max_st`` then sends every rank to DONE in the same round through
``return_abort`` (``aborted = true``), so a stopping rank never leaves its peers blocked in a collective.

The decision (`LETS`) reads only collective `Input`s (aggregates of every rank's header, and the policy's proposal, a
pure function of the gathered headers), never the rank's own fields, so every rank takes every branch together.  The
rank's own fields enter only after the decision, to turn the common target ``T`` into its local counts.

Modes (each a property proved in ``proofs/``):
    PAD    every rank emits exactly ``T`` batches every round; a rank short of samples emits zero-weight fillers; the
           epoch ends when every window is empty.  Every sample exactly once; equal step counts; no ``Join``.
    JOIN   ``T`` never exceeds the smallest non-empty window, so every rank with data emits exactly ``T`` real
           batches; a rank without data emits none (the model side uses DDP ``Join``).  Every sample exactly once.
    QUOTA  ``T`` never exceeds the smallest window; the epoch ends for all ranks at the first round in which some
           rank has nothing left.  Equal step counts; unemitted samples are bounded and reported.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from functools import cached_property

from .expr import (
    Cfg,
    Const,
    Expr,
    Field,
    Hdr,
    Input,
    Let,
    Param,
    and_,
    eq,
    gt,
    ite,
    lt,
    mn,
    mx,
    not_,
    or_,
    render,
    typecheck,
)

__all__ = [
    "PHASES", "FILL", "WAIT", "EMIT", "DONE", "MODES", "PAD", "JOIN", "QUOTA",
    "FieldSpec", "InputSpec", "Choice", "Effect", "Row", "Aggregate", "Table", "DGAP",
    "HEADER_SHAPE",
]

# Phases of a rank (the value of field ``ph``).
FILL, WAIT, EMIT, DONE = 0, 1, 2, 3
PHASES = {"FILL": FILL, "WAIT": WAIT, "EMIT": EMIT, "DONE": DONE}

# Modes (the value of cfg ``mode``).
PAD, JOIN, QUOTA = 0, 1, 2
MODES = {"pad": PAD, "join": JOIN, "quota": QUOTA}

# The header's shape is a configuration constant: it never depends on local state.
HEADER_SHAPE = Cfg("header_len")


@dataclass(frozen=True)
class FieldSpec:
    """One per-rank state field.

    :param kind: "int" or "bool".
    :param init: initial value (an expression over cfg only).
    :param ghost: a ghost field exists for the proofs and the trace only; no
        guard and no decision may read it (checked by `Table.validate`).
    """

    name: str
    kind: str
    init: Expr
    doc: str
    ghost: bool = False


@dataclass(frozen=True)
class InputSpec:
    """A value the environment hands the rank at one step.

    :param source: "data" (the data source's answer) or "collective" (a value
        computed from every rank's header, the same on every rank).
    """

    name: str
    kind: str
    source: str
    doc: str


@dataclass(frozen=True)
class Choice:
    """A value the rank's grouping policy picks, within ``[lo, hi]`` (inclusive)."""

    name: str
    lo: Expr
    hi: Expr
    doc: str


@dataclass(frozen=True)
class Effect:
    """What a row does outside the rank's own state.  A closed set of kinds:

    ``none``     nothing
    ``fetch``    ask the data source for one sample (the answer is ``in.src_has``)
    ``post``     SYNC: enter the round's collective with header ``payload``
                 (field name -> expression) of shape ``shape``
    ``collect``  leave the collective with its result (the collective inputs)
    ``emit``     hand one batch of ``count`` samples to the trainer
    ``filler``   hand one zero-weight filler batch to the trainer
    """

    kind: str
    payload: tuple[tuple[str, Expr], ...] = ()
    shape: Expr | None = None
    count: Expr | None = None

    KINDS = ("none", "fetch", "post", "collect", "emit", "filler")


@dataclass(frozen=True)
class Row:
    """One transition of one rank: ``phase_from --guard/effect/updates--> phase_to``.

    Fields not named in `updates` keep their value (the frame is implicit and
    generated mechanically by every engine from this fact).  Updates are
    simultaneous: every right-hand side reads the state before the row.
    """

    name: str
    phase_from: int
    guard: Expr
    effect: Effect
    updates: tuple[tuple[str, Expr], ...]
    phase_to: int
    doc: str
    choices: tuple[Choice, ...] = ()


@dataclass(frozen=True)
class Aggregate:
    """A collective result: ``op`` ("max" or "min") over every rank's ``of`` (a header expression)."""

    name: str
    op: str
    of: Expr
    doc: str


@dataclass(frozen=True)
class Table:
    """The protocol: fields, inputs, aggregates, decision definitions and rows."""

    name: str
    fields: tuple[FieldSpec, ...]
    inputs: tuple[InputSpec, ...]
    aggregates: tuple[Aggregate, ...]
    proposal: Choice
    lets: tuple[tuple[str, Expr], ...]
    rows: tuple[Row, ...]
    cfg: tuple[tuple[str, str], ...]

    # -- lookups -------------------------------------------------------------
    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row {name!r}; rows: {[r.name for r in self.rows]}")

    def rows_from(self, phase: int) -> list[Row]:
        """The rows whose ``phase_from`` is `phase`, in table order (cached; do not mutate)."""
        by_phase = self.__dict__.get("_rows_by_phase")
        if by_phase is None:
            by_phase = {}
            for r in self.rows:
                by_phase.setdefault(r.phase_from, []).append(r)
            self.__dict__["_rows_by_phase"] = by_phase
        return by_phase.get(phase, [])

    def __getstate__(self) -> dict:
        """Pickled: the table's fields only, not what is cached beside them (the interpreter's generated functions
        cannot be pickled; they are generated again on use)."""
        return {f.name: getattr(self, f.name) for f in dataclass_fields(self)}

    @cached_property
    def let_map(self) -> dict[str, Expr]:
        """The decision definitions by name (computed once; do not mutate)."""
        return dict(self.lets)

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def header_fields(self) -> tuple[str, ...]:
        post = [r for r in self.rows if r.effect.kind == "post"]
        return tuple(n for n, _ in post[0].effect.payload) if post else ()

    # -- identity ------------------------------------------------------------
    def to_json(self) -> dict:
        """A canonical, JSON-serialisable description (rendered expressions)."""
        rend = lambda e: None if e is None else render(e)  # noqa: E731
        return {
            "name": self.name,
            "cfg": [list(c) for c in self.cfg],
            "fields": [[f.name, f.kind, rend(f.init), f.ghost] for f in self.fields],
            "inputs": [[i.name, i.kind, i.source] for i in self.inputs],
            "aggregates": [[a.name, a.op, rend(a.of)] for a in self.aggregates],
            "proposal": [self.proposal.name, rend(self.proposal.lo), rend(self.proposal.hi)],
            "lets": [[n, rend(e)] for n, e in self.lets],
            "rows": [
                {
                    "name": r.name, "from": r.phase_from, "to": r.phase_to,
                    "guard": rend(r.guard),
                    "effect": [r.effect.kind, [[n, rend(e)] for n, e in r.effect.payload],
                               rend(r.effect.shape), rend(r.effect.count)],
                    "choices": [[c.name, rend(c.lo), rend(c.hi)] for c in r.choices],
                    "updates": [[n, rend(e)] for n, e in r.updates],
                }
                for r in self.rows
            ],
        }

    @property
    def hash(self) -> str:
        """Stable sha256 of the table's canonical JSON (docs excluded)."""
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def replace_row(self, name: str, **changes) -> "Table":
        """A copy with row `name` changed (used by the mutants)."""
        self.row(name)
        rows = tuple(replace(r, **changes) if r.name == name else r for r in self.rows)
        return replace(self, rows=rows)

    # -- well-formedness -----------------------------------------------------
    def kinds(self) -> dict[Expr, str]:
        k: dict[Expr, str] = {Field(f.name): f.kind for f in self.fields}
        k.update({Input(i.name): i.kind for i in self.inputs})
        k.update({Cfg(c): kind for c, kind in self.cfg})
        k[Param(self.proposal.name)] = "int"
        for r in self.rows:
            for c in r.choices:
                k[Param(c.name)] = "int"
        k[Hdr("n")] = "int"
        k[Hdr("st")] = "int"
        return k

    def validate(self) -> None:
        """Raise ValueError if the table is ill formed.

        Checks: unique row names, known update targets, well-typed expressions,
        ghost fields never read by guards/updates of non-ghost fields/decisions,
        header shape independent of local state, decisions read no field.
        """
        names = [r.name for r in self.rows]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate row names: {names}")
        kinds = self.kinds()
        lets = self.let_map
        ghosts = {Field(f.name) for f in self.fields if f.ghost}
        fields = set(self.field_names)
        from .expr import leaves

        def reads(e: Expr) -> set[Expr]:
            out = set()
            for leaf in leaves(e):
                out |= reads(lets[leaf.name]) if isinstance(leaf, Let) else {leaf}
            return out

        collective = {Input(i.name) for i in self.inputs if i.source == "collective"}
        for n, e in self.lets:
            local = [x for x in reads(e)
                     if isinstance(x, (Field, Param)) or (isinstance(x, Input) and x not in collective)]
            if local:
                raise ValueError(f"decision {n!r} reads rank-local values {sorted(map(render, local))}: {render(e)}; "
                                 "a decision may read only collective inputs and cfg, so every rank takes every "
                                 "branch together")
        for r in self.rows:
            if typecheck(r.guard, kinds, lets) != "bool":
                raise ValueError(f"guard of {r.name} is not boolean")
            if r.effect.kind not in Effect.KINDS:
                raise ValueError(f"row {r.name}: unknown effect {r.effect.kind!r}")
            if reads(r.guard) & ghosts:
                raise ValueError(f"guard of {r.name} reads a ghost field")
            for c in r.choices:
                for b in (c.lo, c.hi):
                    typecheck(b, kinds, lets)
                    if reads(b) & ghosts:
                        raise ValueError(f"choice {c.name} of {r.name} reads a ghost field")
            for tgt, e in r.updates:
                if tgt not in fields:
                    raise ValueError(f"row {r.name} updates unknown field {tgt!r}")
                spec = next(f for f in self.fields if f.name == tgt)
                if typecheck(e, kinds, lets) != spec.kind:
                    raise ValueError(f"row {r.name}: update of {tgt} has the wrong kind")
                if not spec.ghost and reads(e) & ghosts:
                    raise ValueError(f"row {r.name}: {tgt} is computed from a ghost field")
            if r.effect.kind == "post":
                if r.effect.shape is None or any(isinstance(x, (Field, Input, Param)) for x in reads(r.effect.shape)):
                    raise ValueError(f"row {r.name}: the collective's shape must depend on cfg only")


# ---------------------------------------------------------------------------
# The table.
# ---------------------------------------------------------------------------

W = Cfg("W")
MODE = Cfg("mode")
W0 = Cfg("W0")
ph, rd, buf, exhausted, cap = Field("ph"), Field("rd"), Field("buf"), Field("exhausted"), Field("cap")
T, nreal, nfill, pend = Field("T"), Field("nreal"), Field("nfill"), Field("pend")
fl, XCHG = Field("fl"), Cfg("xchg")
em, nb, kb = Field("em"), Field("nb"), Field("kb")

_FIELDS = (
    FieldSpec("ph", "int", Const(FILL), "phase: FILL, WAIT, EMIT or DONE"),
    FieldSpec("rd", "int", Const(0), "round: number of header collectives this rank has completed"),
    FieldSpec("buf", "int", Const(0), "samples held: this round's window, carry included"),
    FieldSpec("exhausted", "bool", Const(False), "the data source said it is exhausted"),
    FieldSpec("cap", "int", mn(W, W0), "this round's window: W0 in a pass's first round, doubling each round up to W"),
    FieldSpec("T", "int", Const(0), "this round's common target (batches per rank)"),
    FieldSpec("nreal", "int", Const(0), "real batches still to emit this round"),
    FieldSpec("nfill", "int", Const(0), "filler batches still to emit this round (PAD)"),
    FieldSpec("pend", "int", Const(0), "samples still to emit this round (the rest of buf is carry)"),
    FieldSpec("aborted", "bool", Const(False), "the epoch ended by an abort (some rank posted a non-zero status)"),
    FieldSpec("fl", "bool", Const(False), "the exchange's flush round: the pass ends at its collective"),
    FieldSpec("em", "int", Const(0), "ghost: samples emitted so far", ghost=True),
    FieldSpec("nb", "int", Const(0), "ghost: batches emitted so far, fillers included", ghost=True),
    FieldSpec("kb", "int", Const(0), "ghost: batches emitted in this round, fillers included", ghost=True),
)

_INPUTS = (
    InputSpec("src_has", "bool", "data", "the data source produced a sample (false: it is exhausted)"),
    InputSpec("quit", "int", "local", "this rank must stop: 0 no, 1 its consumer closed the loader, 2 a local error"),
    InputSpec("ready", "bool", "collective", "this rank's collective of round rd has completed"),
    InputSpec("max_st", "int", "collective", "largest posted status (0: every rank is healthy)"),
    InputSpec("max_n", "int", "collective", "largest posted window"),
    InputSpec("min_n", "int", "collective", "smallest posted window"),
    InputSpec("min_pos_n", "int", "collective", "smallest non-empty posted window (W+1 if none)"),
    InputSpec("proposal", "int", "collective",
              "the alignment policy's target, a pure function of the gathered headers"),
)

_AGGREGATES = (
    Aggregate("max_st", "max", Hdr("st"), "largest status: non-zero means some rank stops"),
    Aggregate("max_n", "max", Hdr("n"), "largest window"),
    Aggregate("min_n", "min", Hdr("n"), "smallest window"),
    Aggregate("min_pos_n", "min", ite(gt(Hdr("n"), 0), Hdr("n"), W + 1), "smallest non-empty window"),
)

_PROPOSAL = Choice("proposal", Const(1), W, "the alignment policy's proposed target (clamped by `T`)")

# The decision: a function of the collective's result only.
_LETS = (
    ("abort", gt(Input("max_st"), 0)),
    ("stop", ite(eq(MODE, QUOTA), eq(Input("min_n"), 0), eq(Input("max_n"), 0))),
    ("hi", ite(eq(MODE, PAD), Input("max_n"), ite(eq(MODE, JOIN), Input("min_pos_n"), Input("min_n")))),
    ("target", mx(Const(1), mn(Input("proposal"), Let("hi")))),
)

_real = mn(Let("target"), buf)  # local: real batches this rank can form this round

_ROWS = (
    Row("take_sample", FILL, and_(not_(fl), not_(exhausted), lt(buf, cap), eq(Input("quit"), 0), Input("src_has")),
        Effect("fetch"),
        (("buf", buf + 1),), FILL,
        "the source produced a sample: add it to the window"),
    Row("see_exhausted", FILL, and_(not_(fl), not_(exhausted), lt(buf, cap), eq(Input("quit"), 0),
                                    not_(Input("src_has"))),
        Effect("fetch"),
        (("exhausted", Const(True)),), FILL,
        "the source is exhausted: remember it (a rank learns this only by asking)"),
    Row("post_header", FILL, or_(eq(buf, cap), exhausted, gt(Input("quit"), 0), fl),
        Effect("post", payload=(("n", buf), ("st", Input("quit"))), shape=HEADER_SHAPE),
        (), WAIT,
        "SYNC: every rank posts its window size and status to the round's collective: full, exhausted or stopping"),
    Row("return_abort", WAIT, and_(Input("ready"), Let("abort")), Effect("collect"),
        (("rd", rd + 1), ("aborted", Const(True))), DONE,
        "some rank posted a non-zero status: every rank stops in the same round"),
    Row("return_stop", WAIT, and_(Input("ready"), not_(Let("abort")), Let("stop"), or_(fl, not_(eq(XCHG, 1)))),
        Effect("collect"),
        (("rd", rd + 1),), DONE,
        "the gathered headers say the epoch is over: every rank stops in the same round"),
    Row("return_flush", WAIT, and_(Input("ready"), not_(Let("abort")), Let("stop"), not_(fl), eq(XCHG, 1)),
        Effect("collect"),
        (("rd", rd + 1), ("fl", Const(True))), FILL,
        "the exchange: the epoch is over, but the last round's placed batches need one more collective for their "
        "counts; every rank posts again, taking no sample"),
    Row("return_go", WAIT, and_(Input("ready"), not_(Let("abort")), not_(Let("stop"))), Effect("collect"),
        (("rd", rd + 1), ("T", Let("target")), ("nreal", _real),
         ("nfill", ite(eq(MODE, PAD), Let("target") - _real, Const(0))),
         ("pend", Param("use")), ("kb", Const(0))), EMIT,
        "the common target T; this rank will emit `real` groups holding `use` samples, plus fillers in PAD",
        choices=(Choice("use", _real, buf, "samples the grouping emits this round; buf - use is carried"),)),
    Row("emit_group", EMIT, gt(nreal, 0), Effect("emit", count=Param("take")),
        (("buf", buf - Param("take")), ("pend", pend - Param("take")), ("nreal", nreal - 1),
         ("em", em + Param("take")), ("nb", nb + 1), ("kb", kb + 1)), EMIT,
        "hand one real batch of `take` samples to the trainer",
        choices=(Choice("take", ite(eq(nreal, 1), pend, Const(1)), ite(eq(nreal, 1), pend, pend - nreal + 1),
                        "samples in this batch: every batch non-empty, the last takes the rest"),)),
    Row("emit_filler", EMIT, and_(eq(nreal, 0), gt(nfill, 0)), Effect("filler"),
        (("nfill", nfill - 1), ("nb", nb + 1), ("kb", kb + 1)), EMIT,
        "hand one zero-weight filler batch to the trainer (PAD only)"),
    Row("end_round", EMIT, and_(eq(nreal, 0), eq(nfill, 0)), Effect("none"),
        (("T", Const(0)), ("cap", mn(W, cap + cap))), FILL,
        "the round's batches are out: refill the window, up to the next round's cap"),
)

DGAP = Table(
    name="dgap",
    fields=_FIELDS,
    inputs=_INPUTS,
    aggregates=_AGGREGATES,
    proposal=_PROPOSAL,
    lets=_LETS,
    rows=_ROWS,
    cfg=(("W", "int"), ("W0", "int"), ("mode", "int"), ("header_len", "int"), ("xchg", "int")),
)
DGAP.validate()
