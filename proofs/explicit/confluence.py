"""Confluence: under a deterministic policy, one outcome per data vector, whatever the interleaving.

Legend
    policy   a deterministic choice rule for every choice of the table: ``lo``
             (always the lower bound), ``hi`` (always the upper bound) or
             ``hash`` (an index picked by a CRC of what the chooser sees: the
             rank's own table fields, or the gathered headers for the proposal)
    outcome  the multiset of per-rank ``(d, em, nb)`` at an all-DONE sink

A rank's policy sees only its own state and inputs, and the proposal policy only
the gathered headers; that is what makes the choice reproducible on every rank.
The scheduler (which rank steps next) stays fully nondeterministic: the check is
that it cannot change the outcome.
"""

from __future__ import annotations

import zlib
from collections import defaultdict

from odb.protocol.table import DGAP, Table

from .explore import Exploration, data_vectors, explore

__all__ = ["POLICIES", "policy_filter", "check_confluence"]

POLICIES = ("lo", "hi", "hash")


def _pick(kind: str, options: list, seen: tuple) -> object:
    options = sorted(options)
    if kind == "lo":
        return options[0]
    if kind == "hi":
        return options[-1]
    return options[zlib.crc32(repr(seen).encode()) % len(options)]


def policy_filter(kind: str):
    """A `explore` policy that keeps one choice per (rank, row) and one proposal per collective."""
    if kind not in POLICIES:
        raise ValueError(f"unknown policy {kind!r}; valid: {POLICIES}")

    def choose(fm, s, trans):
        groups: dict = defaultdict(list)
        for tr in trans:
            groups[(tr[0], tr[1])].append(tr)
        out = []
        ip = len(fm.model.table.field_names)
        hdr = [fm.layout[f] for f in ("pn", "pst", "pshape")]
        for (actor, row), options in groups.items():
            if actor is None:  # complete: the proposal sees the gathered headers only
                seen = tuple(sorted(tuple(fm.rank_of[i][h] for h in hdr) for i in s[0]))
            else:              # a rank sees its own table fields (and its inputs, fixed by the state)
                seen = fm.rank_of[actor][:ip]
            pick = _pick(kind, [o[2] for o in options], (row, seen))
            out.extend(o for o in options if o[2] == pick)
        return out

    return choose


def outcomes(res: Exploration) -> dict[tuple, set]:
    """Data vector -> the set of outcomes of its all-DONE sinks (deadlocks give the outcome "STUCK")."""
    by_vec: dict[tuple, set] = defaultdict(set)
    for idx in res.sink_list:
        s = res.sys(idx)
        d = tuple(sorted(s.rank_value(i, "d") for i in range(s.n)))
        if not s.all_done():
            by_vec[d].add("STUCK")
            continue
        by_vec[d].add(tuple(sorted((s.rank_value(i, "d"), s.rank_value(i, "em"), s.rank_value(i, "nb"))
                                   for i in range(s.n))))
    return by_vec


def check_confluence(n: int, d_max: int, w: int, mode: int, kind: str, *, table: Table = DGAP,
                     round_bound=None, max_states: int = 5_000_000, xchg: int = 0, w0: int | None = None) -> dict:
    """Explore under policy `kind`; return counts and every data vector with != 1 outcome.

    Result keys: ``states``, ``transitions``, ``seconds``, ``vectors`` (checked),
    ``bad`` (data vector -> outcomes, empty when confluent), ``truncated``.
    """
    res = explore(n, d_max, w, mode, table=table, policy=policy_filter(kind), round_bound=round_bound,
                  max_states=max_states, xchg=xchg, w0=w0)
    by_vec = outcomes(res)
    expected = {tuple(sorted(v)) for v in data_vectors(n, d_max)}
    bad = {d: sorted(map(str, o)) for d, o in by_vec.items() if len(o) != 1 or "STUCK" in o}
    for d in expected - set(by_vec):
        bad[d] = ["no terminal state"]
    return {"states": res.states, "transitions": res.transitions, "seconds": res.seconds,
            "vectors": len(expected), "bad": bad, "truncated": res.truncated}
