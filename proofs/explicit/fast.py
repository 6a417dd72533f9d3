"""A fast, semantics-preserving successor function for `models.env.Model`.

Legend
    N      ranks; a system state is ``(ids, k, mb)``
    ids    the sorted tuple of per-rank *ids*: each distinct rank tuple of
           `models.env.SysState.ranks` (table fields + per-rank environment
           fields ``src, d, posted, pn, pshape, qt, pst``) is interned once and
           named by a small int
    k, mb  the environment's collective counter and last collective result
           ``(max_st, max_n, min_n, min_pos_n, proposal)``

Why it is fast and why it is still the same model:

* Ranks are independent between collectives: a rank's local successors depend
  only on its own rank tuple and on ``(k, mb)``.  They are computed once per
  ``(id, k, mb)`` by `models.env.Model.local_successors` on a one-rank state
  (so the table is interpreted by ``odb.protocol.machine`` only) and memoised.
* The environment's ``complete`` is delegated to `Model.env_successors` on the
  full state, after a cheap necessary test (every rank has posted and waits).
* The environment's ``quit`` (`Model.quit_successors`) flips one rank's ``qt``;
  it is delegated to `Model.quit_successors` on a one-rank state and memoised
  per id, after the one global test that the one-rank state cannot see (fewer
  than ``Model.quits`` ranks have quit so far).
* Sorting the ids is rank symmetry (the same quotient as `SysState.canon`,
  with a different but fixed order of rank tuples).  Identical ranks give
  identical successors, so only one rank of each identical group is expanded.

`selfcheck.fast_matches_model` (run by `tests/test_explicit.py` and in the
report, with and without quits) checks that `FastModel.successors` equals
``{canon(t) for t in Model.successors(s)}`` on every reachable state at small N.
"""

from __future__ import annotations

from typing import Iterator

from models.env import Model, SysState
from models.logic import RANK_ENV
from odb.protocol import machine
from odb.protocol.table import DONE, WAIT, Table

__all__ = ["FastModel", "FastState", "rank_layout"]

FastState = tuple  # (ids: tuple[int, ...], k: int, mb: tuple)


def rank_layout(table: Table) -> dict[str, int]:
    """Field name -> position in a `SysState` rank tuple (table fields, then `RANK_ENV`).

    Read off `SysState.rank_value` on a probe state, so the layout is the model's own.
    """
    names = tuple(table.field_names) + tuple(RANK_ENV)
    probe = SysState(table.field_names, (tuple(range(len(names))),), 0, (), ())
    return {n: probe.rank_value(0, n) for n in names}


class FastModel:
    """Interned, memoised view of one `Model` (one table, one cfg, one ``quits``).

    Contract: `successors(s)` yields ``(actor_id, row, params, t)`` for every
    transition of the canonical state `s` up to rank symmetry (one per
    distinct rank tuple and firing; ``actor_id`` is None for ``complete`` and
    the quitting rank's id for ``quit``); `to_sys` / `from_sys` convert exactly.
    Side records (for the engine properties): `nondeterministic` (a rank with
    several enabled rows) and `empty_batches` (an ``emit`` row handing out a
    batch of fewer than one sample), each found when a ``(id, k, mb)`` is first
    expanded.
    """

    def __init__(self, model: Model):
        self.model = model
        self._fields = model.table.field_names
        self.layout = rank_layout(model.table)
        self._i_ph = self.layout["ph"]
        self._i_posted = self.layout["posted"]
        self._i_qt = self.layout["qt"]
        self._emit_rows = {r.name: r for r in model.table.rows if r.effect.kind == "emit"}
        self.rank_of: list[tuple] = []
        self._id_of: dict[tuple, int] = {}
        self._waiting: list[bool] = []   # ph == WAIT and posted: ``complete`` may be enabled
        self._done: list[bool] = []
        self._qt: list[int] = []         # 1 if the rank has quit
        self._quit: list[list | None] = []  # memo: ids after this rank quits
        self._local: dict[tuple, list] = {}
        self._mb: dict[tuple, tuple] = {}
        self._enabled: dict[tuple, tuple] = {}
        self._cfg_items = tuple(sorted(model.cfg.items()))
        self.local_calls = 0
        self.nondeterministic: list[tuple[int, tuple]] = []  # (rank id, rows) with several rows enabled
        self.empty_batches: list[tuple[int, str, tuple, int]] = []  # (rank id, row, params, count < 1)

    # -- interning -------------------------------------------------------------
    def intern(self, rank: tuple) -> int:
        i = self._id_of.get(rank)
        if i is None:
            i = len(self.rank_of)
            self._id_of[rank] = i
            self.rank_of.append(rank)
            self._waiting.append(rank[self._i_ph] == WAIT and rank[self._i_posted] == 1)
            self._done.append(rank[self._i_ph] == DONE)
            self._qt.append(1 if rank[self._i_qt] else 0)
            self._quit.append(None)
        return i

    def _mbi(self, mb: tuple) -> tuple:
        return self._mb.setdefault(mb, mb)

    def from_sys(self, s: SysState) -> FastState:
        return (tuple(sorted(self.intern(r) for r in s.ranks)), s.k, self._mbi(s.mb))

    def to_sys(self, s: FastState) -> SysState:
        ids, k, mb = s
        return SysState(self._fields, tuple(self.rank_of[i] for i in ids), k, mb, self._cfg_items)

    def canon_sys(self, s: SysState) -> SysState:
        """The SysState of `from_sys(s)` (ranks in interned order): comparable across both encodings."""
        return self.to_sys(self.from_sys(s))

    def initial(self, data: tuple[int, ...]) -> FastState:
        return self.from_sys(self.model.initial(tuple(data)))

    def all_done(self, s: FastState) -> bool:
        done = self._done
        return all(done[i] for i in s[0])

    def _one(self, rid: int, k: int, mb: tuple) -> SysState:
        return SysState(self._fields, (self.rank_of[rid],), k, mb, self._cfg_items)

    # -- transitions -------------------------------------------------------------
    def local(self, rid: int, k: int, mb: tuple) -> list:
        """Memoised local successors of rank `rid`: ``[(row, params, new_id)]``.

        Each new ``(rid, k, mb)`` is also checked for local determinism (at most
        one enabled row) and for empty real batches; violations are appended to
        `nondeterministic` / `empty_batches`.
        """
        key = (rid, k, mb)
        out = self._local.get(key)
        if out is None:
            self.local_calls += 1
            one = self._one(rid, k, mb)
            out = [(lab.row, lab.params, self.intern(t.ranks[0]))
                   for lab, t in self.model.local_successors(one, 0)]
            self._local[key] = out
            rows = self.enabled_rows(rid, k, mb)
            if len(rows) > 1:
                self.nondeterministic.append((rid, rows))
            if self._emit_rows and any(r in self._emit_rows for r in rows):
                self._check_counts(rid, one, out)
        return out

    def _check_counts(self, rid: int, one: SysState, out: list) -> None:
        """Every ``emit`` firing hands out at least one sample (`machine.fire` computes the count)."""
        table, cfg = self.model.table, self.model.cfg
        local, inputs = one.local(0), self.model.inputs(one, 0)
        for row, params, _ in out:
            r = self._emit_rows.get(row)
            if r is not None:
                count = machine.fire(table, r, local, inputs, cfg, dict(params)).count
                if count < 1:
                    self.empty_batches.append((rid, row, params, count))

    def quit_targets(self, rid: int) -> list:
        """Memoised ids of rank `rid` after the environment's ``quit`` (empty: it cannot quit)."""
        out = self._quit[rid]
        if out is None:
            one = self._one(rid, 0, ())
            out = [self.intern(t.ranks[0]) for _, t in self.model.quit_successors(one)]
            self._quit[rid] = out
        return out

    def successors(self, s: FastState) -> Iterator[tuple]:
        ids, k, mb = s
        prev = -1
        for j, rid in enumerate(ids):
            if rid == prev:
                continue  # an identical rank: the same successors up to symmetry
            prev = rid
            for row, params, nid in self.local(rid, k, mb):
                lst = list(ids)
                lst[j] = nid
                lst.sort()
                yield rid, row, params, (tuple(lst), k, mb)
        waiting = self._waiting
        if waiting[ids[0]] and all(waiting[i] for i in ids):
            full = self.to_sys(s)
            for lab, t in self.model.env_successors(full):
                yield None, lab.row, lab.params, (tuple(sorted(self.intern(r) for r in t.ranks)), t.k,
                                                  self._mbi(t.mb))
        if self.model.quits:
            qt = self._qt
            if sum(qt[i] for i in ids) < self.model.quits:
                prev = -1
                for j, rid in enumerate(ids):
                    if rid == prev:
                        continue
                    prev = rid
                    for nid in self.quit_targets(rid):
                        lst = list(ids)
                        lst[j] = nid
                        lst.sort()
                        yield rid, "quit", (), (tuple(lst), k, mb)

    def enabled_rows(self, rid: int, k: int, mb: tuple) -> tuple[str, ...]:
        """Rows enabled for rank `rid` at ``(k, mb)``, by ``machine.enabled_rows`` (local determinism).

        Reads the inputs through `Model.inputs` (the environment's one definition of
        what a rank is handed).
        """
        key = (rid, k, mb)
        out = self._enabled.get(key)
        if out is None:
            one = self._one(rid, k, mb)
            rows = machine.enabled_rows(self.model.table, one.local(0), self.model.inputs(one, 0),
                                        self.model.cfg)
            out = self._enabled[key] = tuple(r.name for r in rows)
        return out
