"""Run the checks on every mutant and record who kills it.

Legend
    killer   a verdict with result "failed" ("property/mode", "(z3)" appended for
             the z3 engine): an explicit counterexample or a z3 counterexample.
             "unknown" (z3 gave up, a truncated search), "not found" (a missing
             witness) and "not attempted" are never kills.  A mutant is killed when
             at least one check fails on it, and killed *as expected* when its
             `Mutant.expected` property is among the failures
    lost witness
             a ``sometimes`` witness that the mutant's complete search does not
             reach although the unmutated table's search of the same scope and mode
             does (`reference_witnesses`): the mutant removed that behaviour, and a
             "failed" verdict ``<witness>`` is added for it.  A witness that is not
             found on the unmutated table either (the scope is too small for it)
             stays "not found" and is no kill
    scopes   `MUTANT_SCOPES` (small: a counterexample needs at most a few ranks),
             tried in order until the expected killer fails: first a cheap one
             with a quit (the abort rows), then one without quits and D > W (a
             full window with data left); the killers listed are those of the
             scopes that ran

The explicit engine always runs; the z3 engine (`proofs.symbolic.prove_all`)
runs when ``symbolic=True`` and is importable.  The shortest explicit
counterexample of the expected killer is kept as a step table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache

from models.scopes import Scope
from odb.protocol.table import DGAP

from ..explicit.check import check_scope
from ..verdict import Verdict
from .catalogue import MUTANTS, Mutant

__all__ = ["MUTANT_SCOPES", "KILL", "MutantResult", "check_mutant", "check_all", "reference_witnesses",
           "lost_witnesses"]

# Two ranks suffice for every mutant's counterexample; D > W exercises a full window with data left;
# quits=1 lets one rank stop at any point (the abort rows); xchg=1 runs the round exchange's flush round;
# W0=1 < W runs the first rounds' smaller windows (a cap of 1, then 2; D = 5: a carry into a third round).
MUTANT_SCOPES = (Scope(n_max=2, d_max=1, w=2, quits=1), Scope(n_max=2, d_max=3, w=2),
                 Scope(n_max=2, d_max=2, w=2, xchg=1), Scope(n_max=2, d_max=5, w=2, w0=1))
KILL = "failed"  # the only verdict result that counts as a kill


@dataclass
class MutantResult:
    name: str
    doc: str
    expected: str
    killers: list[str] = field(default_factory=list)
    scopes: list[str] = field(default_factory=list)
    symbolic_killers: list[str] = field(default_factory=list)
    symbolic: str = "not run"     # "not run" | "ran" | "missing: <why>"
    counterexample: str = ""
    seconds: float = 0.0

    @property
    def killed(self) -> bool:
        return bool(self.killers or self.symbolic_killers)

    @property
    def killed_as_expected(self) -> bool:
        return any(k.split("/")[0] == self.expected for k in self.killers + self.symbolic_killers)

    def to_json(self) -> dict:
        return {"name": self.name, "doc": self.doc, "expected": self.expected, "killers": self.killers,
                "scopes": self.scopes,
                "symbolic_killers": self.symbolic_killers, "symbolic": self.symbolic, "killed": self.killed,
                "killed_as_expected": self.killed_as_expected, "counterexample": self.counterexample,
                "seconds": round(self.seconds, 3)}


@lru_cache(maxsize=None)
def reference_witnesses(scope: Scope, max_states: int = 300_000) -> dict[tuple[str, str], str]:
    """``(witness, mode) -> detail`` for every ``sometimes`` witness the unmutated table reaches in `scope`
    (computed once per scope and process)."""
    res = check_scope(scope, table=DGAP, confluence_n_max=2, max_states=max_states, max_cex=0)
    return {(v.property, v.mode): v.detail for v in res.verdicts if v.result == "found"}


def lost_witnesses(verdicts: list[Verdict], scope: Scope, max_states: int = 300_000) -> list[Verdict]:
    """A "failed" verdict for each witness of `verdicts` (one mutant's explicit verdicts at `scope`) that
    is "not found" (a complete search: a truncated one gives "unknown") while the unmutated table finds it."""
    ref = reference_witnesses(scope, max_states)
    out = []
    for v in verdicts:
        if v.result == "not found" and (v.property, v.mode) in ref:
            out.append(Verdict(v.property, v.method + " (witness lost)", v.scope, v.mode, KILL, v.seconds,
                               v.states, v.depth,
                               f"unreachable on the mutant ({v.states:,} states, complete search); the unmutated "
                               f"table reaches it in the same scope ({ref[(v.property, v.mode)]})"))
    return out


def check_mutant(m: Mutant, *, scopes: tuple[Scope, ...] = MUTANT_SCOPES, symbolic: bool = False,
                 max_states: int = 300_000) -> MutantResult:
    """Every explicit verdict of `m` at `scopes` (and the z3 verdicts with `symbolic`)."""
    t0 = time.perf_counter()
    table = m.table()
    out = MutantResult(m.name, m.doc, m.expected)
    verdicts, cexs = [], []
    for scope in scopes:
        res = check_scope(scope, table=table, confluence_n_max=2, max_states=max_states, max_cex=50)
        lost = lost_witnesses(res.verdicts, scope, max_states)
        verdicts += res.verdicts + lost
        cexs += res.counterexamples + [(f"{v.property}/{v.mode}", f"WITNESS LOST {v.property}: {v.detail}")
                                       for v in lost]
        out.scopes.append(str(scope))
        if any(v.result == KILL and v.property == m.expected for v in res.verdicts + lost):
            break
    out.killers = sorted({f"{v.property}/{v.mode}" for v in verdicts if v.result == KILL})
    for key, text in cexs:
        if key.split("/")[0] == m.expected:
            out.counterexample = text
            break
    else:
        fails = [v for v in verdicts if v.result == KILL and v.property == m.expected]
        if fails:
            out.counterexample = f"{fails[0].property}/{fails[0].mode}: {fails[0].detail}"
    if symbolic:
        try:
            from ..symbolic import prove_all
        except ImportError as exc:  # reported, and a failure of the whole run (see proofs.report)
            out.symbolic = f"missing: {exc}"
        else:
            vs = prove_all(table, scope.modes)
            out.symbolic = "ran"
            out.symbolic_killers = sorted({f"{v.property}/{v.mode} (z3)" for v in vs if v.result == KILL})
    out.seconds = time.perf_counter() - t0
    return out


def check_all(*, symbolic: bool = False, log=None) -> list[MutantResult]:
    """`check_mutant` for every mutant of the catalogue, in order."""
    out = []
    for m in MUTANTS:
        r = check_mutant(m, symbolic=symbolic)
        if log:
            log(f"  {m.name:32} {'KILLED' if r.killed else 'SURVIVED'} "
                f"(expected {m.expected}: {'yes' if r.killed_as_expected else 'NO'}) {r.seconds:.2f} s")
        out.append(r)
    return out
