"""Happens-before of one real run: every rank's trace events and the collectives between them, as one graph.

Legend
    event       (rank, i): event i of a rank's trace, counted after the meta record as `check`
                counts it ("rank R event I"); ``local_error`` and ``failure`` lines are events too
    collective  one header all-gather, named by its round: the ``round`` of the post row that
                enters it (``post_header``) and of the collect row that leaves it (``return_*``)
    HB          the happens-before graph, a networkx DiGraph over events: program order
                (rank, i) -> (rank, i + 1), and for every collective c an edge
                post(r, c) -> collect(s, c) for every pair of ranks r, s (no rank's all-gather
                returns before every rank has entered it)
    segment     the events of one rank from one collect (or its first event) to its next post

`happens_before` checks two conditions on HB and measures one figure:

1. **Acyclic.** HB is a DAG, i.e. the run happened in some order.  A cycle means that a rank's
   own order of events contradicts what the collectives imply; it is reported hop by hop
   (``nx.find_cycle``), with the ranks and rounds on it.
2. **One total order.** The k-th collective of every rank is the same round, a rank leaves the
   round it entered last, and no rank enters a round twice; so all ranks' collectives line up in
   one order (gloo matches the k-th all-gather of every rank, so ranks that disagree here
   exchanged headers of different rounds).  A rank whose trace stops early (it failed, or was
   killed) has done a prefix of that order.
3. **Critical path** (a figure, not a condition): the longest chain of HB, in events
   (``nx.dag_longest_path``), the number of collectives it passes through, and on which rank it
   runs in each segment.  The traces carry no clock: this is the longest causal chain counted in
   fired rows, and its rank per segment is the one with the most rows before the next collective.

Both conditions overlap with `check`'s per-rank round order on purpose: here they are
properties of the graph of the whole run, decided by a library, not by the replay.  Only the
``effect`` and ``round`` of each event are read; everything else is `check`'s.  networkx is
imported here only (it is in the ``verify`` and ``test`` extras; ``import odb`` never needs it).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

__all__ = ["HappensBefore", "happens_before"]

_KINDS = ("post", "collect")


@dataclass
class HappensBefore:
    """The verdict and figures of `happens_before`; ``ok`` only if `problems` is empty."""

    events: int = 0
    edges: int = 0
    order: list = field(default_factory=list)            # the common order of the rounds
    critical_events: int | None = None                   # None when HB has a cycle
    critical_collectives: int | None = None
    critical_ranks: list = field(default_factory=list)   # the rank of each segment of the critical path
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> dict:
        """The figures for a report: collectives and events on the critical path, its segments per rank."""
        return {"collectives": self.critical_collectives, "events": self.critical_events,
                "segments_by_rank": dict(sorted(Counter(self.critical_ranks).items())),
                "hb_events": self.events, "hb_edges": self.edges}


def _collective(ev: dict) -> tuple[str, int] | None:
    """("post" | "collect", round) for an event that enters or leaves a collective, else None."""
    if ev.get("effect") in _KINDS and "round" in ev:
        return ev["effect"], ev["round"]
    return None


def happens_before(traces: list[list[dict]]) -> HappensBefore:
    """Build HB from every rank's events (``traces[rank]``, meta record excluded) and check it.

    Requires networkx (raises ImportError without it; `check.check_run` turns that into a problem).
    Deterministic: the same traces give the same cycle, order and critical path.
    """
    import networkx as nx

    g = nx.DiGraph()
    posts: dict[int, list] = defaultdict(list)
    collects: dict[int, list] = defaultdict(list)
    seqs: list[list[int]] = []   # per rank: the round of each all-gather it entered, in order
    stray: list[str] = []         # collects that leave another round than the one their rank entered last
    for rank, events in enumerate(traces):
        g.add_nodes_from((rank, i) for i in range(len(events)))
        g.add_edges_from(((rank, i), (rank, i + 1)) for i in range(len(events) - 1))
        seq: list[int] = []
        for i, ev in enumerate(events):
            c = _collective(ev)
            if c is None:
                continue
            (posts if c[0] == "post" else collects)[c[1]].append((rank, i))
            if c[0] == "post":
                seq.append(c[1])
            elif not seq or seq[-1] != c[1]:
                stray.append(f"happens-before: rank {rank} event {i} leaves round {c[1]} but the last all-gather "
                             f"it entered was {f'round {seq[-1]}' if seq else 'none'}")
        seqs.append(seq)
    for rnd, ps in posts.items():
        g.add_edges_from((p, q) for p in ps for q in collects.get(rnd, ()))
    out = HappensBefore(events=g.number_of_nodes(), edges=g.number_of_edges())
    out.problems += stray
    _check_order(seqs, out)
    if not nx.is_directed_acyclic_graph(g):
        out.problems.insert(0, _describe_cycle(nx.find_cycle(g), traces))
        return out
    _critical_path(nx.dag_longest_path(g), traces, out)
    return out


def _check_order(seqs: list[list[int]], out: HappensBefore) -> None:
    """Condition 2: every rank's rounds are a prefix of one order (`out.order`: the longest rank's)."""
    for rank, seq in enumerate(seqs):
        twice = sorted(c for c, k in Counter(seq).items() if k > 1)
        if twice:
            out.problems.append(f"happens-before: rank {rank} enters rounds {twice} twice "
                                f"(the rounds of its all-gathers in order: {seq})")
    for k in range(max((len(s) for s in seqs), default=0)):
        at = defaultdict(list)
        for rank, seq in enumerate(seqs):
            if k < len(seq):
                at[seq[k]].append(rank)
        if len(at) > 1:
            who = "; ".join(f"round {c} on ranks {ranks}" for c, ranks in sorted(at.items()))
            out.problems.append(f"happens-before: the ranks' collectives do not line up in one total order: "
                                f"all-gather #{k} of each rank (from 0) is {who} (gloo matches the k-th all-gather "
                                "of every rank, so these ranks exchanged headers of different rounds)")
            return
    out.order = max(seqs, key=len, default=[])


def _label(node: tuple[int, int], traces: list[list[dict]]) -> str:
    rank, i = node
    ev = traces[rank][i]
    c = _collective(ev)
    what = f"{c[0]} round {c[1]}" if c else ev.get("row", "local_error" if "local_error" in ev else "failure")
    return f"rank {rank} event {i} ({what})"


def _is_collective_edge(u: tuple[int, int], v: tuple[int, int], traces: list[list[dict]]) -> bool:
    a, b = _collective(traces[u[0]][u[1]]), _collective(traces[v[0]][v[1]])
    return a is not None and b is not None and a[0] == "post" and b[0] == "collect" and a[1] == b[1]


def _describe_cycle(edges: list[tuple], traces: list[list[dict]]) -> str:
    """Condition 1's message: the cycle as its collective hops (=>) joined by program order (->...->)."""
    hops, ranks, rounds = [], set(), set()
    for u, v in edges:
        ranks |= {u[0], v[0]}
        if _is_collective_edge(u, v, traces):
            rounds.add(_collective(traces[u[0]][u[1]])[1])
            hops.append(f"{_label(u, traces)} => {_label(v, traces)}")
    return (f"happens-before cycle through rounds {sorted(rounds)} on ranks {sorted(ranks)} (no run can order "
            "these events: each => is a collective, which returns on no rank before every rank's post, and each "
            "-> ... -> a rank's own order): " + " -> ... -> ".join(hops) + " -> ... -> back")


def _critical_path(path: list[tuple[int, int]], traces: list[list[dict]], out: HappensBefore) -> None:
    out.critical_events = len(path)
    out.critical_collectives = 0
    out.critical_ranks = [path[0][0]] if path else []
    for u, v in zip(path, path[1:]):
        if _is_collective_edge(u, v, traces):
            out.critical_collectives += 1
            out.critical_ranks.append(v[0])
