"""The explorer's graph analyses against networkx, on the same explored graph (two engines, one answer).

Legend
    G         the explored state graph as a networkx DiGraph: one node per state index, one edge
              per successor (`Exploration.succs`, kept by ``explore(keep_succs=True)``); with rank
              symmetry on, the states are canonical, as `explore._analyse` sees them
    all-DONE  a state in which every rank is DONE; a trap is a state from which none is reachable
    ours      what `explore._analyse` (hand-written array code) put in the `Exploration`

`cross_check` compares three answers, each computed by networkx from G alone:

1. **Acyclic.** ``res.cycle is None`` against ``nx.is_directed_acyclic_graph(G)``; a cycle that
   ours reports must also be a closed walk of G.
2. **Longest path** (transitions) from the initial states: ``res.longest_path`` against
   ``nx.dag_longest_path_length(G)`` (acyclic graphs only).  Every source of G is an initial
   state (every other state was reached from one), so the longest path of G starts at one.
3. **Trap set.** ``res.trap_list`` against every state outside ``nx.ancestors`` of a virtual node
   that follows every all-DONE state (reverse reachability; an all-DONE state reaches itself).

Any difference is a failing verdict (`graph_analyses_match_networkx`) that names the states.
States past `explore`'s round bound have no successors in G, as in ours, so a bounded mutant's
traps are compared too.  Why not networkx everywhere: it needs about 5 us and 0.5 KB per edge
(measured: 143,395 states and 500,285 edges in 2.3 s and about 250 MB with the exploration), so
the 2.4M-state graphs of ``verify --deep`` (about 10M edges) would take minutes and gigabytes;
it checks the N <= `CROSS_CHECK_N_MAX` runs of ``make verify`` and the `CROSS_CHECK_MUTANTS`,
whose graphs have a cycle, deadlocks and traps (the table's have none).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from models.scopes import Scope
from odb.protocol.table import DGAP, Table

from ..verdict import Verdict
from .bounds import ROUNDS_CLOSED_FORM
from .explore import MODE_NAMES, Exploration, explore

__all__ = ["CROSS_CHECK_N_MAX", "CROSS_CHECK_MUTANTS", "CROSS_CHECK_SCOPE", "METHOD", "CrossCheck",
           "cross_check", "networkx_answers", "engines_agree_verdict", "mutant_cross_checks"]

CROSS_CHECK_N_MAX = 4
METHOD = "networkx cross-check"
CROSS_CHECK_SCOPE = Scope(n_max=3, d_max=2, w=2)   # the mutants' scope (every N in 1..3, every mode)


def _filler_without_progress() -> Table:
    """emit_filler updates nothing (no nfill -= 1): a PAD rank owed a filler loops on it forever."""
    return DGAP.replace_row("emit_filler", updates=())


def _catalogue(name: str):
    def build() -> Table:
        from ..mutants.catalogue import by_name
        return by_name(name).table()
    return build


# (name, what its graphs have, table builder, has a cycle): graphs whose answers are not "acyclic, no
# trap"; every one must show traps in CROSS_CHECK_SCOPE (and a cycle where stated), else it compares nothing new
CROSS_CHECK_MUTANTS = (
    ("filler_without_progress", "a self-loop in PAD; traps", _filler_without_progress, True),
    ("leave_when_source_exhausted", "deadlocks and traps", _catalogue("leave_when_source_exhausted"), False),
    ("emit_forgets_buf_update", "traps past the round bound, no deadlock", _catalogue("emit_forgets_buf_update"),
     False),
)


@dataclass
class CrossCheck:
    """One run's answers from both engines; ``ok`` only if `diffs` is empty."""

    n: int
    mode: str
    scope: str
    states: int
    edges: int
    seconds: float
    ours: dict
    networkx: dict
    diffs: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.diffs

    def figures(self) -> dict:
        return {"n": self.n, "mode": self.mode, "scope": self.scope, "states": self.states, "edges": self.edges,
                "seconds": round(self.seconds, 3), "ours": self.ours, "networkx": self.networkx,
                "diffs": self.diffs}


def _graph(succs: list):
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(range(len(succs)))
    g.add_edges_from((a, b) for a, out in enumerate(succs) for b in out)
    return g


def networkx_answers(res: Exploration) -> tuple[dict, set, object]:
    """(answers, trap set, G) computed by networkx from ``res.succs`` and the all-DONE test alone."""
    import networkx as nx

    g = _graph(res.succs)
    acyclic = nx.is_directed_acyclic_graph(g)
    longest = nx.dag_longest_path_length(g) if acyclic else None
    done = res.fm.all_done if res.symmetry else (lambda s: s.all_done())
    done_states = {x for x in range(len(res.succs)) if done(res.states_list[x])}
    target = -1  # a virtual node after every all-DONE state, removed again
    g.add_node(target)
    g.add_edges_from((x, target) for x in done_states)
    traps = set(range(len(res.succs))) - nx.ancestors(g, target)
    g.remove_node(target)
    return {"acyclic": acyclic, "longest_path": longest, "traps": len(traps)}, traps, g


def _state(res: Exploration, idx: int) -> str:
    s = res.sys(idx)
    return f"state {idx} (k={s.k}: " + "; ".join(f"r{i} {s.local(i)}" for i in range(s.n)) + ")"


def cross_check(res: Exploration, scope: str = "") -> CrossCheck:
    """Compare `res` (explored with ``keep_succs=True``, not truncated) with networkx; see the module docstring."""
    if res.succs is None or res.truncated:
        raise ValueError("cross_check needs a complete exploration with its successor lists: "
                         "explore(..., keep_succs=True) without truncation")
    t0 = time.perf_counter()
    theirs, their_traps, g = networkx_answers(res)
    ours = {"acyclic": res.cycle is None, "longest_path": res.longest_path, "traps": res.num_traps}
    where = f"{MODE_NAMES[res.mode]} {res.scope}"
    diffs = []
    if ours["acyclic"] != theirs["acyclic"]:
        diffs.append(f"{where}: _analyse says {'acyclic' if ours['acyclic'] else 'cyclic'}, networkx "
                     f"is_directed_acyclic_graph says {theirs['acyclic']}")
    if res.cycle is not None:
        missing = [(a, b) for a, b in zip(res.cycle, res.cycle[1:]) if not g.has_edge(a, b)]
        if missing or res.cycle[0] != res.cycle[-1]:
            diffs.append(f"{where}: the cycle _analyse reports {res.cycle[:8]} is not a closed walk of the graph "
                         f"(missing edges {missing[:3]})")
    if ours["longest_path"] != theirs["longest_path"]:
        diffs.append(f"{where}: longest path from the initial states: _analyse {ours['longest_path']}, networkx "
                     f"dag_longest_path_length {theirs['longest_path']}")
    our_traps = set(res.trap_list)
    if our_traps != their_traps or ours["traps"] != len(our_traps):
        only_ours, only_theirs = sorted(our_traps - their_traps), sorted(their_traps - our_traps)
        first = (only_ours or only_theirs)[:1]
        diffs.append(f"{where}: trap sets differ: _analyse {ours['traps']} states, networkx {len(their_traps)}; "
                     f"only _analyse: {only_ours[:5]}; only networkx: {only_theirs[:5]}" +
                     (f"; first: {_state(res, first[0])}" if first else ""))
    return CrossCheck(res.n, MODE_NAMES[res.mode], scope or res.scope, res.states, g.number_of_edges(),
                      time.perf_counter() - t0, ours, theirs, diffs)


def engines_agree_verdict(checks: list[CrossCheck], scope: str, mode: str, incomplete: list[int] = (),
                          prop: str = "graph_analyses_match_networkx", method: str = METHOD) -> Verdict:
    """One verdict over `checks`; a truncated run (`incomplete`: its N) makes it INCOMPLETE, never a pass."""
    diffs = [d for c in checks for d in c.diffs]
    states = sum(c.states for c in checks)
    secs = round(sum(c.seconds for c in checks), 3)
    if incomplete:
        return Verdict(prop, method, scope, mode, "unknown", secs, states, None,
                       f"INCOMPLETE: search truncated at N={list(incomplete)}; no cross-check there")
    if not checks:
        return Verdict(prop, method, scope, mode, "failed", secs, 0, None, "no run was cross-checked")
    if diffs:
        return Verdict(prop, method, scope, mode, "failed", secs, states, None,
                       f"{len(diffs)} differences, first: " + "; ".join(diffs[:3]))
    lp = f"; longest path per N {({c.n: c.ours['longest_path'] for c in checks})}" \
        if len({c.mode for c in checks}) == 1 else ""
    return Verdict(prop, method, scope, mode, "holds", secs, states, None,
                   f"acyclic, longest path and trap set equal on {len(checks)} runs "
                   f"({sum(c.edges for c in checks):,} edges){lp}; traps {sum(c.ours['traps'] for c in checks):,}")


def mutant_cross_checks(scope: Scope = CROSS_CHECK_SCOPE, mutants=CROSS_CHECK_MUTANTS) -> tuple[list, list]:
    """(one verdict per mutant, figures per run): both engines on graphs with cycles, deadlocks and traps.

    A mutant whose graphs show no trap (or no cycle, where `CROSS_CHECK_MUTANTS` says it has one)
    in `scope` fails too: it would compare nothing that the table's own graphs do not.
    """
    verdicts, figures = [], []
    for name, has, build, has_cycle in mutants:
        table = build()
        checks, truncated = [], []
        for mode in scope.modes:
            for n in range(1, scope.n_max + 1):
                r = explore(n, scope.d_max, scope.w, mode, table=table, quits=scope.quits, keep_succs=True,
                            round_bound=ROUNDS_CLOSED_FORM[mode][1], max_states=500_000)
                if r.truncated:
                    truncated.append(n)
                    continue
                c = cross_check(r, str(scope))
                checks.append(c)
                figures.append({"mutant": name, **c.figures()})
        v = engines_agree_verdict(checks, str(scope), "all", truncated, prop=f"graph_analyses_match_networkx[{name}]",
                                  method=f"{METHOD} (mutant graphs)")
        cyclic = sum(not c.ours["acyclic"] for c in checks)
        traps = sum(c.ours["traps"] for c in checks)
        if v.ok and (not traps or (has_cycle and not cyclic)):
            v.result, v.detail = "failed", f"vacuous: {cyclic} cyclic runs and {traps} traps in {scope} ({has} " \
                                           "expected)"
        elif v.ok:
            v.detail = f"{has}: {cyclic} cyclic runs, {traps:,} traps; " + v.detail
        verdicts.append(v)
    return verdicts, figures
