"""The table composed with dealt sharding: N ranks read one global order through `odb.batching.deal`.

Legend
    N        ranks; P positions ``0 .. P-1`` of the epoch's global order (keys ``(p, p)``)
    W        window; mode PAD/JOIN/QUOTA (``cfg``, as in `models.env`)
    ahead_r  keys rank r's inner DataLoader may read ahead of the items it returned
             (``num_workers * prefetch_factor``); the vector is known to every rank
    value_p  what position p turns out to be when its item is returned: ``DROP`` (the preprocessing returned None,
             a length 0, a skipped oversize sample) or a usable sample of cost ``c >= 1``; chosen by the
             environment the first time the item is returned and fixed from then on (``values``, -1 while unknown)
    replica  rank r's `odb.batching.dealt_order.DealtOrder` (its `Dealer` replica and the keys dealt to it); the real
             class does every deal and every read, the model only interns its snapshots (`Replicas`)
    reads_r  keys rank r's source has read (``key(0) .. key(reads-1)``); ``ret_r`` items it returned (usable or
             not: the header's ``taken``); ``ended_r`` a read returned None (the key iterator is finished for the
             epoch)

Environment semantics (what the runtime does around the table; `models.env` for the rest; `DealtModel` gives the
rules): ``read`` (a rank's source reads its replica's next key, prefetching up to ``ahead_r`` in any interleaving),
``drop`` (an item the table never sees), ``fetch`` (``take_sample`` or ``see_exhausted``), ``post`` (the table's
header plus the deal's fields), ``complete`` (as `models.env.Model`), ``return`` (the collect row, and the replica
applies the round's deal), ``start`` (every replica applies ``first()``).

Ghost per rank: ``drops`` (items dropped), ``over`` (some round's ``W - n + use`` exceeded the rank's posted
`intake_bound`: the policy emitted more than its bound), ``eg`` (a deal this replica applied was an end game that
split the last positions unevenly between live ranks whose measured costs differ).  No quits: an aborted epoch
reports its positions as unemitted, which the table's own proofs cover.  The glue a runtime implements (the lead,
the needs, the replica class) is the overridable part of `DealtModel`, so seeded glue bugs are subclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

from odb.batching.dealt_order import DealtOrder
from odb.batching.grouping import Group
from odb.batching.intake import first_lead, intake_bound, policy_intake, round_needs
from odb.protocol import machine
from odb.protocol.expr import Let, Scope, evaluate
from odb.protocol.table import DGAP, EMIT, FILL, WAIT, Table

__all__ = ["DROP", "POLICIES", "DealtConfig", "DealtModel", "Replicas", "RankView"]

DROP = 0
_F = {name: i for i, name in enumerate(DGAP.field_names)}
PH, RD, BUF, X, EM = _F["ph"], _F["rd"], _F["buf"], _F["exhausted"], _F["em"]
# rank tuple: (local, reads, ret, ended, cost, drops, over, eg, rid, hdr)
LOCAL, READS, RET, ENDED, COST, DROPS, OVER, EG, RID, HDR = range(10)
# hdr: (n, st, shape, taken, cost, dry, reserve, ladder)


class _Whole:
    """A policy that promises no groups (`odb.batching.base.AlignmentPolicy.groups`' default)."""

    def groups(self, window, cost):
        return None


class _Singletons:
    """A grouping policy whose groups are single samples (each sample fills the budget alone):
    its posted bound is ``U(T) = min(T, n)``, so a round that emits more than T samples is over it."""

    def groups(self, window, cost):
        return [Group((i,), True, 1.0) for i in range(len(window))]


# The intake ladder a rank posts: `policy_intake` of a policy without `groups` (the whole window at
# every T: no bound below W) or of one with single-sample groups (a bound the table's `use` may exceed).
POLICIES = {"whole": _Whole(), "singletons": _Singletons()}


@dataclass(frozen=True)
class DealtConfig:
    """One dealt scope: N = len(aheads) ranks, `total` positions, each position's value in `values`."""

    total: int
    aheads: tuple[int, ...]
    W: int = 2
    mode: int = 0
    policy: str = "whole"
    values: tuple[int, ...] = (DROP, 1)
    W0: int | None = None  # the first round's window (None: W)

    @property
    def n(self) -> int:
        return len(self.aheads)

    def __str__(self) -> str:
        vals = ",".join("drop" if v == DROP else str(v) for v in self.values)
        w0 = "" if self.W0 is None else f", W0={self.W0}"
        return (f"N={self.n}, P={self.total}, W={self.W}{w0}, aheads={list(self.aheads)}, {self.policy}, "
                f"values {{{vals}}}")


class Replicas:
    """Interned `DealtOrder` snapshots (``rid``) and memoised reads and deals, done by `order_cls`."""

    def __init__(self, order_cls: type, total: int, n: int):
        self.order_cls, self.total, self.n = order_cls, total, n
        self.order = [(p, p) for p in range(total)]
        self.ids: dict[tuple, int] = {}
        self.info: list[dict] = []
        self._key: dict = {}
        self._deal: dict = {}

    def intern(self, o: DealtOrder) -> int:
        st = o.dealer.state_dict()
        snap = (o.rank, st["lead"], st["cursor"], tuple(st["dealt"]), tuple(st["reserve"]), tuple(st["closed"]),
                st["rounds"], tuple(k[0] for k in o.keys), o.reserve_taken, bool(o.dry))
        rid = self.ids.get(snap)
        if rid is None:
            rid = self.ids[snap] = len(self.info)
            self.info.append({"snap": snap, "state": st, "keys": snap[7], "reserve_taken": o.reserve_taken,
                              "dry": bool(o.dry), "rounds": st["rounds"], "left": o.dealer.left,
                              "undealt": tuple(o.dealer.undealt()), "done": o.dealer.done})
        return rid

    def materialize(self, rid: int) -> DealtOrder:
        snap = self.info[rid]["snap"]
        o = self.order_cls(self.order, self.n, snap[0], snap[1])
        o.dealer.load_state_dict(dict(self.info[rid]["state"]))
        o.keys = [self.order[p] for p in snap[7]]
        o.reserve_taken, o.dry = snap[8], snap[9]
        return o

    def first(self, rank: int, lead: int) -> int:
        o = self.order_cls(self.order, self.n, rank, lead)
        o.first()
        return self.intern(o)

    def key(self, rid: int, i: int) -> tuple[int, int | None]:
        got = self._key.get((rid, i))
        if got is None:
            o = self.materialize(rid)
            try:
                k = o.key(i)
            except Exception as e:  # the real code raised: the rank's runtime would crash here
                got = (self.crashed(rid, f"key({i})", e), None)
            else:
                got = (self.intern(o), None if k is None else k[0])
            self._key[(rid, i)] = got
        return got

    def deal(self, rid: int, args: tuple) -> int:
        got = self._deal.get((rid, args))
        if got is None:
            o = self.materialize(rid)
            taken, cost, dry, reserve, need = (list(a) for a in args)
            try:
                o.deal(taken, cost, dry, reserve, need)
            except Exception as e:
                got = self.crashed(rid, f"deal(taken={taken}, cost={cost}, dry={dry}, reserve={reserve}, "
                                        f"need={need})", e)
            else:
                got = self.intern(o)
            self._deal[(rid, args)] = got
        return got

    def crashed(self, rid: int, call: str, e: Exception) -> int:
        """A replica whose `call` raised `e`: its last good snapshot, marked with the error (no more steps)."""
        msg = f"{call} raised {type(e).__name__}: {e}"
        snap = ("error", rid, msg)
        got = self.ids.get(snap)
        if got is None:
            got = self.ids[snap] = len(self.info)
            self.info.append({**self.info[rid], "snap": snap, "error": msg})
        return got


@dataclass(frozen=True)
class RankView:
    """What a property reads of one rank (derived from the rank tuple and its replica)."""

    rank: int
    local: dict
    reads: int
    ret: int
    ended: bool
    drops: int
    over: bool
    eg: bool
    replica: dict          # `Replicas.info` entry: keys, reserve_taken, dry, rounds, state, left, undealt, done
    ahead: int
    consumed: tuple        # positions returned by the source, in order
    emitted: tuple         # the first ``em`` usable ones (the engine emits its window in order)
    dropped: tuple
    held: tuple            # dealt to the rank and not emitted or dropped (window, prefetched, unread)


class DealtModel:
    """The composed transition system for one `DealtConfig` (legend and ghosts: the module docstring).

    Environment semantics (what the runtime does around the table; `models.env` for the rest):
        read       rank r's source calls ``replica.key(reads)``: a key (reads += 1) or None (ended).  Prefetch:
                   enabled in FILL (the only phase in which the engine thread calls the source) whenever fewer than
                   ``ahead_r`` keys are read ahead of the returned items, in any interleaving; and on demand when
                   the rank fetches with nothing read ahead.  A superset of torch's schedule (which keeps exactly
                   ``ahead_r`` outstanding).
        drop       a fetching rank's source returns its next item and it is a drop: ret += 1, the table never sees
                   it (the engine's fetch loops past it)
        fetch      ``take_sample`` when the next returned item is usable (ret += 1, its cost added),
                   ``see_exhausted`` when nothing is outstanding and the source ended; the answer ``src_has``
                   exists only then (before it, a read or a drop must come)
        post       the header carries the table's ``n, st`` and the deal's ``taken = ret``, ``cost``,
                   ``dry = replica.dry``, ``reserve = replica.reserve_taken`` and the intake ladder
                   `policy_intake` of the window (`POLICIES`)
        complete   as `models.env.Model`: every rank posted in round k; aggregates from the table, any proposal in
                   its bounds; the gathered headers stay readable
        return     the rank's collect row, and in the same step its replica applies
                   ``deal(taken, cost, dry, reserve, need=round_needs(W, target, posted, aheads))`` with every
                   rank's gathered values, ``target`` the table's ``Let("target")`` of the round, unless its dealer
                   is done (as `odb.core.replica.Replicated.decide`: every replica is done alike).  At the return,
                   not at the completion: that is where the runtime does it (its rank thread collects and decides
                   before the row fires), and a rank reads its replica only in FILL, after its own return, so the
                   two places give the same replica at every read; the return also lets replicas sit one deal
                   apart, which `replicas_agree` must allow
        start      every replica is built with ``first_lead(W, aheads)`` and applies ``first()``

    Override `lead`, `needs`, `posted_deal` or `order_cls` to model a glue bug (`proofs.mutants.dealt`).
    """

    order_cls: type = DealtOrder

    def __init__(self, cfg: DealtConfig, table: Table = DGAP):
        self.c, self.table = cfg, table
        self.cfg = {"W": cfg.W, "W0": cfg.W if cfg.W0 is None else cfg.W0, "mode": cfg.mode, "header_len": 1, "xchg": 0}
        self.rep = Replicas(self.order_cls, cfg.total, cfg.n)
        self._init_local = tuple(machine.initial_local(table, self.cfg)[f] for f in table.field_names)
        self._fields = table.field_names
        self._table_memo: dict = {}
        self._views: dict = {}
        self._steps: dict = {}
        p = table.proposal
        self._prop = range(evaluate(p.lo, Scope(cfg=self.cfg)), evaluate(p.hi, Scope(cfg=self.cfg)) + 1)

    # -- the glue a runtime implements ------------------------------------------------
    def lead(self, rank: int) -> int:
        """The first deal's lead on `rank`'s replica."""
        return first_lead(self.c.W, self.c.aheads)

    def needs(self, rank: int, target: int, posted: list[tuple[int, Sequence[int]]]) -> list[int]:
        """Every rank's need, as `rank`'s replica computes it at the round's deal."""
        return round_needs(self.c.W, target, posted, self.c.aheads)

    def posted_deal(self, rk: tuple, replica: dict) -> tuple[int, int, int, int]:
        """The deal's header fields a rank posts: ``taken`` (items returned), ``cost``, ``dry``, ``reserve``."""
        return rk[RET], rk[COST], int(replica["dry"]), replica["reserve_taken"]

    def ladder(self, n: int) -> tuple[int, ...]:
        return tuple(policy_intake(POLICIES[self.c.policy], [(1,)] * n, None, self.c.W))

    # -- states ---------------------------------------------------------------------
    def initial(self) -> tuple:
        ranks = tuple((self._init_local, 0, 0, False, 0, 0, False, False, self.rep.first(r, self.lead(r)), None)
                      for r in range(self.c.n))
        return (ranks, 0, (0, 0, 0, 0, 0), None, (-1,) * self.c.total)

    def view(self, s: tuple, r: int) -> RankView:
        """Rank r's `RankView` in state `s` (memoised: it depends on the rank tuple and the values of
        the positions its source returned)."""
        rk = s[0][r]
        info = self.rep.info[rk[RID]]
        values = s[4]
        key = (r, rk, tuple(values[p] for p in info["keys"][:rk[RET]]))
        got = self._views.get(key)
        if got is None:
            got = self._views[key] = self._view(rk, r, info, values)
        return got

    def _view(self, rk: tuple, r: int, info: dict, values: tuple) -> RankView:
        local = dict(zip(self._fields, rk[LOCAL]))
        consumed = info["keys"][:rk[RET]]
        dropped = tuple(p for p in consumed if values[p] == DROP)
        emitted = tuple(p for p in consumed if values[p] != DROP)[:local["em"]]
        gone = set(emitted) | set(dropped)
        return RankView(r, local, rk[READS], rk[RET], rk[ENDED], rk[DROPS], rk[OVER], rk[EG], info,
                        self.c.aheads[r], consumed, emitted, dropped, tuple(p for p in info["keys"] if p not in gone))

    def all_done(self, s: tuple) -> bool:
        return all(rk[LOCAL][PH] == 3 for rk in s[0])

    # -- transitions ------------------------------------------------------------------
    def successors(self, s: tuple) -> Iterator[tuple[tuple, tuple]]:
        """``(label, t)``: label = (rank or None, step name, params)."""
        ranks, k, mb, gathered, values = s
        for r in range(self.c.n):
            for label, rk, setval in self.rank_steps(s, r):
                vals = values if setval is None else values[:setval[0]] + (setval[1],) + values[setval[0] + 1:]
                yield label, (ranks[:r] + (rk,) + ranks[r + 1:], k, mb, gathered, vals)
        yield from self._complete(s)

    def rank_steps(self, s: tuple, r: int) -> list:
        """Rank r's steps in `s` as ``(label, new rank tuple, (position, value) or None)``: memoised on
        what they read (the rank tuple, the collective's result once it may return, the value of the
        next item its source returns), so the table and the replicas run once per distinct case."""
        ranks, k, mb, gathered, values = s
        rk = ranks[r]
        ready = k == rk[LOCAL][RD] + 1
        nxt = None
        if rk[READS] > rk[RET]:
            nxt = values[self.rep.info[rk[RID]]["keys"][rk[RET]]]
        key = (r, rk, ready, mb if ready else None, gathered if ready else None, nxt)
        got = self._steps.get(key)
        if got is None:
            got = self._steps[key] = list(self._rank(rk, r, ready, mb, gathered, nxt))
        return got

    def _table(self, local: tuple, inputs: tuple) -> list:
        key = (local, inputs)
        got = self._table_memo.get(key)
        if got is None:
            ins = dict(zip(("src_has", "ready", "max_st", "max_n", "min_n", "min_pos_n", "proposal"), inputs))
            ins["quit"] = 0
            got = []
            for st in machine.successors(self.table, dict(zip(self._fields, local)), ins, self.cfg):
                got.append((st.row, tuple(sorted(st.params.items())), tuple(st.after[f] for f in self._fields),
                            st.effect, st.payload, st.params))
            self._table_memo[key] = got
        return got

    def _rank(self, rk: tuple, r: int, ready: bool, mb: tuple, gathered, nxt) -> Iterator[tuple]:
        if "error" in self.rep.info[rk[RID]]:
            return  # the real code raised on this rank: it stops (a crash; its peers then wait)
        loc = rk[LOCAL]
        W, ahead = self.c.W, self.c.aheads[r]
        ph = loc[PH]
        fetching = ph == FILL and not loc[X] and loc[BUF] < W
        outstanding = rk[READS] - rk[RET]
        if ph == FILL and not rk[ENDED] and (outstanding < ahead or (outstanding == 0 and fetching)):
            rid, p = self.rep.key(rk[RID], rk[READS])
            new = list(rk)
            new[RID] = rid
            if p is None:
                new[ENDED] = True
            else:
                new[READS] += 1
            yield (r, "read", (("key", p),)), tuple(new), None
        src_has: list = []  # (answer, cost, value to record) choices for the fetch rows
        if fetching:
            if outstanding > 0:
                p = self.rep.info[rk[RID]]["keys"][rk[RET]]
                for v in ((nxt,) if nxt >= 0 else self.c.values):
                    setval = None if nxt >= 0 else (p, v)
                    if v == DROP:
                        new = list(rk)
                        new[RET] += 1
                        new[DROPS] += 1
                        yield (r, "drop", (("pos", p),)), tuple(new), setval
                    else:
                        src_has.append((True, v, setval))
            elif rk[ENDED]:
                src_has.append((False, 0, None))
            if not src_has:
                return  # the fetch waits for a read or a drop
        inputs = (ready,) + tuple(mb)
        for has, cost, setval in (src_has or [(False, 0, None)]):
            for row, params, after, effect, payload, pdict in self._table(loc, (has,) + inputs):
                new = list(rk)
                new[LOCAL] = after
                if effect == "fetch" and has:
                    new[RET] += 1
                    new[COST] += cost
                elif effect == "post":
                    new[HDR] = (payload["n"], payload["st"], payload["shape"],
                                *self.posted_deal(rk, self.rep.info[rk[RID]]), self.ladder(payload["n"]))
                elif effect == "collect":
                    self._deal(r, new, gathered, mb, row, pdict)
                yield (r, row, params), tuple(new), setval

    def _deal(self, r: int, new: list, gathered: tuple, mb: tuple, row: str, params: dict) -> None:
        """The rank's return: its replica applies the round's deal (in place on the rank tuple `new`)."""
        names = ("max_st", "max_n", "min_n", "min_pos_n", "proposal")
        target = evaluate(Let("target"), Scope(inputs=dict(zip(names, mb)), cfg=self.cfg, lets=self.table.let_map))
        posted = [(h[0], h[7]) for h in gathered]
        need = self.needs(r, target, posted)
        args = tuple(tuple(h[j] for h in gathered) for j in (3, 4, 5, 6)) + (tuple(need),)
        before = self.rep.info[new[RID]]
        rid = new[RID] if before["done"] else self.rep.deal(new[RID], args)  # as the runtime: none once done
        after = self.rep.info[rid]
        new[RID] = rid
        mine = gathered[r]
        if row == "return_go" and self.c.W - mine[0] + params["use"] > intake_bound(self.c.W, mine[0], mine[7], target):
            new[OVER] = True
        if before["left"] > 0 and after["done"]:  # this deal gave out every position left: the end game
            got = [a - b for a, b in zip(after["state"]["dealt"], before["state"]["dealt"])]
            live = [j for j in range(self.c.n) if not after["state"]["closed"][j]]
            share = {got[j] - (args[3][j] - before["state"]["reserve"][j]) for j in live}
            if len(share) > 1 and len({args[1][j] for j in live}) > 1:
                new[EG] = True

    def _complete(self, s: tuple) -> Iterator[tuple[tuple, tuple]]:
        ranks, k, mb, gathered, values = s
        if not all(rk[LOCAL][PH] == WAIT and rk[LOCAL][RD] == k and rk[HDR] is not None for rk in ranks):
            return
        hdrs = [{"n": rk[HDR][0], "st": rk[HDR][1], "shape": rk[HDR][2]} for rk in ranks]
        if len({h["shape"] for h in hdrs}) > 1:
            return  # a collective mismatch never completes
        agg = tuple(machine.aggregate(a, hdrs, self.cfg) for a in self.table.aggregates)
        gathered = tuple(rk[HDR] for rk in ranks)
        cleared = tuple(rk[:HDR] + (None,) for rk in ranks)
        for v in self._prop:
            yield (None, "complete", (("proposal", v),)), (cleared, k + 1, agg + (v,), gathered, values)


assert EMIT == 2 and FILL == 0 and WAIT == 1, "the rank tuple layout assumes the table's phase numbers"
