"""Every explicit-state verdict for one scope: what `python -m proofs verify` reports.

Legend
    scope    `models.scopes.Scope` (N <= n_max, D <= d_max, W = w, modes, Q = quits)
    waiver   a row that cannot fire in a mode, stated as data (`COVERAGE_WAIVERS`;
             `NO_QUIT_WAIVERS` in a scope without quits); a waived row that does
             fire is a failure too (the waiver is wrong)
    rounds   collectives until every rank is DONE; their closed form per mode is
             `ROUNDS_CLOSED_FORM` (the symbolic engine's ranking bound): equal to
             the worst case without quits, an upper bound with quits

For each mode and each N in 1..n_max, `check_scope` explores every reachable
state (`explore.explore`) and folds the runs into one `Verdict` per property and
mode: the ``always`` and ``sometimes`` properties of `models.properties` and the
engine properties of `models.properties.ENGINE_PROPERTIES`, plus the step
property `STEP_PROPERTIES` (``real_batches_non_empty``: every ``emit`` firing
hands out at least one sample; a property of a transition, not of a state, so
it is checked here and not written in `models.properties`).  A ``sometimes``
property that reads the quit status ``qt`` is checked only in scopes with quits
(without them its witness is unreachable by construction; `proofs.report`
checks that every witness is found in some scope).  A truncated search fails
every verdict of its mode (INCOMPLETE).  Failures carry the shortest
counterexample as a step table.  With ``cross_check_n_max`` the runs up to
that N are also analysed by networkx (`crosscheck`): one more verdict per mode,
``graph_analyses_match_networkx``, and each such run's figures carry both
engines' answers under ``"cross_check"``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from models.logic import RF, Exists, Forall
from models.properties import ENGINE_PROPERTIES, for_mode
from models.scopes import Scope
from odb.protocol.expr import Expr, Op
from odb.protocol.table import DGAP, JOIN, QUOTA, Table

from ..verdict import Verdict
from .bounds import ROUNDS_CLOSED_FORM, rounds_bound
from .confluence import POLICIES, check_confluence
from .crosscheck import METHOD as CROSS_METHOD
from .crosscheck import cross_check, engines_agree_verdict
from .explore import MODE_NAMES, Exploration, explore
from .trace import counterexample

__all__ = ["COVERAGE_WAIVERS", "NO_QUIT_WAIVERS", "ROUNDS_CLOSED_FORM", "STEP_PROPERTIES", "ScopeResult",
           "check_scope", "needs_quit", "METHOD"]

METHOD = "explicit BFS"

COVERAGE_WAIVERS: dict[int, dict[str, str]] = {
    JOIN: {"emit_filler": "JOIN sets nfill := 0 at return_go: fillers exist only in PAD"},
    QUOTA: {"emit_filler": "QUOTA sets nfill := 0 at return_go: fillers exist only in PAD"},
}

NO_QUIT_WAIVERS: dict[str, str] = {
    "quit": "no rank quits in a scope with quits=0 (aborts are covered by the quit scopes)",
    "return_abort": "no rank posts a non-zero status in a scope with quits=0",
}

STEP_PROPERTIES = {
    "real_batches_non_empty": "every emit firing (a real batch) hands out at least one sample "
                              "(its count, computed by odb.protocol.machine.fire, is >= 1)",
}



Z3_BOUND_TEXT = "sum_i (d_i + 1) + N*R*(W + 3) + R"


def z3_transition_bound(d: tuple[int, ...], w: int, mode: int, quits: int = 0, xchg: int = 0) -> int:
    """The transition bound the z3 ranking proves (`proofs.symbolic.BOUND_FORMULA`), evaluated at `d`.

    `Z3_BOUND_TEXT` plus one environment ``quit`` per rank that may quit (the z3
    bound adds N, one per rank; a scope with ``quits`` < N allows only that many).
    Kept in step with the symbolic engine's string by `tests/test_explicit.py`.
    """
    rounds = rounds_bound(mode, xchg)(d)
    return sum(x + 1 for x in d) + len(d) * rounds * (w + 3) + rounds + min(quits, len(d))


def needs_quit(e: Expr) -> bool:
    """True if formula `e` reads a rank's quit status ``qt`` (its witness needs a quit)."""
    if isinstance(e, RF):
        return e.field == "qt"
    if isinstance(e, (Forall, Exists)):
        return needs_quit(e.body)
    if isinstance(e, Op):
        return any(needs_quit(a) for a in e.args)
    return False


@dataclass
class ScopeResult:
    """Verdicts, per-run figures and counterexamples of one scope."""

    scope: str
    verdicts: list[Verdict] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)          # one per (mode, N)
    counterexamples: list[tuple[str, str]] = field(default_factory=list)  # ("property/mode", step table)
    worst_case: list[dict] = field(default_factory=list)     # per (mode, N, data vector)


def _run_figures(r: Exploration) -> dict:
    return {"mode": MODE_NAMES[r.mode], "n": r.n, "d_max": r.d_max, "w": r.w, "quits": r.quits, "states": r.states,
            "transitions": r.transitions, "depth": r.depth, "sinks": r.sinks,
            "longest_path": r.longest_path, "seconds": round(r.seconds, 3), "truncated": r.truncated,
            "fires": dict(r.fires)}


def _fold(mode: int, runs: list[Exploration], scope: Scope, table: Table, out: ScopeResult,
          max_cex: int) -> None:
    """One verdict per property for `mode` from the runs N = 1..n_max."""
    m = MODE_NAMES[mode]
    quits, witnesses, xchg, scope = scope.quits, scope.witnesses, scope.xchg, str(scope)
    secs = sum(r.seconds for r in runs)
    states = sum(r.states for r in runs)
    depth = max(r.depth for r in runs)
    incomplete = [r.n for r in runs if r.truncated]

    def verdict(name: str, ok: bool, detail: str = "", kind: str = "holds", fail: str = "failed", **extra):
        res = kind if ok else fail
        if incomplete:
            res, detail = "unknown", f"INCOMPLETE: search truncated at N={incomplete}; " + detail
        out.verdicts.append(Verdict(name, METHOD, scope, m, res, round(secs, 3), states, depth, detail, extra))

    def cex(r: Exploration, idx: int, title: str, deadlock: bool = False, prop: str = "") -> str:
        if len(out.counterexamples) < max_cex:
            key = f"{prop or title.split()[-1]}/{m}"
            out.counterexamples.append((key, counterexample(r, idx, deadlock=deadlock, title=title)))
        return f"N={r.n}: shortest counterexample {len(r.path(idx)) - 1} steps"

    for p in for_mode(mode):
        if p.kind == "always":
            bad = next((r for r in runs if p.name in r.always_fail), None)
            detail = cex(bad, bad.always_fail[p.name], f"VIOLATION {p.name}", prop=p.name) if bad else ""
            verdict(p.name, bad is None, detail)
        elif witnesses and (quits or not needs_quit(p.formula)):
            hit = next((r for r in runs if p.name in r.sometimes_found), None)
            detail = f"N={hit.n}: witness at depth {len(hit.path(hit.sometimes_found[p.name])) - 1}" if hit else \
                "no reachable witness in scope"
            verdict(p.name, hit is not None, detail, kind="found", fail="not found")
    # -- engine properties --------------------------------------------------------
    bad = next((r for r in runs if r.num_deadlocks), None)
    verdict("deadlock_free", bad is None,
            cex(bad, bad.deadlocks[0], "DEADLOCK", deadlock=True, prop="deadlock_free") if bad else
            f"every sink is all-DONE ({sum(r.sinks for r in runs)} sinks)")
    bad = next((r for r in runs if r.cycle is not None), None)
    over = next((r for r in runs if r.rounds_exceeded is not None), None)
    lp = {r.n: r.longest_path for r in runs}
    if bad:
        detail = cex(bad, bad.cycle[0], "CYCLE (reaches a state that returns to itself)",
                     prop="bounded_termination")
    elif over:
        detail = cex(over, over.rounds_exceeded, f"ROUNDS EXCEED {ROUNDS_CLOSED_FORM[mode][0]}",
                     prop="bounded_termination")
    else:
        detail = f"acyclic; longest path (transitions) per N: {lp}"
    verdict("bounded_termination", bad is None and over is None, detail, longest_path=lp)
    bad = next((r for r in runs if r.num_traps), None)
    verdict("completion_possible", bad is None,
            cex(bad, bad.traps[0], "TRAP (all-DONE unreachable from here)", prop="completion_possible") if bad else
            "all-DONE reachable from every reachable state")
    bad = next((r for r in runs if r.nondeterministic), None)
    if bad:
        idx, rid, rows = bad.nondeterministic[0]
        detail = cex(bad, idx, f"NONDETERMINISM rows {list(rows)} enabled together", prop="local_determinism")
    else:
        detail = "at most one enabled row per rank in every reachable state"
    verdict("local_determinism", bad is None, detail)
    bad = next((r for r in runs if r.empty_batches), None)
    if bad:
        idx, rid, row, params, count = bad.empty_batches[0]
        detail = cex(bad, idx, f"EMPTY BATCH next: {row}{dict(params)} hands out {count} samples",
                     prop="real_batches_non_empty")
    else:
        detail = "every emit firing hands out >= 1 sample"
    verdict("real_batches_non_empty", bad is None, detail)
    fires = {name: sum(r.fires.get(name, 0) for r in runs)
             for name in [x.name for x in table.rows] + ["complete", "quit"]}
    waived = dict(COVERAGE_WAIVERS.get(mode, {}))
    if not quits:
        waived.update(NO_QUIT_WAIVERS)
    if not xchg:
        waived["return_flush"] = "the flush round runs only with the round exchange (xchg = 1)"
    never = sorted(k for k, v in fires.items() if v == 0 and k not in waived)
    wrong = sorted(k for k in waived if fires.get(k, 0) > 0)
    verdict("every_row_fires", not never and not wrong,
            (f"never fired: {never}; " if never else "") + (f"waived but fired: {wrong}; " if wrong else "") +
            (f"waived: {sorted(waived)}" if waived else "every row fired"), fires=fires)
    # -- exact worst case: rounds per data vector against the closed form ------------
    formula, fn = ROUNDS_CLOSED_FORM[mode][0], rounds_bound(mode, xchg)
    off = []
    for r in runs:
        for d, e in sorted(r.per_vector.items()):
            out.worst_case.append({"mode": m, "n": r.n, "d_max": r.d_max, "w": r.w, "quits": quits, "d": list(d),
                                   **e, "closed_form": fn(d)})
            if e["max_rounds"] is None or (e["max_rounds"] > fn(d) if quits else e["max_rounds"] != fn(d)):
                off.append((r.n, d, e["max_rounds"], fn(d)))
    # -- the longest run against the z3 ranking bound (proofs.symbolic.BOUND_FORMULA) -------------
    over_bound, slack = [], []
    for r in runs:
        for d, e in r.per_vector.items():
            if e["longest"] is None or e["max_rounds"] is None:
                continue
            b = z3_transition_bound(d, r.w, mode, quits, xchg)
            slack.append(b - e["longest"])
            if e["longest"] > b:
                over_bound.append((r.n, d, e["longest"], b))
    verdict("longest_path_within_z3_bound", not over_bound and bool(slack) and over is None,
            f"longest path <= {Z3_BOUND_TEXT}{' + quits' if quits else ''} on every data vector "
            f"(min slack {min(slack)})" if slack and not
            over_bound else f"exceeds (N, d, longest, bound): {over_bound[:4]}")
    rel = "<=" if quits else "=="
    verdict("rounds_within_closed_form" if quits else "worst_case_rounds_match_closed_form",
            not off and over is None and all(r.per_vector for r in runs),
            f"max rounds {rel} {formula} for every data vector" if not off else
            f"not {rel} (N, d, max rounds, closed form): {off[:4]}", formula=formula)


def check_scope(scope: Scope, *, table: Table = DGAP, confluence_n_max: int | None = None,
                max_states: int = 5_000_000, max_cex: int = 20, log=None,
                cross_check_n_max: int = 0) -> ScopeResult:
    """All explicit verdicts of `scope` (see the module docstring).

    `confluence_n_max` bounds N for the confluence runs (default: the scope's
    ``confluence_n_max``, else its n_max); confluence runs only without quits.  `log(str)` receives one progress
    line per run.
    `cross_check_n_max`: the runs with N up to it are cross-checked with networkx (0: none; needs networkx).
    """
    out = ScopeResult(scope=str(scope))
    for mode in scope.modes:
        runs, checks = [], []
        for n in range(1, scope.n_max + 1):
            keep = n <= cross_check_n_max
            r = explore(n, scope.d_max, scope.w, mode, table=table, max_states=max_states,
                        round_bound=rounds_bound(mode, scope.xchg), quits=scope.quits, keep_succs=keep,
                        xchg=scope.xchg, w0=scope.w0)
            runs.append(r)
            out.runs.append(_run_figures(r))
            if keep:
                if not r.truncated:
                    checks.append(cross_check(r, str(scope)))
                    out.runs[-1]["cross_check"] = checks[-1].figures()
                r.succs = None  # the successor lists are as large as the states: free them at once
            if log:
                log(f"  {MODE_NAMES[mode]:5} N={n} Q={scope.quits}: {r.states} states, {r.transitions} transitions, "
                    f"depth {r.depth}, {r.seconds:.2f} s")
        _fold(mode, runs, scope, table, out, max_cex)
        if cross_check_n_max:
            trunc = [r.n for r in runs if r.truncated and r.n <= cross_check_n_max]
            method = f"{CROSS_METHOD} (N<={min(cross_check_n_max, scope.n_max)})"
            out.verdicts.append(engines_agree_verdict(checks, str(scope), MODE_NAMES[mode], trunc, method=method))
        for r in runs:
            r.drop_graph()
        del runs
        if not scope.quits:  # a quit is the environment's choice: confluence is a claim about policies only
            _confluence(scope, mode, table, out, confluence_n_max or scope.confluence_n_max or scope.n_max,
                        log, max_states)
    return out


def _confluence(scope: Scope, mode: int, table: Table, out: ScopeResult, n_max: int, log,
                max_states: int) -> None:
    t0 = time.perf_counter()
    states, bad, trunc, vectors = 0, [], False, 0
    for n in range(1, n_max + 1):
        for kind in POLICIES:
            c = check_confluence(n, scope.d_max, scope.w, mode, kind, table=table,
                                 round_bound=rounds_bound(mode, scope.xchg), max_states=max_states,
                                 xchg=scope.xchg, w0=scope.w0)
            states += c["states"]
            vectors += c["vectors"]
            trunc |= c["truncated"]
            bad += [(kind, n, d, o) for d, o in c["bad"].items()]
    secs = time.perf_counter() - t0
    sc = (f"N<={n_max}, D<={scope.d_max}, W={scope.w}" + (f", W0={scope.w0}" if scope.w0 is not None else "")
          + (", exchange (xchg=1)" if scope.xchg else ""))
    if trunc:
        res, detail = "unknown", "INCOMPLETE: search truncated"
    elif bad:
        res, detail = "failed", "several outcomes (policy, N, d, outcomes): " + "; ".join(map(str, bad[:3]))
    else:
        res, detail = "holds", f"one outcome per data vector for policies {list(POLICIES)} ({vectors} checks)"
    out.verdicts.append(Verdict("confluent", METHOD + " (deterministic policies)", sc, MODE_NAMES[mode], res,
                                round(secs, 3), states, None, detail))
    if log:
        log(f"  {MODE_NAMES[mode]:5} confluence N<={n_max}: {states} states, {secs:.2f} s")


assert set(ENGINE_PROPERTIES) <= {"deadlock_free", "bounded_termination", "completion_possible", "confluent",
                                   "local_determinism", "every_row_fires"}, "an engine property has no check here"
