"""Exhaustive breadth-first exploration of the composed model, one (mode, N) at a time.

Legend
    N        ranks; D the largest shard (every data vector in 0..D, as a multiset);
             W the window; mode PAD/JOIN/QUOTA; Q the number of ranks that may
             quit in one run (`models.env.Model(quits=Q)`: the environment's
             ``quit`` may fire at any time before the rank is DONE)
    state    `fast.FastState` (rank symmetry applied) or, with ``symmetry=False``,
             a plain `models.env.SysState` (no reduction; used to check the reduction)
    sink     a state without successors; a deadlock is a sink that is not all-DONE

`explore` visits every reachable state of every data vector, under every
interleaving and every policy choice (the proposal, ``use`` and ``take``), and
returns an `Exploration`: counts, BFS depth, per-row fire counts, the first
(shortest) state violating each ``always`` property, the first witness of each
``sometimes`` property, deadlocks, cycles, traps (states from which all-DONE is
unreachable), local nondeterminism, empty real batches (a step property: every
``emit`` firing hands out at least one sample), the longest path and the rounds
per data vector.  Parent pointers make every reported state's path a shortest path.

A search that exceeds ``max_states`` stops and is flagged ``truncated``; every
verdict built from it is then a failure (INCOMPLETE), never a pass.

The graph analyses (`_analyse`) are hand-written array code, sized for the
millions of states of ``verify --deep``; `crosscheck` compares them with
networkx on the graphs of the small scopes (``explore(keep_succs=True)`` keeps
the successor lists for it).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from models.env import Model, SysState
from models.logic import GLOBAL_ENV
from models.properties import for_mode
from odb.protocol.table import DGAP, MODES, Table

from .fast import FastModel, rank_layout
from .props import compile_formula

__all__ = ["Exploration", "explore", "data_vectors", "MODE_NAMES"]

MODE_NAMES = {v: k for k, v in MODES.items()}


def data_vectors(n: int, d_max: int) -> list[tuple[int, ...]]:
    """Every per-rank shard-size vector in ``0..d_max`` up to rank permutation."""
    return list(itertools.combinations_with_replacement(range(d_max + 1), n))


@dataclass
class Exploration:
    """What one exhaustive run found (see the module docstring)."""

    mode: int
    n: int
    d_max: int
    w: int
    symmetry: bool
    quits: int = 0
    states: int = 0
    transitions: int = 0
    depth: int = 0
    sinks: int = 0
    seconds: float = 0.0
    truncated: bool = False
    fires: dict = field(default_factory=dict)
    always_fail: dict = field(default_factory=dict)      # property -> state index
    sometimes_found: dict = field(default_factory=dict)  # property -> state index
    deadlocks: list = field(default_factory=list)         # state indices (first few)
    num_deadlocks: int = 0
    nondeterministic: list = field(default_factory=list)  # (state index, rank id, rows)
    empty_batches: list = field(default_factory=list)     # (state index, rank id, row, params, count)
    cycle: list | None = None                              # state indices of one cycle
    traps: list = field(default_factory=list)              # states that cannot reach all-DONE (first few)
    num_traps: int = 0
    trap_list: list = field(default_factory=list)          # every trap (dropped with `drop_graph`)
    longest_path: int | None = None
    rounds_exceeded: int | None = None                     # first state past `round_bound`
    per_vector: dict = field(default_factory=dict)         # d -> {"longest": , "max_rounds": , "min_rounds": }
    # the graph, kept for counterexamples (dropped with `drop_graph`)
    fm: FastModel | None = None
    model: Model | None = None
    states_list: list | None = None
    parent: list | None = None
    plabel: list | None = None
    sink_list: list = field(default_factory=list)          # every sink's state index
    succs: list | None = None                              # successor lists, with explore(keep_succs=True)

    @property
    def scope(self) -> str:
        return f"N={self.n}, D<={self.d_max}, W={self.w}" + (f", quits<={self.quits}" if self.quits else "")

    def path(self, idx: int) -> list[tuple]:
        """The shortest path to state `idx`: ``[(label or None, state)]`` from an initial state."""
        out = []
        while idx >= 0:
            out.append((self.plabel[idx], self.states_list[idx]))
            idx = self.parent[idx]
        return out[::-1]

    def sys(self, idx: int) -> SysState:
        s = self.states_list[idx]
        return self.fm.to_sys(s) if self.symmetry else s

    def drop_graph(self) -> None:
        self.fm = self.states_list = self.parent = self.plabel = self.succs = None
        self.sink_list, self.trap_list = [], []


def _props(table: Table, mode: int, model: Model):
    index = rank_layout(table)
    out = []
    for p in for_mode(mode):
        out.append((p, compile_formula(p.formula, index, model.cfg, table.let_map)))
    return out


def explore(n: int, d_max: int, w: int, mode: int, *, table: Table = DGAP, symmetry: bool = True,
            max_states: int = 5_000_000, policy=None, round_bound=None, quits: int = 0,
            keep_succs: bool = False, xchg: int = 0, w0: int | None = None) -> Exploration:
    """Explore every reachable state for `n` ranks (see the module docstring).

    Deterministic: the same arguments give the same counts and counterexamples.
    `policy(fm, state, transitions) -> transitions` restricts the choices (the
    confluence check); without it every allowed choice is explored.
    `round_bound(d) -> int` (d: the sorted data vector) is the claimed maximum
    number of collectives; a state past it is recorded in `rounds_exceeded`
    and not expanded, so a table with unbounded rounds still gives a finite
    search and a shortest counterexample (such a state has no successors).
    `keep_succs` keeps the successor lists in ``Exploration.succs`` (for
    `crosscheck`; they cost about as much memory as the states).
    """
    t0 = time.perf_counter()
    model = Model(table, W=w, mode=mode, quits=quits, xchg=xchg, W0=w0)
    fm = FastModel(model)
    res = Exploration(mode=mode, n=n, d_max=d_max, w=w, symmetry=symmetry, quits=quits, fm=fm, model=model)
    props = _props(table, mode, model)
    always = [(p.name, c) for p, c in props if p.kind == "always"]
    sometimes = {p.name: c for p, c in props if p.kind == "sometimes"}
    fires = {r.name: 0 for r in table.rows}
    fires["complete"] = 0
    fires["quit"] = 0

    if symmetry:
        succ_fn = fm.successors
        inits = [fm.initial(dv) for dv in data_vectors(n, d_max)]
    else:
        def succ_fn(s):
            for lab, t in model.successors(s):
                yield lab.actor, lab.row, lab.params, t
        inits = [model.initial(p) for dv in data_vectors(n, d_max) for p in sorted(set(itertools.permutations(dv)))]

    index: dict = {}
    states: list = []
    parent: list[int] = []
    plabel: list = []
    level: list[int] = []
    bound: list[int] = []
    succs: list = []
    for s in inits:
        if s not in index:
            index[s] = len(states)
            states.append(s)
            parent.append(-1)
            plabel.append(None)
            level.append(0)
            sysv = fm.to_sys(s) if symmetry else s
            d = tuple(sorted(sysv.rank_value(r, "d") for r in range(sysv.n)))
            bound.append(round_bound(d) if round_bound else 1 << 60)

    seen_keys: set = set()
    need_globals = any(c.reads_globals for _, c in props)
    rank_of = fm.rank_of
    num_nondet = num_empty = 0
    i = 0
    while i < len(states):
        s = states[i]
        # -- properties (memoised on the set of distinct rank tuples) ----------
        if symmetry:
            ids = tuple(dict.fromkeys(s[0]))
            key = (ids, s[1], s[2]) if need_globals else ids
            ranks = [rank_of[r] for r in ids]
        else:
            key = s
            ranks = list(s.ranks)
        glob = None
        if key not in seen_keys:
            seen_keys.add(key)
            sysv = None
            if need_globals:
                sysv = fm.to_sys(s) if symmetry else s
                glob = {g: sysv.global_value(g) for g in GLOBAL_ENV}
            for name, c in always:
                if name not in res.always_fail and not c.fn(ranks, glob):
                    res.always_fail[name] = i
            for name, c in list(sometimes.items()):
                if c.fn(ranks, glob):
                    res.sometimes_found[name] = i
                    del sometimes[name]
        # -- successors ----------------------------------------------------------
        if (s[1] if symmetry else s.k) > bound[i]:
            if res.rounds_exceeded is None:
                res.rounds_exceeded = i
            succs.append([])
            i += 1
            continue
        out = []
        trans = succ_fn(s) if policy is None else policy(fm, s, list(succ_fn(s)))
        for actor, row, params, t in trans:
            j = index.get(t)
            if j is None:
                j = len(states)
                index[t] = j
                states.append(t)
                parent.append(i)
                plabel.append((actor, row, params))
                level.append(level[i] + 1)
                bound.append(bound[i])
            out.append(j)
            fires[row] += 1
        succs.append(out)
        if len(fm.nondeterministic) > num_nondet:  # this state's expansion met a new nondeterministic rank
            for rid, rows in fm.nondeterministic[num_nondet:]:
                if len(res.nondeterministic) < 5:
                    res.nondeterministic.append((i, rid, rows))
            num_nondet = len(fm.nondeterministic)
        if len(fm.empty_batches) > num_empty:
            for rid, row, params, count in fm.empty_batches[num_empty:]:
                if len(res.empty_batches) < 5:
                    res.empty_batches.append((i, rid, row, params, count))
            num_empty = len(fm.empty_batches)
        if not out:
            res.sinks += 1
            res.sink_list.append(i)
            done = fm.all_done(s) if symmetry else s.all_done()
            if not done:
                res.num_deadlocks += 1
                if len(res.deadlocks) < 5:
                    res.deadlocks.append(i)
        i += 1
        if len(states) > max_states:
            res.truncated = True
            break
    if not symmetry:
        # local determinism and batch sizes on the unreduced graph, from the same memo as the reduced one
        for s in states[:i]:
            for r in s.ranks:
                rid = fm.intern(r)
                rows = fm.enabled_rows(rid, s.k, s.mb)
                if len(rows) > 1 and len(res.nondeterministic) < 5:
                    res.nondeterministic.append((index[s], rid, rows))
                before = len(fm.empty_batches)
                fm.local(rid, s.k, s.mb)
                for rid2, row, params, count in fm.empty_batches[before:]:
                    if len(res.empty_batches) < 5:
                        res.empty_batches.append((index[s], rid2, row, params, count))

    res.states = len(states)
    res.transitions = sum(len(o) for o in succs)
    res.depth = max(level)
    res.fires = fires
    res.states_list, res.parent, res.plabel = states, parent, plabel
    if keep_succs:
        res.succs = succs
    if not res.truncated:
        _analyse(res, succs, [idx for idx in range(len(inits))])
    res.seconds = time.perf_counter() - t0
    return res


def _analyse(res: Exploration, succs: list, init_idx: list[int]) -> None:
    """Cycles, longest paths, traps and rounds per data vector, from the successor lists."""
    n = len(succs)
    color = bytearray(n)
    order: list[int] = []
    for root in range(n):
        if color[root]:
            continue
        color[root] = 1
        stack = [(root, iter(succs[root]))]
        while stack:
            node, it = stack[-1]
            for j in it:
                c = color[j]
                if c == 0:
                    color[j] = 1
                    stack.append((j, iter(succs[j])))
                    break
                if c == 1 and res.cycle is None:
                    nodes = [x for x, _ in stack]
                    res.cycle = nodes[nodes.index(j):] + [j]
            else:
                stack.pop()
                color[node] = 2
                order.append(node)
    done = (lambda idx: res.fm.all_done(res.states_list[idx])) if res.symmetry else \
        (lambda idx: res.states_list[idx].all_done())
    if res.cycle is None:
        lp = [0] * n
        can = bytearray(n)
        for node in order:  # post-order: successors first
            out = succs[node]
            if out:
                lp[node] = 1 + max(lp[j] for j in out)
                can[node] = any(can[j] for j in out)
            else:
                can[node] = done(node)
        res.longest_path = max(lp[i] for i in init_idx)
    else:
        lp = None
        preds: list[list[int]] = [[] for _ in range(n)]
        for a, out in enumerate(succs):
            for b in out:
                preds[b].append(a)
        can = bytearray(n)
        todo = [x for x in range(n) if not succs[x] and done(x)]
        for x in todo:
            can[x] = 1
        while todo:
            b = todo.pop()
            for a in preds[b]:
                if not can[a]:
                    can[a] = 1
                    todo.append(a)
    bad = [x for x in range(n) if not can[x]]
    res.num_traps = len(bad)
    res.traps = bad[:5]
    res.trap_list = bad
    # rounds per data vector: the k of every all-DONE sink, grouped by the data multiset
    for x in range(n):
        if succs[x] or not done(x):
            continue
        sysv = res.sys(x)
        d = tuple(sorted(sysv.rank_value(r, "d") for r in range(sysv.n)))
        e = res.per_vector.setdefault(d, {"longest": None, "max_rounds": sysv.k, "min_rounds": sysv.k})
        e["max_rounds"] = max(e["max_rounds"], sysv.k)
        e["min_rounds"] = min(e["min_rounds"], sysv.k)
    if lp is not None:
        for i in init_idx:
            sysv = res.sys(i)
            d = tuple(sorted(sysv.rank_value(r, "d") for r in range(sysv.n)))
            e = res.per_vector.setdefault(d, {"longest": None, "max_rounds": None, "min_rounds": None})
            e["longest"] = max(e["longest"] or 0, lp[i])
