"""Run the checks on every mutant and record who kills it.

Legend
    killer   a verdict with result "failed" ("property/mode", "(z3)" appended for
             the z3 engine): an explicit counterexample or a z3 counterexample.
             "unknown" (z3 gave up, a truncated search), "not found" (a missing
             witness) and "not attempted" are never kills.  A mutant is killed when
             at least one check fails on it, and killed *as expected* when its
             `Mutant.expected` property is among the failures
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

from models.scopes import Scope

from ..explicit.check import check_scope
from .catalogue import MUTANTS, Mutant

__all__ = ["MUTANT_SCOPES", "KILL", "MutantResult", "check_mutant", "check_all"]

# Two ranks suffice for every mutant's counterexample; D > W exercises a full window with data left;
# quits=1 lets one rank stop at any point (the abort rows).
MUTANT_SCOPES = (Scope(n_max=2, d_max=1, w=2, quits=1), Scope(n_max=2, d_max=3, w=2))
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


def check_mutant(m: Mutant, *, scopes: tuple[Scope, ...] = MUTANT_SCOPES, symbolic: bool = False,
                 max_states: int = 300_000) -> MutantResult:
    """Every explicit verdict of `m` at `scopes` (and the z3 verdicts with `symbolic`)."""
    t0 = time.perf_counter()
    table = m.table()
    out = MutantResult(m.name, m.doc, m.expected)
    verdicts, cexs = [], []
    for scope in scopes:
        res = check_scope(scope, table=table, confluence_n_max=2, max_states=max_states, max_cex=50)
        verdicts += res.verdicts
        cexs += res.counterexamples
        out.scopes.append(str(scope))
        if any(v.result == KILL and v.property == m.expected for v in res.verdicts):
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
