"""Counterexamples as step tables: one line per step, only the fields that changed.

Legend
    rI       rank I of the replayed run (ranks are numbered in the order of the
             initial state; identities are kept across steps by the replay)
    env      the environment: ``complete`` (one collective round finishes) or
             ``quit`` (rank I's local stop status turns to 1: ``env.quit(rank=I)``)
    k        collectives completed; ``mb`` the last collective's result

A path found on the symmetry-reduced graph is replayed on the unreduced
`models.env.Model`, so the table shows real rank identities.  A deadlock ends
with a *waits-for* line: which ranks wait in which round, and for whom; then
that relation as a graph (`waits_for_graph`, networkx): its cycle, or else its
longest chain, which ends at a rank that waits for no one (it has left, or it
is stuck).
"""

from __future__ import annotations

from models.env import SysState
from models.logic import GLOBAL_ENV, RANK_ENV
from odb.protocol.table import DONE, PHASES, WAIT

from .explore import Exploration

__all__ = ["replay", "step_table", "waits_for", "waits_for_graph", "waits_for_chain", "counterexample"]

_PHASE = {v: k for k, v in PHASES.items()}


def replay(res: Exploration, idx: int) -> list[tuple[str, SysState]]:
    """The shortest path to state `idx` as ``[(label, concrete state)]`` (first label is "init")."""
    path = res.path(idx)
    model, fm = res.model, res.fm
    first = path[0][1]
    cur = fm.to_sys(first) if res.symmetry else first
    out = [("init", cur)]
    for lab, target in path[1:]:
        actor_id, row, params = lab
        for l2, t in model.successors(cur):
            # the environment's quit names its rank in the params; the fast model names it as the actor
            who = dict(l2.params)["rank"] if l2.row == "quit" else l2.actor
            if l2.row != row or (l2.params != params and not (res.symmetry and row == "quit")):
                continue
            if res.symmetry:
                if actor_id is not None and cur.ranks[who] != fm.rank_of[actor_id]:
                    continue
                if fm.from_sys(t) != target:
                    continue
            elif t != target:
                continue
            out.append((str(l2), t))
            cur = t
            break
        else:  # pragma: no cover - would mean the fast model and the model disagree
            raise AssertionError(f"cannot replay step {row}{params}: the fast and generic successors differ")
    return out


def _fmt(name: str, v) -> str:
    if name == "ph":
        return _PHASE.get(v, str(v))
    if isinstance(v, bool):
        return "T" if v else "F"
    return str(v)


def _rank_fields(s: SysState) -> tuple[str, ...]:
    return tuple(s.table_fields) + tuple(RANK_ENV)


def step_table(steps: list[tuple[str, SysState]]) -> str:
    """Render a replayed run; the first line shows each rank's shard and the initial phase."""
    s0 = steps[0][1]
    lines = [f"{'step':>4}  {'actor.row(choices)':<34} changes"]
    init = " | ".join(f"r{i}: d={s0.rank_value(i, 'd')} {_PHASE[s0.rank_value(i, 'ph')]}" for i in range(s0.n))
    lines.append(f"{0:>4}  {'init':<34} {init}")
    names = _rank_fields(s0)
    for n, ((lab, s), (_, prev)) in enumerate(zip(steps[1:], steps[:-1]), start=1):
        ch = []
        for i in range(s.n):
            for f in names:
                a, b = prev.rank_value(i, f), s.rank_value(i, f)
                if a != b:
                    ch.append(f"r{i}.{f} {_fmt(f, a)}->{_fmt(f, b)}")
        if prev.k != s.k:
            ch.append(f"k {prev.k}->{s.k}")
        if prev.mb != s.mb:
            ch.append("mb(" + ",".join(g for g in GLOBAL_ENV if g != "k") + ")=" + ",".join(map(str, s.mb)))
        lines.append(f"{n:>4}  {lab:<34} {'; '.join(ch)}")
    return "\n".join(lines)


def _missing(s: SysState, i: int) -> list[int]:
    """The ranks that have not posted the collective rank `i` is in (rank `i` in WAIT)."""
    rd = s.rank_value(i, "rd")
    return [j for j in range(s.n) if not (s.rank_value(j, "ph") == WAIT and s.rank_value(j, "rd") == rd
                                          and s.rank_value(j, "posted") == 1)]


def waits_for(s: SysState) -> str:
    """Who waits for whom in a stuck state."""
    parts = []
    for i in range(s.n):
        ph, rd = s.rank_value(i, "ph"), s.rank_value(i, "rd")
        if ph == WAIT:
            missing = _missing(s, i)
            if s.k == rd + 1:
                parts.append(f"r{i} left collective #{rd} but no row returns it (decision blocked)")
            elif missing:
                who = ", ".join(f"r{j} ({_PHASE[s.rank_value(j, 'ph')]}, round {s.rank_value(j, 'rd')})"
                                for j in missing)
                parts.append(f"r{i} waits in collective #{rd} for {who}")
            else:
                parts.append(f"r{i} waits in collective #{rd}: all posted, collective cannot complete "
                             "(shape mismatch?)")
        elif ph != DONE:
            parts.append(f"r{i} is stuck in {_PHASE[ph]} round {rd} (no row enabled)")
    return "STUCK: " + "; ".join(parts) if parts else "STUCK: every rank is DONE"


def waits_for_graph(s: SysState):
    """The waits-for relation of `s` as a networkx DiGraph over ranks: i -> j when rank i waits in
    collective #rd (its round) and rank j has not posted that collective.

    A rank whose collective was completed (``k == rd + 1``; its decision is blocked) waits for no one.
    Needs networkx (the ``verify`` and ``test`` extras).
    """
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(range(s.n))
    for i in range(s.n):
        if s.rank_value(i, "ph") == WAIT and s.k != s.rank_value(i, "rd") + 1:
            g.add_edges_from((i, j) for j in _missing(s, i) if j != i)
    return g


def _where(s: SysState, j: int) -> str:
    ph, rd = s.rank_value(j, "ph"), s.rank_value(j, "rd")
    if ph == DONE:
        return f"r{j} is DONE: it has left the protocol"
    if ph == WAIT:
        return f"r{j} waits in collective #{rd}, which no one else blocks"
    return f"r{j} is stuck in {_PHASE[ph]} round {rd} (no row enabled)"


def waits_for_chain(s: SysState) -> str:
    """The waits-for graph of a stuck state in one line: its cycle (``nx.find_cycle``), else its longest
    chain (``nx.dag_longest_path``), which ends at a rank that waits for no one, then the edges off the chain."""
    import networkx as nx

    g = waits_for_graph(s)
    if not g.number_of_edges():
        return "WAITS-FOR: no rank waits in a collective for another"
    try:
        cycle = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        chain = nx.dag_longest_path(g)
        on = set(zip(chain, chain[1:]))
        others = [f"r{u} -> r{v} ({_PHASE[s.rank_value(v, 'ph')]})" for u, v in sorted(g.edges) if (u, v) not in on]
        return ("WAITS-FOR chain: " + " -> ".join(f"r{i}" for i in chain) + f" ({_where(s, chain[-1])})" +
                (f"; other waits: {', '.join(others)}" if others else ""))
    nodes = [u for u, _ in cycle] + [cycle[0][0]]
    rounds = ", ".join(f"r{u} in #{s.rank_value(u, 'rd')}" for u, _ in cycle)
    return ("WAITS-FOR cycle: " + " -> ".join(f"r{i}" for i in nodes) +
            f" (each waits for the next to post its collective: {rounds}; none of them can move)")


def counterexample(res: Exploration, idx: int, *, deadlock: bool = False, title: str = "") -> str:
    """A full counterexample block: heading, step table and (for a deadlock) the waits-for line."""
    steps = replay(res, idx)
    head = f"{title}  mode={_mode(res)} {res.scope}  shortest: {len(steps) - 1} steps"
    body = step_table(steps)
    if deadlock:
        body += "\n" + waits_for(steps[-1][1]) + "\n" + waits_for_chain(steps[-1][1])
    return head + "\n" + body


def _mode(res: Exploration) -> str:
    from .explore import MODE_NAMES
    return MODE_NAMES[res.mode]
