"""The table composed with its environment: N ranks, N data sources, one collective mailbox.

Legend
    N      ranks; W window; mode PAD/JOIN/QUOTA (``cfg``)
    d_i    samples rank i's data source holds initially; ``src_i`` what it still holds
    k      collectives completed so far; ``mb`` the inputs of the last completed one

Environment semantics (the only things the table does not say itself):
    data source   answers ``src_has`` only when a guard asks; a ``fetch`` row that got
                  ``src_has = true`` removes one sample from the source.  The rank
                  never sees ``src_i`` (no omniscient guard).
    collective    post -> complete -> return, with an explicit per-round mailbox.
                  ``post_header`` deposits the rank's header (posted_i = 1, pn_i, pshape_i).
                  ``complete`` is one global transition, enabled when every rank is
                  in WAIT at round ``rd_i == k`` and has posted; it computes the
                  aggregates of the table from the mailbox, picks the policy's
                  proposal (any value in the table's proposal bounds: the policy is
                  arbitrary but, being a pure function of the gathered headers, the
                  same on every rank), sets ``k += 1`` and empties the mailbox.
                  A rank may return (``in.ready``) once ``k == rd_i + 1``.
    stopping      ``quit`` is one environment transition per rank: at any time
                  before the rank is DONE its local status ``qt_i`` may turn
                  from 0 to 1 (its consumer closed the loader, or its source
                  raised), at most once, and for at most ``quits`` ranks per run.
                  The rank reads it as ``in.quit``.  The table treats every
                  non-zero status alike (1 closed and 2 failed differ only in
                  the runtime's messages), so the model uses 1.

A `SysState` is immutable and hashable.  Ranks are stored as tuples of the
table's field values in table order followed by the per-rank environment
fields, so canonicalising (sorting the rank tuples) is rank symmetry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from odb.protocol import machine
from odb.protocol.expr import Scope, evaluate
from odb.protocol.table import DGAP, DONE, WAIT, Table

__all__ = ["SysState", "Model", "Label"]

_ENV_FIELDS = ("src", "d", "posted", "pn", "pshape", "qt", "pst")


@dataclass(frozen=True)
class SysState:
    table_fields: tuple[str, ...]
    ranks: tuple[tuple, ...]   # per rank: table fields..., src, d, posted, pn, pshape, qt, pst
    k: int
    mb: tuple                  # (max_st, max_n, min_n, min_pos_n, proposal) of the last completed collective
    cfg_items: tuple

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def cfg(self) -> dict:
        return dict(self.cfg_items)

    def _index(self, name: str) -> int:
        if name in self.table_fields:
            return self.table_fields.index(name)
        return len(self.table_fields) + _ENV_FIELDS.index(name)

    def rank_value(self, i: int, name: str):
        return self.ranks[i][self._index(name)]

    def local(self, i: int) -> dict:
        return dict(zip(self.table_fields, self.ranks[i]))

    def global_value(self, name: str):
        if name == "k":
            return self.k
        names = ("max_st", "max_n", "min_n", "min_pos_n", "proposal")
        if name in names:
            return self.mb[names.index(name)]
        return self.cfg[name]

    def canon(self) -> "SysState":
        """The representative of this state's rank-permutation class."""
        return SysState(self.table_fields, tuple(sorted(self.ranks)), self.k, self.mb, self.cfg_items)

    def all_done(self) -> bool:
        return all(self.rank_value(i, "ph") == DONE for i in range(self.n))


@dataclass(frozen=True)
class Label:
    """What a transition was: a rank's row (with its choices) or the environment's ``complete``."""

    actor: int | None      # rank index, or None for the environment
    row: str               # table row name, or "complete"
    params: tuple = ()

    def __str__(self) -> str:
        p = ", ".join(f"{k}={v}" for k, v in self.params)
        who = "env" if self.actor is None else f"r{self.actor}"
        return f"{who}.{self.row}({p})"


class Model:
    """The composed transition system for one table and one configuration.

    :param quits: how many ranks may stop (``quit``) in one run (0: none).
    """

    def __init__(self, table: Table = DGAP, *, W: int, mode: int, header_len: int = 1, quits: int = 0, xchg: int = 0,
                 W0: int | None = None):
        self.table = table
        self.quits = quits
        self.cfg = {"W": W, "W0": W if W0 is None else W0, "mode": mode, "header_len": header_len, "xchg": xchg}
        self._fields = table.field_names
        self._init_local = machine.initial_local(table, self.cfg)

    def initial(self, data: tuple[int, ...]) -> SysState:
        """The initial state for per-rank shard sizes `data`."""
        loc = tuple(self._init_local[f] for f in self._fields)
        ranks = tuple(loc + (d, d, 0, 0, 0, 0, 0) for d in data)
        return SysState(self._fields, ranks, 0, (0, 0, 0, 0, 0), tuple(sorted(self.cfg.items())))

    # -- transitions ---------------------------------------------------------
    def inputs(self, s: SysState, i: int) -> dict:
        """The inputs the environment offers rank i in state s (what its guards may read)."""
        rd = s.rank_value(i, "rd")
        max_st, max_n, min_n, min_pos_n, proposal = s.mb
        return {
            "src_has": s.rank_value(i, "src") > 0,
            "quit": s.rank_value(i, "qt"),
            "ready": s.k == rd + 1,
            "max_st": max_st, "max_n": max_n, "min_n": min_n, "min_pos_n": min_pos_n, "proposal": proposal,
        }

    def local_successors(self, s: SysState, i: int) -> Iterator[tuple[Label, SysState]]:
        local = s.local(i)
        env = list(s.ranks[i][len(self._fields):])
        for st in machine.successors(self.table, local, self.inputs(s, i), self.cfg):
            new_env = list(env)
            if st.effect == "fetch" and st.inputs.get("src_has"):
                new_env[0] -= 1
            if st.effect == "post":
                new_env[2], new_env[3], new_env[4] = 1, st.payload["n"], st.payload["shape"]
                new_env[6] = st.payload["st"]
            rank = tuple(st.after[f] for f in self._fields) + tuple(new_env)
            ranks = s.ranks[:i] + (rank,) + s.ranks[i + 1:]
            yield Label(i, st.row, tuple(sorted(st.params.items()))), SysState(
                s.table_fields, ranks, s.k, s.mb, s.cfg_items)

    def complete_enabled(self, s: SysState) -> bool:
        return all(
            s.rank_value(i, "ph") == WAIT and s.rank_value(i, "rd") == s.k and s.rank_value(i, "posted") == 1
            for i in range(s.n)
        )

    def env_successors(self, s: SysState) -> Iterator[tuple[Label, SysState]]:
        if not self.complete_enabled(s):
            return
        headers = [{"n": s.rank_value(i, "pn"), "st": s.rank_value(i, "pst"), "shape": s.rank_value(i, "pshape")}
                   for i in range(s.n)]
        if len({h["shape"] for h in headers}) > 1:
            return  # a collective mismatch never completes (it hangs or aborts): no successor
        agg = [machine.aggregate(a, headers, self.cfg) for a in self.table.aggregates]
        p = self.table.proposal
        lo = evaluate(p.lo, Scope(cfg=self.cfg))
        hi = evaluate(p.hi, Scope(cfg=self.cfg))
        ip = len(self._fields)
        ranks = tuple(r[:ip + 2] + (0, 0, 0, r[ip + 5], 0) for r in s.ranks)
        for v in range(lo, hi + 1):
            yield Label(None, "complete", (("proposal", v),)), SysState(
                s.table_fields, ranks, s.k + 1, tuple(agg) + (v,), s.cfg_items)

    def quit_successors(self, s: SysState) -> Iterator[tuple[Label, SysState]]:
        """The environment makes rank i stop (at most `quits` ranks per run)."""
        iq = len(self._fields) + 5
        if sum(1 for r in s.ranks if r[iq]) >= self.quits:
            return
        for i in range(s.n):
            r = s.ranks[i]
            if r[iq] == 0 and s.rank_value(i, "ph") != DONE:
                ranks = s.ranks[:i] + (r[:iq] + (1,) + r[iq + 1:],) + s.ranks[i + 1:]
                yield Label(None, "quit", (("rank", i),)), SysState(s.table_fields, ranks, s.k, s.mb, s.cfg_items)

    def successors(self, s: SysState) -> Iterator[tuple[Label, SysState]]:
        for i in range(s.n):
            yield from self.local_successors(s, i)
        yield from self.env_successors(s)
        yield from self.quit_successors(s)
