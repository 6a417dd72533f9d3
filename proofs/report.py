"""Run every check and write `proofs/REPORT.md` and `proofs/report.json`.

Legend
    verdict   `proofs.verdict.Verdict`: property, mode, method, scope, result,
              states, depth, seconds; only "proved", "holds" and "found" pass
    symbolic  the z3 all-N engine (`proofs.symbolic.prove_all`); when it cannot
              be imported the report carries a failing ``symbolic_engine``
              verdict (missing is a failure, never a pass)
    mutant    a seeded table bug (`proofs.mutants`); a surviving mutant fails the run
    witness   every ``sometimes`` property of every mode must be found by the
              explicit engine in some scope (`every_witness_found`): the quit
              witnesses are checked only in the quit scopes
    deep      ``--deep`` adds `DEEP_SCOPES`; its figures are kept in report.json
              (``deep_summary``) and carried into later non-deep reports while
              the table hash is unchanged
    cross     the explorer's graph analyses (`proofs.explicit.explore._analyse`:
              acyclic, longest path, trap set) against networkx on the same graphs:
              every run with N <= `CROSS_CHECK_N_MAX` of every scope, and the
              `CROSS_CHECK_MUTANTS` (graphs with a cycle, deadlocks and traps);
              any difference fails the run (`proofs.explicit.crosscheck`)
    dealt     the table composed with dealt sharding (`models.dealt`, the real
              `odb.batching.deal` classes): exhaustive `DEALT_SCOPES`
              (`proofs.explicit.dealt`), the all-N dealer arithmetic
              (`proofs.symbolic.dealt`) and the seeded dealer and glue bugs
              (`proofs.mutants.dealt`); every dealt witness must be found in some
              dealt scope

`run_all` fans the independent jobs (one per scope and mode, the engine
self-checks, the mutants, the z3 proofs) out over worker processes; every job is
deterministic, so the verdicts do not depend on the number of workers.  The
report starts with the z3 version, the table hash (`DGAP.hash`) and the bound
formula; `tests/test_report.py` fails when the committed report's hash is not
the current table's (a stale proof fails CI).
"""

from __future__ import annotations

import datetime
import json
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from models.scopes import CI_SCOPES, DEALT_SCOPES, DEEP_SCOPES, DealtScope, Scope
from odb.protocol.expr import render
from odb.protocol.table import DGAP, PHASES, Table

from .verdict import Verdict

__all__ = ["Report", "run_all", "write", "render_table_md", "REPORT_MD", "REPORT_JSON"]

HERE = Path(__file__).resolve().parent
REPORT_MD = HERE / "REPORT.md"
REPORT_JSON = HERE / "report.json"
_PHASE = {v: k for k, v in PHASES.items()}


@dataclass
class Report:
    table_hash: str
    z3_version: str
    bound_formula: str
    scopes: list[str]
    verdicts: list[Verdict] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)
    worst_case: list[dict] = field(default_factory=list)
    mutants: list[dict] = field(default_factory=list)
    counterexamples: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    deep: bool = False
    deep_summary: dict | None = None
    dealt_runs: list[dict] = field(default_factory=list)
    dealt_mutants: list[dict] = field(default_factory=list)
    cross_mutants: list[dict] = field(default_factory=list)    # networkx cross-check runs on mutant graphs

    @property
    def failures(self) -> list[str]:
        out = [f"{v.property}/{v.mode} ({v.method}, {v.scope}): {v.result}" for v in self.verdicts if not v.ok]
        for kind, ms in (("mutant", self.mutants), ("dealt mutant", self.dealt_mutants)):
            out += [f"{kind} {m['name']} survived" for m in ms if not m["killed"]]
            out += [f"{kind} {m['name']} not killed by its expected killer {m['expected']}"
                    for m in ms if m["killed"] and not m["killed_as_expected"]]
        return out

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict:
        return {"table_hash": self.table_hash, "z3_version": self.z3_version, "bound_formula": self.bound_formula,
                "python": platform.python_version(), "date": datetime.date.today().isoformat(),
                "scopes": self.scopes, "deep": self.deep, "ok": self.ok, "failures": self.failures,
                "seconds": round(self.seconds, 2), "verdicts": [v.to_json() for v in self.verdicts],
                "runs": self.runs, "worst_case": self.worst_case, "mutants": self.mutants,
                "counterexamples": [list(c) for c in self.counterexamples], "deep_summary": self.deep_summary,
                "dealt_runs": self.dealt_runs, "dealt_mutants": self.dealt_mutants,
                "cross_mutants": self.cross_mutants}


# -- jobs (module level so that worker processes can run them) --------------------------
def _job_scope(scope: Scope, mode: int) -> tuple:
    from .explicit.check import check_scope
    from .explicit.crosscheck import CROSS_CHECK_N_MAX
    r = check_scope(replace(scope, modes=(mode,)), cross_check_n_max=CROSS_CHECK_N_MAX)
    return r.verdicts, [{**x, "scope": str(scope)} for x in r.runs], r.worst_case, r.counterexamples


def _job_cross_mutants() -> tuple:
    from .explicit.crosscheck import mutant_cross_checks
    verdicts, figures = mutant_cross_checks()
    return verdicts, [], [], figures


def _job_selfcheck(mode: int) -> tuple:
    from .explicit.selfcheck import selfcheck_verdicts
    return selfcheck_verdicts(modes=(mode,)), [], [], []


def _job_symbolic() -> tuple:
    t0 = time.perf_counter()
    try:
        from .symbolic import prove_all
    except ImportError as exc:
        return [Verdict("symbolic_engine", "z3 all-N", "all N", "all", "failed", round(time.perf_counter() - t0, 3),
                        detail=f"MISSING: proofs.symbolic cannot be imported ({exc}); the all-N proofs did not run")], \
            [], [], []
    return prove_all(DGAP), [], [], []


def _job_mutants(symbolic: bool, names: tuple[str, ...]) -> tuple:
    from .mutants import by_name, check_mutant
    return [], [], [], [check_mutant(by_name(n), symbolic=symbolic).to_json() for n in names]


def _job_dealt(scope: DealtScope) -> tuple:
    from .explicit.dealt import check_dealt_scope
    r = check_dealt_scope(scope)
    return r.verdicts, r.runs, [list(k) + [v] for k, v in r.found.items()], r.counterexamples


def _job_dealt_symbolic() -> tuple:
    t0 = time.perf_counter()
    try:
        from .symbolic.dealt import prove_dealer
    except ImportError as exc:
        return [Verdict("dealer_arithmetic", "z3 all-N (dealer arithmetic)", "all N", "all", "failed",
                        round(time.perf_counter() - t0, 3), detail=f"MISSING: z3 cannot be imported ({exc})")], \
            [], [], []
    return prove_dealer(), [], [], []


def _job_dealt_mutants() -> tuple:
    from .mutants.dealt import DEALT_MUTANTS, check_dealt_mutant
    return [], [], [], [check_dealt_mutant(m).to_json() for m in DEALT_MUTANTS]


def _witness_verdict(verdicts: list[Verdict]) -> Verdict:
    """Every ``sometimes`` property of every mode has an explicit witness in some scope (non-vacuity)."""
    from models.properties import for_mode

    from .explicit.explore import MODE_NAMES
    found = {(v.property, v.mode) for v in verdicts if v.method == "explicit BFS" and v.result == "found"}
    missing = [(p.name, MODE_NAMES[m]) for m in MODE_NAMES for p in for_mode(m)
               if p.kind == "sometimes" and (p.name, MODE_NAMES[m]) not in found]
    return Verdict("every_witness_found", "explicit BFS (all scopes)", "every explicit scope", "all",
                   "failed" if missing else "holds", 0.0,
                   detail=f"no witness in any scope: {missing}" if missing else
                   "every sometimes property of every mode is witnessed in some scope")


def _z3_version() -> str:
    try:
        import z3
        return z3.get_version_string()
    except ImportError:
        return "z3 not installed"


def _bound_formula() -> str:
    try:
        from .symbolic import BOUND_FORMULA
        return BOUND_FORMULA
    except ImportError as exc:
        return f"MISSING (proofs.symbolic not importable: {exc})"


def run_all(*, deep: bool = False, jobs: int = 2, mutants_symbolic: bool = True, log=print) -> Report:
    """Every check of `make verify` (`deep`: the DEEP_SCOPES too); see the module docstring."""
    t0 = time.perf_counter()
    from .mutants import MUTANTS
    scopes = list(CI_SCOPES) + (list(DEEP_SCOPES) if deep else [])
    rep = Report(DGAP.hash, _z3_version(), _bound_formula(), [str(s) for s in scopes], deep=deep)
    names = [m.name for m in MUTANTS]
    chunks = [tuple(names[i::3]) for i in range(3)]  # three jobs, so that they interleave with the scopes
    # (name, function, args, rough cost in CPU seconds): the largest first, so that the workers finish together
    work = [("symbolic", _job_symbolic, (), 10)]
    work += [(f"self-checks mode {m}", _job_selfcheck, (m,), 4) for m in (0, 1, 2)]
    work += [(f"mutants {i}", _job_mutants, (mutants_symbolic, c), 15) for i, c in enumerate(chunks)]
    work += [(f"{s} mode {m}", _job_scope, (s, m), _cost(s, m)) for s in scopes for m in s.modes]
    work += [(f"dealt scope {s}", _job_dealt, (s,), _dealt_cost(s)) for s in DEALT_SCOPES]
    work += [("dealt symbolic", _job_dealt_symbolic, (), 1), ("dealt mutants", _job_dealt_mutants, (), 4)]
    work += [("cross-check mutant graphs", _job_cross_mutants, (), 2)]
    work.sort(key=lambda w: -w[3])
    mutants: dict[str, dict] = {}
    dealt_found: list[dict] = []
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as ex:
        futs = [(name, ex.submit(fn, *args)) for name, fn, args, _ in work]
        for name, fut in futs:
            verdicts, runs, worst, extra = fut.result()
            log(f"  done: {name} ({len(verdicts)} verdicts)")
            rep.verdicts += verdicts
            if name == "cross-check mutant graphs":
                rep.cross_mutants = extra
                continue
            if name.startswith("dealt"):
                rep.dealt_runs += runs
                dealt_found.append({tuple(k[:2]): k[2] for k in worst})
                if name == "dealt mutants":
                    rep.dealt_mutants = extra
                else:
                    rep.counterexamples += extra
                continue
            rep.runs += runs
            rep.worst_case += worst
            if name.startswith("mutants"):
                mutants.update((m["name"], m) for m in extra)
            else:
                rep.counterexamples += extra
    rep.mutants = [mutants[n] for n in names]
    rep.verdicts.append(_witness_verdict(rep.verdicts))
    from .explicit.dealt import dealt_witness_verdicts
    rep.verdicts += dealt_witness_verdicts(dealt_found)
    rep.seconds = time.perf_counter() - t0
    if deep:
        deep_scopes = {str(s) for s in DEEP_SCOPES}
        rep.deep_summary = {
            "date": datetime.date.today().isoformat(), "table_hash": rep.table_hash,
            "seconds": round(rep.seconds, 1), "scopes": sorted(deep_scopes),
            "runs": [r for r in rep.runs if r["scope"] in deep_scopes],
            "verdicts": len([v for v in rep.verdicts if v.scope in deep_scopes]),
            "failures": [f"{v.property}/{v.mode} ({v.scope}): {v.result}" for v in rep.verdicts
                         if v.scope in deep_scopes and not v.ok]}
    return rep


def _dealt_cost(s: DealtScope) -> float:
    """A rough CPU-seconds estimate of one dealt scope job (orders the jobs; measured on this machine)."""
    return {2: 1.0, 3: 2.5, 4: 16.0}.get(s.n, 20.0) * len(s.totals) ** 0.5 * len(s.modes) * (s.w ** 1.5)


def _cost(s: Scope, mode: int) -> float:
    """A rough CPU-seconds estimate of one scope job (only orders the jobs; measured on this machine)."""
    per_state = 2e-5 if mode != 2 else 1.5e-5
    states = 5e5 * (4.5 ** (s.n_max - 6)) * (6 ** s.quits) * (3 ** (s.d_max - 2))
    cross = 1 + 4.5 ** (min(4, s.n_max) - s.n_max)  # the networkx cross-check of the N<=4 runs costs about as much
    return states * per_state * (0.3 if mode == 2 else 1) * cross


# -- rendering ------------------------------------------------------------------------------
def _fmt_result(v: Verdict) -> str:
    return v.result.upper() if v.ok else f"**{v.result.upper()}**"


def verdict_table(verdicts: list[Verdict]) -> list[str]:
    lines = ["| property | mode | method | scope | result | states | depth | time (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for v in verdicts:
        lines.append(f"| {v.property} | {v.mode} | {v.method} | {v.scope} | {_fmt_result(v)} | "
                     f"{'' if v.states is None else f'{v.states:,}'} | {'' if v.depth is None else v.depth} | "
                     f"{v.seconds:.2f} |")
    return lines


def render_table_md(table: Table = DGAP) -> list[str]:
    """The protocol table as Markdown: one line per row."""
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["| row | from | guard | effect | updates | choices | to |", "|---|---|---|---|---|---|---|"]
    for r in table.rows:
        eff = r.effect.kind
        if r.effect.kind == "post":
            posted = ", ".join(f"{n}={render(e)}" for n, e in r.effect.payload)
            eff += f"({posted}; shape {render(r.effect.shape)})"
        if r.effect.kind == "emit":
            eff += f"({render(r.effect.count)})"
        ups = "; ".join(f"{n} := {render(e)}" for n, e in r.updates) or "-"
        chs = "; ".join(f"{c.name} in [{render(c.lo)}, {render(c.hi)}]" for c in r.choices) or "-"
        lines.append(f"| {r.name} | {_PHASE[r.phase_from]} | `{esc(render(r.guard))}` | `{esc(eff)}` | "
                     f"`{esc(ups)}` | `{esc(chs)}` | {_PHASE[r.phase_to]} |")
    lines.append("")
    lines.append("Decision (reads collective inputs only): " + "; ".join(f"`${n} = {esc(render(e))}`"
                                                                       for n, e in table.lets))
    return lines


def render_md(rep: Report) -> str:
    from .explicit.check import COVERAGE_WAIVERS, NO_QUIT_WAIVERS, ROUNDS_CLOSED_FORM, STEP_PROPERTIES
    from .explicit.explore import MODE_NAMES
    out = ["# DGAP proof report", "",
           "Generated by `python -m proofs verify" + (" --deep" if rep.deep else "") + "` "
           "(do not edit; `tests/test_report.py` fails when this report is stale).", "",
           f"- z3 version: {rep.z3_version}; Python {platform.python_version()}; {datetime.date.today().isoformat()}",
           f"- table hash (`DGAP.hash`): `{rep.table_hash}`",
           f"- termination bound (z3 ranking): {rep.bound_formula}",
           f"- explicit scopes: {'; '.join(rep.scopes)} (every data vector as a multiset, every interleaving, "
           "every policy choice; rank symmetry checked, see the self-checks). `quits<=Q`: up to Q ranks stop "
           "(the environment's `quit`) at any point before they are DONE; without it no rank quits. "
           "Confluence is checked without quits only (a quit is the environment's choice, not the policy's); "
           "rounds equal the closed form without quits and are at most the closed form with quits.",
           "- step property (explicit engine): " + "; ".join(f"`{k}`: {v}" for k, v in STEP_PROPERTIES.items()),
           f"- overall: **{'PASS' if rep.ok else 'FAIL'}** ({len(rep.verdicts)} verdicts, {len(rep.mutants)} table "
           f"mutants, {len(rep.dealt_mutants)} dealt mutants, {rep.seconds:.1f} s wall)",
           "- every `always` property is also shown falsifiable: z3 finds an unconstrained state that violates it "
           "(rows `<property>: falsifiable`; a tautology fails), and its witness implies its premise "
           "(`witnesses_imply_antecedents`)",
           "- the explorer's hand-written graph analyses (acyclic, longest path, trap set) equal networkx's on every "
           "run with N <= 4 and on seeded graphs with a cycle, deadlocks and traps (`graph_analyses_match_networkx`; "
           "section \"Engines agree\")", ""]
    if not rep.ok:
        out += ["## Failures", ""] + [f"- {f}" for f in rep.failures] + [""]
    out += ["## Verdicts", ""] + verdict_table(rep.verdicts) + [""]
    out += ["## Explicit runs (per mode and N)", "",
            "| mode | N | D | W | quits | states | transitions | BFS depth | sinks | longest path | time (s) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rep.runs:
        out.append(f"| {r['mode']} | {r['n']} | <={r['d_max']} | {r['w']} | {r.get('quits', 0)} | {r['states']:,} | "
                   f"{r['transitions']:,} | {r['depth']} | {r['sinks']} | {r['longest_path']} | {r['seconds']:.2f} |")
    out += ["", "States are canonical (rank symmetry); transitions are counted once per distinct rank tuple "
            "and firing.", ""]
    out += ["## Row coverage (fire counts over every run)", ""]
    rows = [x.name for x in DGAP.rows] + ["complete", "quit"]
    out += ["| mode | " + " | ".join(rows) + " |", "|---" * (len(rows) + 1) + "|"]
    for mode in sorted({r["mode"] for r in rep.runs}):
        tot = {k: sum(r["fires"].get(k, 0) for r in rep.runs if r["mode"] == mode) for k in rows}
        out.append(f"| {mode} | " + " | ".join(f"{tot[k]:,}" for k in rows) + " |")
    out += [""] + [f"- waiver ({MODE_NAMES[m]}): {row}: {why}" for m, w in COVERAGE_WAIVERS.items()
                   for row, why in w.items()]
    out += [f"- waiver (scopes without quits): {row}: {why}" for row, why in NO_QUIT_WAIVERS.items()] + [""]
    out += ["## Exact worst case (rounds = collectives until all DONE)", "",
            "Closed forms checked on every data vector: " +
            "; ".join(f"{MODE_NAMES[m]}: {f}" for m, (f, _) in ROUNDS_CLOSED_FORM.items()) + ".", "",
            "| mode | N | D | W | quits | data vectors | max rounds (all vectors) | rounds vs closed form | "
            "longest path |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in rep.runs:
        q = r.get("quits", 0)
        es = [e for e in rep.worst_case if (e["mode"], e["n"], e["d_max"], e["w"], e.get("quits", 0)) ==
              (r["mode"], r["n"], r["d_max"], r["w"], q)]
        if not es:
            continue
        okc = all((e["max_rounds"] <= e["closed_form"]) if q else (e["max_rounds"] == e["closed_form"]) for e in es)
        rel = "<=" if q else "=="
        out.append(f"| {r['mode']} | {r['n']} | <={r['d_max']} | {r['w']} | {q} | {len(es)} | "
                   f"{max(e['max_rounds'] for e in es)} | {rel + ' yes' if okc else '**NO**'} | {r['longest_path']} |")
    if rep.deep_summary:
        ds = rep.deep_summary
        out += ["", f"## Deep scopes (`python -m proofs verify --deep`, run {ds['date']}, {ds['seconds']} s wall)", "",
                ("Carried over from the last `--deep` run for this table hash. " if not rep.deep else "") +
                f"Scopes: {'; '.join(ds['scopes'])}. {ds['verdicts']} verdicts, "
                + (f"**failures: {ds['failures']}**" if ds["failures"] else "no failure") + ".", "",
                "| scope | mode | N | states | transitions | BFS depth | longest path | time (s) |",
                "|---|---|---|---|---|---|---|---|"]
        for r in ds["runs"]:
            out.append(f"| {r['scope']} | {r['mode']} | {r['n']} | {r['states']:,} | {r['transitions']:,} | "
                       f"{r['depth']} | {r['longest_path']} | {r['seconds']:.2f} |")
    out += render_cross_md(rep)
    out += ["", "## Mutants", "",
            "| mutant | what | expected killer | killed | killed by (explicit) | killed by (z3) | time (s) |",
            "|---|---|---|---|---|---|---|"]
    for m in rep.mutants:
        ex = sorted({k.split("/")[0] for k in m["killers"]})
        zs = sorted({k.split("/")[0] for k in m["symbolic_killers"]})
        out.append(f"| {m['name']} | {m['doc']} | {m['expected']} | "
                   f"{'yes' if m['killed_as_expected'] else '**NO**'} | {', '.join(ex) or '-'} | "
                   f"{', '.join(zs) or ('-' if m['symbolic'] == 'ran' else m['symbolic'])} | {m['seconds']:.2f} |")
    out += ["", "### Shortest counterexample of each mutant (its expected killer)", ""]
    for m in rep.mutants:
        out += [f"**{m['name']}**", "", "```", m["counterexample"] or "(none)", "```", ""]
    out += render_dealt_md(rep)
    if rep.counterexamples:
        out += ["## Counterexamples on the current table", ""]
        for key, text in rep.counterexamples:
            out += [f"**{key}**", "", "```", text, "```", ""]
    out += ["## The table (`odb/protocol/table.py`, `DGAP`)", ""] + render_table_md(DGAP) + [""]
    return "\n".join(out)


def _both(xs: list, ys: list) -> str:
    """The values once when both engines gave the same (one value if they are all equal), else both in bold."""
    a, b = (", ".join(f"{x:,}" if type(x) is int else str(x) for x in (v if len(set(v)) > 1 else v[:1]))
            for v in (xs, ys))
    return a if xs == ys else f"**_analyse {a} / networkx {b}**"


def _pair(cs: list[dict], fn) -> str:
    """`fn` of each cross-check's answers, ours and networkx's, as one cell (`_both`)."""
    return _both([fn(c["ours"]) for c in cs], [fn(c["networkx"]) for c in cs])


def render_cross_md(rep: Report) -> list[str]:
    """The engine cross-check: `_analyse` against networkx, per scope and mode, then on the mutant graphs."""
    from .explicit.crosscheck import CROSS_CHECK_N_MAX, CROSS_CHECK_SCOPE, METHOD
    groups: dict = {}
    for r in rep.runs:
        if "cross_check" in r:
            groups.setdefault((r["scope"], r["mode"]), []).append(r["cross_check"])
    order = {sc: i for i, sc in enumerate(rep.scopes)}
    modes = ("pad", "join", "quota")
    vs = [v for v in rep.verdicts if v.method.startswith(METHOD)]
    secs = sum(v.seconds for v in vs)
    out = ["", f"## Engines agree: the explorer's graph analyses against networkx ({secs:.1f} s)", "",
           "`proofs/explicit/crosscheck.py`: each explored graph is rebuilt as a networkx `DiGraph` and three answers "
           "of the hand-written `_analyse` are compared with networkx's: acyclic (`is_directed_acyclic_graph`; a "
           "reported cycle must be a closed walk of the graph), the longest path from the initial states "
           "(`dag_longest_path_length`) and the set of traps, the states from which no all-DONE state is reachable "
           "(`ancestors` of a node after every all-DONE state). Any difference fails `make verify`. "
           f"Every run with N <= {CROSS_CHECK_N_MAX} of every scope; one cell when both engines agree.", "",
           "| scope | mode | N | states | edges | acyclic | longest path per N | traps | result | time (s) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    res = {(v.scope, v.mode): v for v in vs}
    for (scope, mode), cs in sorted(groups.items(), key=lambda g: (order.get(g[0][0], 99), modes.index(g[0][1]))):
        v = res.get((scope, mode))
        out.append(f"| {scope} | {mode} | 1..{max(c['n'] for c in cs)} | {sum(c['states'] for c in cs):,} | "
                   f"{sum(c['edges'] for c in cs):,} | {_pair(cs, lambda a: 'yes' if a['acyclic'] else 'no')} | "
                   f"{_pair(cs, lambda a: a['longest_path'])} | {_both(*_sums(cs, 'traps'))} | "
                   f"{_fmt_result(v) if v else '**MISSING**'} | {sum(c['seconds'] for c in cs):.2f} |")
    out += ["", "On the table every graph is acyclic and trap-free, so the same comparison also runs on graphs "
            f"that are not: seeded tables at {CROSS_CHECK_SCOPE} (every N, every mode).", "",
            "| table | runs | states | edges | cyclic runs | traps | result | time (s) | what |",
            "|---|---|---|---|---|---|---|---|---|"]
    mv = {v.property: v for v in vs}
    by: dict = {}
    for f in rep.cross_mutants:
        by.setdefault(f["mutant"], []).append(f)
    for name, cs in by.items():
        v = mv.get(f"graph_analyses_match_networkx[{name}]")
        out.append(f"| {name} | {len(cs)} | {sum(c['states'] for c in cs):,} | {sum(c['edges'] for c in cs):,} | "
                   f"{_both(*_sums(cs, 'cyclic'))} | {_both(*_sums(cs, 'traps'))} | "
                   f"{_fmt_result(v) if v else '**MISSING**'} | {sum(c['seconds'] for c in cs):.2f} | "
                   f"{v.detail.split(':')[0] if v else ''} |")
    return out


def _sums(cs: list[dict], key: str) -> tuple[list[int], list[int]]:
    """([ours summed], [networkx's summed]) of the traps, or of the cyclic runs (``key="cyclic"``)."""
    f = (lambda a: not a["acyclic"]) if key == "cyclic" else (lambda a: a[key])
    return [sum(f(c["ours"]) for c in cs)], [sum(f(c["networkx"]) for c in cs)]


def render_dealt_md(rep: Report) -> list[str]:
    """The dealt-sharding section: one line per property, the runs per scope and mode, the mutants."""
    from models.dealt_properties import DEALT_ENGINE_PROPERTIES, DEALT_PROPERTIES

    from .explicit.dealt import METHOD as DEALT_METHOD
    from .symbolic.dealt import DEALER_SCOPE, OBLIGATIONS
    vs = [v for v in rep.verdicts if v.method == DEALT_METHOD]
    z3v = {v.property: v for v in rep.verdicts if v.method.startswith("z3 all-N (dealer")}
    states = sum(r["states"] for r in rep.dealt_runs)
    out = ["## Dealt sharding (`odb.batching.deal` in the checked model)", "",
           "`models/dealt.py`: the table composed with N ranks that each read their keys through their own "
           "`DealtOrder` replica (the real class: every deal, every read and every reserve take is its code), "
           "a global order of P positions, each position a drop or a usable sample of some cost (chosen when "
           "its item is first returned), prefetch up to each rank's `ahead` keys in any interleaving, the "
           "collective of `models/env.py`, and every rank applying `DealtOrder.deal(taken, cost, dry, reserve, "
           "need=round_needs(W, target, posted, aheads))` at its return from each collective "
           "(`first_lead(W, aheads)` at the start). Every interleaving, every drop and cost pattern and every "
           "choice the table allows (proposal, `use`, `take`), no symmetry reduction (ranks differ). "
           f"Scopes: {'; '.join(str(x) for x in DEALT_SCOPES)}. {states:,} states in all.", "",
           "One line per property (states and time: the runs that checked it, summed over scopes and modes).", "",
           "| property | kind | modes | result | states | time (s) | what |", "|---|---|---|---|---|---|---|"]
    names = [(p.name, p.kind, p.doc) for p in DEALT_PROPERTIES] + \
        [(n, "engine", d) for n, d in DEALT_ENGINE_PROPERTIES.items()]
    for name, kind, doc in names:
        mine = [v for v in vs if v.property == name]
        if not mine:
            continue
        ok = all(v.ok for v in mine)
        res = ("FOUND" if kind == "sometimes" else "HOLDS") if ok else \
            f"**{'/'.join(sorted({v.result.upper() for v in mine if not v.ok}))}**"
        modes = ", ".join(m for m in ("pad", "join", "quota") if any(v.mode == m for v in mine))
        if kind == "sometimes":
            hit = next((v for v in mine if v.ok), None)
            where = doc + (f" (first: {hit.mode}, {hit.detail})" if hit else "")
            out.append(f"| {name} | {kind} | {modes} | {res} | - | - | {where} |")
            continue
        st = sum(v.states or 0 for v in mine)
        secs = sum(v.seconds for v in mine)
        out.append(f"| {name} | {kind} | {modes} | {res} | {st:,} | {secs:.2f} | {doc} |")
    for name, _ in OBLIGATIONS:
        v = z3v.get(name)
        if v is not None:
            out.append(f"| {name} | z3 all N | - | {_fmt_result(v)} | - | {v.seconds:.2f} | {DEALER_SCOPE}; "
                       f"{v.detail.splitlines()[0]} |")
    out += ["", "The z3 obligations and exactly what they do not prove: `proofs/symbolic/dealt.py` (module "
            "docstring). Every always property names its witnesses (`models/dealt_properties.py`); each "
            "witness must be found in some dealt scope.", "",
            "| scope | mode | P | states | transitions | BFS depth | sinks | longest path | time (s) |",
            "|---|---|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in rep.dealt_runs:
        groups.setdefault((r["scope"], r["mode"]), []).append(r)
    order = {str(x): i for i, x in enumerate(DEALT_SCOPES)}
    mode_order = {"pad": 0, "join": 1, "quota": 2}
    for (scope, mode), rs in sorted(groups.items(), key=lambda g: (order.get(g[0][0], 99), mode_order[g[0][1]])):
        ps = [r["total"] for r in rs]
        prange = str(ps[0]) if len(ps) == 1 else f"{min(ps)}..{max(ps)}"
        out.append(f"| {scope} | {mode} | {prange} | {sum(r['states'] for r in rs):,} | "
                   f"{sum(r['transitions'] for r in rs):,} | {max(r['depth'] for r in rs)} | "
                   f"{sum(r['sinks'] for r in rs):,} | {max((r['longest_path'] or 0) for r in rs)} | "
                   f"{sum(r['seconds'] for r in rs):.2f} |")
    out += ["", "### Seeded dealer and glue bugs (`proofs/mutants/dealt.py`)", "",
            "| mutant | what | expected killer | killed | killed by | time (s) |", "|---|---|---|---|---|---|"]
    for m in rep.dealt_mutants:
        ks = sorted({k.split("/")[0] for k in m["killers"]})
        out.append(f"| {m['name']} | {m['doc']} | {m['expected']} | "
                   f"{'yes' if m['killed_as_expected'] else '**NO**'} | {', '.join(ks) or '-'} | {m['seconds']:.2f} |")
    out += ["", "#### Shortest counterexample of each dealt mutant (its expected killer)", ""]
    for m in rep.dealt_mutants:
        out += [f"**{m['name']}**", "", "```", m["counterexample"] or "(none)", "```", ""]
    return out


def write(rep: Report, md: Path = REPORT_MD, js: Path = REPORT_JSON) -> None:
    """Write both files; a non-deep report keeps the previous deep figures if the table hash is the same."""
    if rep.deep_summary is None and js.exists():
        try:
            old = json.loads(js.read_text()).get("deep_summary")
        except ValueError:
            old = None
        if old and old.get("table_hash") == rep.table_hash:
            rep.deep_summary = old
    md.write_text(render_md(rep))
    js.write_text(json.dumps(rep.to_json(), indent=1, sort_keys=True, default=str) + "\n")
