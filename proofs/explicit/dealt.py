"""Exhaustive exploration of the dealt model (`models.dealt`) and its verdicts, one scope at a time.

Legend
    scope    `models.scopes.DealtScope`: the ranks' prefetch, W, the order lengths, the values a
             position may turn out to be, the posted ladder, the modes
    run      one BFS of one `models.dealt.DealtConfig` (one order length, one mode): every
             interleaving of the ranks' steps and the environment's, every value of every
             position, every proposal, ``use`` and ``take`` the table allows; no symmetry
             reduction (ranks differ: each has its own reserve class and prefetch)
    sink     a state without successors; a deadlock is a sink that is not all-DONE

`explore_dealt` returns the counts, the BFS depth, the first (shortest) violation of each
``always`` property of `models.dealt_properties`, the first witness of each ``sometimes`` one,
per-step fire counts, deadlocks, a cycle if any and the longest path.  `check_dealt_scope` folds
the runs of a scope into one `Verdict` per ``always`` property and mode, plus ``deadlock_free``,
``bounded_termination`` (finite, acyclic) and ``every_step_fires``; `dealt_witness_verdicts`
requires each ``sometimes`` witness in some scope.  A truncated search makes
every verdict of its mode "unknown" (INCOMPLETE), never a pass.  Counterexamples are step tables
(`dealt_counterexample`).
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field

from models.dealt import DROP, DealtConfig, DealtModel
from models.dealt_properties import for_mode
from models.scopes import DealtScope
from odb.protocol.table import DGAP, JOIN, PHASES, QUOTA, Table

from ..verdict import Verdict
from .explore import MODE_NAMES

__all__ = ["DealtRun", "DealtScopeResult", "explore_dealt", "check_dealt_scope", "dealt_counterexample",
           "dealt_witness_verdicts",
           "METHOD", "DEALT_WAIVERS", "ENV_STEPS"]

METHOD = "explicit BFS (dealt model)"
ENV_STEPS = ("read", "drop", "complete")
DEALT_WAIVERS = {
    "return_abort": "the dealt model has no quits: nobody posts a non-zero status",
    "return_flush": "the dealt model runs without the round exchange (xchg = 0): no flush round",
}
_PHASE = {v: k for k, v in PHASES.items()}


@dataclass
class DealtRun:
    cfg: DealtConfig
    states: int = 0
    transitions: int = 0
    depth: int = 0
    sinks: int = 0
    seconds: float = 0.0
    truncated: bool = False
    fires: dict = field(default_factory=dict)
    always_fail: dict = field(default_factory=dict)      # property -> state index
    sometimes_found: dict = field(default_factory=dict)  # property -> state index
    deadlocks: list = field(default_factory=list)
    num_deadlocks: int = 0
    cycle: list | None = None
    longest_path: int | None = None
    model: DealtModel | None = None
    states_list: list | None = None
    parent: array | None = None
    plabel: list | None = None

    def path(self, idx: int) -> list[tuple]:
        out = []
        while idx >= 0:
            out.append((self.plabel[idx], self.states_list[idx]))
            idx = self.parent[idx]
        return out[::-1]

    def drop_graph(self) -> None:
        self.states_list = self.parent = self.plabel = None


def explore_dealt(cfg: DealtConfig, *, model_cls: type = DealtModel, table: Table = DGAP,
                  max_states: int = 3_000_000) -> DealtRun:
    """Every reachable state of `cfg` (see the module docstring); deterministic."""
    t0 = time.perf_counter()
    model = model_cls(cfg, table)
    res = DealtRun(cfg=cfg, model=model, fires={r.name: 0 for r in table.rows} | {s: 0 for s in ENV_STEPS})
    props = for_mode(cfg.mode)
    always = [p for p in props if p.kind == "always" and not p.per_rank]
    sometimes = [p for p in props if p.kind == "sometimes" and not p.per_rank]
    rank_always = [p for p in props if p.kind == "always" and p.per_rank]
    rank_sometimes = [p for p in props if p.kind == "sometimes" and p.per_rank]
    seen_views: set = set()
    s0 = model.initial()
    index = {s0: 0}
    states, plabel, level = [s0], [None], [0]
    parent = array("q", [-1])
    offsets, succ = array("q", [0]), array("q")
    checked: set = set()
    n, fires = cfg.n, res.fires
    i = 0
    while i < len(states):
        s = states[i]
        views = [model.view(s, r) for r in range(n)]
        for v in views:  # views are interned: equal views are the same object
            if id(v) not in seen_views:
                seen_views.add(id(v))
                for p in rank_always:
                    if p.name not in res.always_fail and not p.holds(v, cfg.total):
                        res.always_fail[p.name] = i
                for p in rank_sometimes:
                    if p.name not in res.sometimes_found and p.holds(v, cfg.total):
                        res.sometimes_found[p.name] = i
        key = tuple(map(id, views))
        if key not in checked:
            checked.add(key)
            for p in always:
                if p.name not in res.always_fail and not p.holds(views, cfg.total):
                    res.always_fail[p.name] = i
            for p in sometimes:
                if p.name not in res.sometimes_found and p.holds(views, cfg.total):
                    res.sometimes_found[p.name] = i
        out = 0
        for label, t in model.successors(s):
            j = index.get(t)
            if j is None:
                j = index[t] = len(states)
                states.append(t)
                parent.append(i)
                plabel.append(label)
                level.append(level[i] + 1)
            succ.append(j)
            fires[label[1]] += 1
            out += 1
        offsets.append(len(succ))
        if not out:
            res.sinks += 1
            if not model.all_done(s):
                res.num_deadlocks += 1
                if len(res.deadlocks) < 5:
                    res.deadlocks.append(i)
        i += 1
        if len(states) > max_states:
            res.truncated = True
            break
    res.states, res.transitions, res.depth = len(states), len(succ), max(level)
    res.states_list, res.parent, res.plabel = states, parent, plabel
    if not res.truncated:
        _acyclic(res, offsets, succ)
    res.seconds = time.perf_counter() - t0
    return res


def _acyclic(res: DealtRun, offsets: array, succ: array) -> None:
    """A cycle (if any) by DFS, else the longest path (transitions) from the initial state."""
    n = len(offsets) - 1
    color = bytearray(n)
    lp = array("q", bytes(8 * n))
    stack = [(0, offsets[0])]
    color[0] = 1
    while stack:
        node, pos = stack[-1]
        if pos < offsets[node + 1]:
            stack[-1] = (node, pos + 1)
            j = succ[pos]
            if color[j] == 0:
                color[j] = 1
                stack.append((j, offsets[j]))
            elif color[j] == 1 and res.cycle is None:
                nodes = [x for x, _ in stack]
                res.cycle = nodes[nodes.index(j):] + [j]
                return
            continue
        stack.pop()
        color[node] = 2
        best = 0
        for q in range(offsets[node], offsets[node + 1]):
            best = max(best, lp[succ[q]] + 1)
        lp[node] = best
    res.longest_path = lp[0]


# -- counterexamples -----------------------------------------------------------------------------
def _summary(model: DealtModel, s: tuple, r: int) -> dict:
    v = model.view(s, r)
    st = v.replica["state"]
    out = {"ph": _PHASE[v.local["ph"]], "buf": v.local["buf"], "em": v.local["em"], "exhausted": v.local["exhausted"],
           "reads": v.reads, "ret": v.ret, "ended": v.ended, "drops": v.drops, "over": v.over,
           "keys": list(v.replica["keys"]), "reserve_taken": v.replica["reserve_taken"], "dry": v.replica["dry"],
           "deals": st["rounds"], "cursor": st["cursor"], "dealer.dealt": list(st["dealt"]),
           "dealer.reserve": list(st["reserve"]),
           "dealer.closed": [int(c) for c in st["closed"]]}
    if "error" in v.replica:
        out["error"] = v.replica["error"]
    return out


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "T" if v else "F"
    return str(v).replace(" ", "") if isinstance(v, list) else str(v)


def dealt_counterexample(run: DealtRun, idx: int, title: str) -> str:
    """The shortest path to state `idx` as a step table: each step's label and what changed."""
    m, path = run.model, run.path(idx)
    n = run.cfg.n
    lines = [f"{title}  mode={MODE_NAMES[run.cfg.mode]} {run.cfg}  shortest: {len(path) - 1} steps",
             f"{'step':>4}  {'actor.step(choices)':<32} changes"]
    prev = None
    for step, (label, s) in enumerate(path):
        cur = [_summary(m, s, r) for r in range(n)]
        if label is None:
            ch = " | ".join(f"r{r}: keys={_fmt(c['keys'])} lead={m.lead(r)}" for r, c in enumerate(cur))
            lines.append(f"{0:>4}  {'init':<32} {ch}")
        else:
            who = "env" if label[0] is None else f"r{label[0]}"
            lab = f"{who}.{label[1]}(" + ", ".join(f"{k}={v}" for k, v in label[2]) + ")"
            ch = []
            for r in range(n):
                for k, v in cur[r].items():
                    if prev[r].get(k) != v:
                        ch.append(f"r{r}.{k} {_fmt(prev[r].get(k))}->{_fmt(v)}")
            if label[0] is None:
                ch.append(f"k={s[1]} mb={list(s[2])}")
            lines.append(f"{step:>4}  {lab:<32} {'; '.join(ch)}")
        prev = cur
    last = path[-1][1]
    vals = ["?" if v < 0 else "drop" if v == DROP else f"c{v}" for v in last[4]]
    lines.append(f"values: {vals}")
    return "\n".join(lines)


# -- verdicts --------------------------------------------------------------------------------------
@dataclass
class DealtScopeResult:
    scope: str
    verdicts: list[Verdict] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)
    counterexamples: list[tuple[str, str]] = field(default_factory=list)
    found: dict = field(default_factory=dict)   # (witness, mode) -> where (complete searches only)


def dealt_witness_verdicts(found_per_scope: list[dict], modes=(0, 1, 2)) -> list[Verdict]:
    """One verdict per ``sometimes`` property and mode: found in some scope (`DealtScopeResult.found`
    of each scope; a witness needs a scope large enough for it, so it is not required in every
    scope), else "not found"."""
    found: dict = {}
    for f in found_per_scope:
        for k, where in f.items():
            found.setdefault(tuple(k), where)
    out = []
    for mode in modes:
        m = MODE_NAMES[mode]
        for p in for_mode(mode):
            if p.kind == "sometimes":
                where = found.get((p.name, m))
                out.append(Verdict(p.name, METHOD, "every dealt scope", m, "found" if where else "not found",
                                   0.0, detail=where or "no reachable witness in any dealt scope"))
    return out


def check_dealt_scope(scope: DealtScope, *, model_cls: type = DealtModel, table: Table = DGAP,
                      max_states: int = 3_000_000, max_cex: int = 10, stop_at: str | None = None,
                      log=None) -> DealtScopeResult:
    """Every verdict of `scope` (module docstring).  `stop_at`: stop a mode's runs at the first order
    length where that property fails (the mutant checker)."""
    out = DealtScopeResult(scope=str(scope))
    for mode in scope.modes:
        runs = []
        for total in scope.totals:
            cfg = DealtConfig(total=total, aheads=scope.aheads, W=scope.w, mode=mode, policy=scope.policy,
                              values=scope.values, W0=scope.w0)
            r = explore_dealt(cfg, model_cls=model_cls, table=table, max_states=max_states)
            runs.append(r)
            out.runs.append({"scope": str(scope), "mode": MODE_NAMES[mode], "n": cfg.n, "total": total,
                             "w": cfg.W, "states": r.states, "transitions": r.transitions, "depth": r.depth,
                             "sinks": r.sinks, "longest_path": r.longest_path, "seconds": round(r.seconds, 3),
                             "truncated": r.truncated})
            if log:
                log(f"  dealt {MODE_NAMES[mode]:5} {cfg}: {r.states} states, {r.seconds:.2f} s")
            if stop_at and (stop_at in r.always_fail or (stop_at == "deadlock_free" and r.num_deadlocks)):
                break
        _fold(scope, mode, runs, table, out, max_cex, coverage=len(runs) == len(scope.totals))
        for r in runs:
            r.drop_graph()
    return out


def _fold(scope: DealtScope, mode: int, runs: list[DealtRun], table: Table, out: DealtScopeResult,
          max_cex: int, coverage: bool = True) -> None:
    """The verdicts of one mode; `coverage` False (runs stopped early) leaves out ``every_step_fires``."""
    m, sc = MODE_NAMES[mode], str(scope)
    secs = round(sum(r.seconds for r in runs), 3)
    states = sum(r.states for r in runs)
    depth = max(r.depth for r in runs)
    incomplete = [r.cfg.total for r in runs if r.truncated]

    def verdict(name: str, ok: bool, detail: str, kind: str = "holds", fail: str = "failed") -> None:
        res = kind if ok else fail
        if incomplete:
            res, detail = "unknown", f"INCOMPLETE: search truncated at P={incomplete}; " + detail
        out.verdicts.append(Verdict(name, METHOD, sc, m, res, secs, states, depth, detail))

    def cex(r: DealtRun, idx: int, title: str, prop: str) -> str:
        if len(out.counterexamples) < max_cex:
            out.counterexamples.append((f"{prop}/{m}", dealt_counterexample(r, idx, title)))
        return f"P={r.cfg.total}: shortest counterexample {len(r.path(idx)) - 1} steps"

    for p in for_mode(mode):
        if p.kind == "always":
            bad = next((r for r in runs if p.name in r.always_fail), None)
            verdict(p.name, bad is None,
                    cex(bad, bad.always_fail[p.name], f"VIOLATION {p.name}", p.name) if bad else
                    f"every reachable state, P in {list(scope.totals)}")
        elif not incomplete:
            hit = next((r for r in runs if p.name in r.sometimes_found), None)
            if hit is not None:
                out.found[(p.name, m)] = (f"{sc}, P={hit.cfg.total}: witness at depth "
                                          f"{len(hit.path(hit.sometimes_found[p.name])) - 1}")
    bad = next((r for r in runs if r.num_deadlocks), None)
    verdict("deadlock_free", bad is None,
            cex(bad, bad.deadlocks[0], "DEADLOCK", "deadlock_free") if bad else
            f"every sink is all-DONE ({sum(r.sinks for r in runs)} sinks)")
    bad = next((r for r in runs if r.cycle is not None), None)
    verdict("bounded_termination", bad is None,
            cex(bad, bad.cycle[0], "CYCLE", "bounded_termination") if bad else
            "finite and acyclic; longest path (transitions) per P: " +
            str({r.cfg.total: r.longest_path for r in runs}))
    if not coverage:
        return
    fires = {k: sum(r.fires.get(k, 0) for r in runs) for k in [x.name for x in table.rows] + list(ENV_STEPS)}
    waived = dict(DEALT_WAIVERS)
    if mode in (JOIN, QUOTA):
        waived["emit_filler"] = "fillers exist only in PAD"
    if DROP not in scope.values:
        waived["drop"] = "no position of this scope can be a drop"
    never = sorted(k for k, v in fires.items() if v == 0 and k not in waived)
    wrong = sorted(k for k in waived if fires.get(k, 0) > 0)
    verdict("every_step_fires", not never and not wrong,
            (f"never fired: {never}; " if never else "") + (f"waived but fired: {wrong}; " if wrong else "") +
            f"waived: {sorted(waived)}")
