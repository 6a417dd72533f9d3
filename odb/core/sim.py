"""N `RankCore`s in one process on an in-process all-gather: what the benchmarks and the batching tests run.

Legend
    measure   one sample as the data source returns it: a sizes tuple (labels = its tokens), a
              ``(sizes, labels)`` pair, or None (a drop: preprocessing returned None)
    shard     rank r's measures in its source's order (fixed shards)
    order     the epoch's global order of measures (dealt sharding: ``deal=``)

Every rank is the runtime's own `odb.core.rank.RankCore` with the runtime's header
(`odb.core.header.HeaderLayout`), its replicated decision (`odb.core.replica.Replicated`, the
prefetch of each rank in ``aheads`` included in the intake bound) and, when dealing, its
`odb.batching.dealt_order.DealtOrder` read key by key as the runtime's source reads it with no DataLoader
workers.  Only the environment is simulated: the data source (no preprocessing, no prefetch
reads) and the collective (the posted headers, gathered in rank order).  `simulate` with the
same order, settings and policy emits the batches `odb.ODBDataLoader` emits with ``num_workers=0``
(``tests/test_differential.py`` checks it batch for batch).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..batching.base import AlignmentPolicy
from ..batching.dealt_order import DealtOrder, Keys
from ..batching.intake import first_lead
from ..errors import ConfigError, ProtocolError
from ..protocol.table import MODES
from ..settings import LoaderSettings
from .header import Gathered, Post, header_layout, reduce_posts
from .info import LOSS_BASES, LoaderStats
from .placement import check_pool, pool_aheads
from .rank import RankCore
from .replica import Replicated
from .shared import Shared, describe_cost, describe_policy
from .types import Batch

__all__ = ["SimResult", "simulate", "replay_rank"]


@dataclass
class SimResult:
    """``batches[rank][step]``: the list of positions (shard indices, or positions of the dealt order)
    of one batch, or None for a filler.  In JOIN mode rows have different lengths.  ``unemitted[rank]``:
    QUOTA's unemitted positions (dealt: the undealt ones on rank 0).  ``decision_s``: per rank and round,
    the seconds spent in the policy.  ``reserve_taken[rank]``: dealt positions a rank took from its
    reserve (a rank topped up to its bound takes none unless it drops samples).  ``stats``: each rank's
    counters.  ``infos[rank][step]``: each released batch's `StepInfo` (``simulate(..., infos=True)``).
    ``moved``: with the exchange, the batches sent to another rank (pooled: to another pool; a move inside
    a pool is in memory, every replica of the pool holding the pool's batches).  ``first_wait[rank]``: the
    samples its core had read when the rank's first batch was released (pooled with one core per pool: the
    pool's), None if it released none: what the first batch waits for.  ``undealt``: dealt sharding, the positions
    no rank was dealt when the pass ended (QUOTA's early stop; counted once, in ``unemitted[0]``)."""

    batches: list[list[list[int] | None]]
    rounds: int
    unemitted: list[list[int]]
    decision_s: list[float] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    reserve_taken: list[int] = field(default_factory=list)
    stats: list[LoaderStats] = field(default_factory=list)
    infos: list[list] | None = None
    moved: int = 0                      # exchange: batches a core handed to another rank's
    first_wait: list[int | None] = field(default_factory=list)
    undealt: list[int] = field(default_factory=list)


def _measure(m) -> tuple | None:
    if m is None:
        return None
    if isinstance(m[0], tuple):
        return m
    return tuple(m), m[0]


class _Timed(AlignmentPolicy):
    """The policy, with the seconds spent in its three calls added up (what the benchmark's decision time reads)."""

    def __init__(self, inner: AlignmentPolicy):
        self._inner, self.seconds = inner, 0.0
        self.summary_len, self.summary_arrays, self.attention = inner.summary_len, inner.summary_arrays, inner.attention

    def groups(self, window, cost):
        return self._inner.groups(window, cost)

    def _timed(self, fn, *a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            self.seconds += time.perf_counter() - t0

    def summarize(self, *a):
        return self._timed(self._inner.summarize, *a)

    def propose(self, *a):
        return self._timed(self._inner.propose, *a)

    def partition(self, window, target, real, cost, *, summaries=None):
        return self._timed(self._inner.partition, window, target, real, cost, summaries=summaries)


class _TimedReplicated(Replicated):
    """The replicated decision, with the seconds spent in it added up (`replay_rank`'s ``replicated_s``)."""

    seconds = 0.0

    def decide(self, rows):
        t0 = time.perf_counter()
        try:
            return super().decide(rows)
        finally:
            self.seconds += time.perf_counter() - t0


class _ListSource:
    """A fixed shard, read in order."""

    def __init__(self, measures: Sequence):
        self.items = [(p, p, None, _measure(m)) for p, m in enumerate(measures)]
        self.pulled, self.dry = 0, False

    def next(self):
        if self.pulled >= len(self.items):
            return None
        self.pulled += 1
        return self.items[self.pulled - 1]

    def remaining(self) -> list:
        return [it[1] for it in self.items[self.pulled:]]

    reserve_taken = 0

    def undealt(self) -> list:
        return []


class _DealtSource:
    """The rank's dealt keys, read one at a time through its `DealtOrder` (as the runtime's sampler does)."""

    def __init__(self, order: DealtOrder, measures: Sequence):
        self.order, self.measures = order, measures
        self.pulled, self.ended = 0, False

    @property
    def dry(self) -> bool:
        return self.order.dry

    def next(self):
        if self.ended:
            return None
        key = self.order.key(self.pulled)
        if key is None:
            self.ended = True  # like a sampler iterator, once ended it stays ended for the pass
            return None
        self.pulled += 1
        pos, index = key
        return pos, index, None, _measure(self.measures[index])

    def remaining(self) -> list:
        return [index for _, index in self.order.keys[self.pulled:]]

    @property
    def reserve_taken(self) -> int:
        return self.order.reserve_taken

    def undealt(self) -> list:
        return self.order.undealt()


class _Setting:
    """What every simulated rank shares: the compared settings, the header layout, the prefetches
    and (dealing) the epoch's order of keys, one tuple that every rank's `DealtOrder` reads."""

    def __init__(self, n: int, settings: LoaderSettings, deal, aheads, share_deals: bool = True):
        sharding = "fixed" if deal is None else "dealt"
        if settings.sharding not in ("auto", sharding):
            raise ConfigError(f"settings.sharding={settings.sharding!r} but the simulation was given "
                              f"{'no deal=' if deal is None else 'deal='}: pass the other, or sharding='auto'")
        s = settings.resolved(n, sharding)  # placement="auto" as the loader resolves it for n ranks
        check_pool(n, s.lanes, s.mode, sharding)
        self.cost, pol = s.cost_and_policy()  # the loader's own derivation: the same cost model and default policy
        self.n, self.mode, self.deal, self.loss_basis, self.oversize = n, s.mode, deal, s.loss_basis, s.oversize
        self.lanes, self.pools = s.lanes, n // s.lanes
        self.aheads = pool_aheads(tuple(aheads) if aheads is not None else (0,) * n, s.lanes)
        self._policy = pol  # every core gets its own copy: one policy per rank, as the runtime builds them
        w = s.lanes * s.buffer_size  # the table's window: a pool's
        self.layout = header_layout(pol.summary_len, s.buffer_size, s.lanes, s.exchange, s.slack_bp)  # the loader's
        self.shared = Shared(protocol="sim", window=w, mode=s.mode, sharding=sharding,
                             header_len=self.layout.length, policy=describe_policy(pol), cost=describe_cost(self.cost),
                             loss_basis=s.loss_basis, shift_labels=False, order="sim", lanes=s.lanes,
                             exchange=s.exchange, exchange_slack=s.slack_bp, first_window=s.table_first_window)
        self.keys = None if deal is None else Keys(range(len(deal)), range(len(deal)))
        # the replicas' last deal, computed once for all of them (`DealtOrder`'s shared_deals)
        self.deals: dict | None = {} if share_deals else None

    def core(self, r: int, shard: Sequence, lane: int | None = 0,
             replica: type = Replicated) -> tuple[RankCore, _Timed, DealtOrder | None]:
        """Rank r's core; pooled (``lanes`` > 1): pool r's one core (`lane` None), or lane `lane` of pool
        ``r div lanes``, rank r (a replica, as the runtime runs it)."""
        pol, order = _Timed(copy.deepcopy(self._policy)), None
        pool = r if lane is None else r // self.lanes
        if self.deal is not None:
            order = DealtOrder(self.keys, self.pools, pool, first_lead(self.layout.window, self.aheads),
                               shared_deals=self.deals)
            order.first()
            src = _DealtSource(order, self.deal)
        else:
            src = _ListSource(shard)
        rep = replica(self.shared, world_size=self.pools, aheads=self.aheads, policy=pol, order=order, epoch=0)
        core = RankCore(rank=r, world_size=self.n, mode=MODES[self.mode], policy=pol, cost=self.cost, replica=rep,
                        layout=self.layout, source=src, oversize=self.oversize, loss_slot=LOSS_BASES[self.loss_basis],
                        stats=LoaderStats(), template=lambda _fallback: None, lane=lane, traced=False)
        return core, pol, order


def simulate(shards: Sequence[Sequence], settings: LoaderSettings, *, deal: Sequence | None = None,
             aheads: Sequence[int] | None = None, max_rounds: int = 10**7,
             on_round: Callable[[int, list], Any] | None = None, share_deals: bool = True, replicas: bool = False,
             infos: bool = False, on_moved: Callable[[int, dict], Any] | None = None) -> SimResult:
    """Run N = len(shards) ranks to DONE; return every rank's batches per step (see `SimResult`).

    `settings`: the loader's own `odb.LoaderSettings` (a ready cost model goes in ``cost=`` with
    ``token_budget=None``); the simulation reads what decides batches (``buffer_size``, ``mode``, ``cost``,
    ``policy``, ``oversize``, ``loss_basis``, ``placement``; each simulated rank gets its own copy of the
    policy) and ignores what concerns processes (workers, timeouts, traces).

    With ``deal`` (the epoch's global order of measures) `shards` must be N empty lists: every rank
    reads the order through its replica of the dealer, and batches hold positions of ``deal``.
    ``aheads`` is each rank's prefetch as the runtime gathers it (default 0: no DataLoader workers).
    ``on_round(k, posts)``, if given, sees round k's posts (`odb.core.header.Post`, rank order) before
    they are collected; a true return ends the simulation there (the result holds what was released).
    ``share_deals``: the dealt replicas, all in one state and fed the same gathered numbers, compute
    each deal once and each applies it (`DealtOrder`: keyed by the whole dealer state and the inputs,
    so a replica in another state computes its own); False: every replica deals alone (N times the
    dealer's work, the same batches).
    With ``placement=odb.Pooled(G)`` (dealt, PAD, G dividing N) by default one core per pool releases every
    lane's batches (the lanes' cores are its replicas);
    ``replicas=True`` runs every rank's own core, as the runtime does (G times the work, the same
    batches; the stats' straggler estimate ``step_tokens_max`` is exact only then).
    With ``placement=odb.Exchanged(...)`` (PAD or QUOTA, dealt) each round's batches are re-dealt across the
    ranks by fill (`odb.batching.exchange`), the moved ones handed from core to core here.
    ``on_moved(k, moved)``, if given, sees round k's exchanged batches after its collect: ``{core index:
    {origin slot: Batch}}``, what each core receives (`replay_rank`'s ``received``).
    Raises what the runtime raises (a policy breaking its contract is a local error: ProtocolError),
    and RuntimeError past `max_rounds` (a hang guard).
    """
    n = len(shards)
    if deal is not None and any(len(s) for s in shards):
        raise ValueError("with deal=..., pass N empty shards")
    setting = _Setting(n, settings, deal, aheads, share_deals)
    pool_size = setting.lanes
    one = pool_size > 1 and not replicas  # one core per pool
    lane = (lambda r: None) if one else (lambda r: r % pool_size)  # noqa: E731
    cores, pols, orders = map(list, zip(*(setting.core(r, shards[r], lane(r))
                                          for r in range(setting.pools if one else n))))
    layout = setting.layout
    out: list[list[list[int] | None]] = [[] for _ in range(n)]
    res = SimResult(out, 0, [[] for _ in range(n)], infos=[[] for _ in range(n)] if infos else None,
                    first_wait=[None] * n)
    ranks_of = (lambda r: range(r * pool_size, (r + 1) * pool_size)) if one else (lambda r: (r,))  # noqa: E731

    def waited(r: int) -> None:  # the samples core r had read when each of its ranks released its first batch
        for q in ranks_of(r):
            if res.first_wait[q] is None and out[q]:
                res.first_wait[q] = cores[r].source.pulled

    ok = lambda: 0  # noqa: E731 - a simulated rank never stops on its own
    while True:
        before = [p.seconds for p in pols]
        posts: list = [None] * len(cores)
        for r, c in enumerate(cores):  # the last round's EMIT rows, then this round's FILL rows, to the post
            while not c.waiting and not c.done:
                o = c.advance(ok)
                _take(o, r, out, res, pool_size if one else 0)
                if o.release:
                    waited(r)
                if o.post is not None:
                    posts[r] = o.post
        if all(c.done for c in cores):
            break
        if on_round is not None and on_round(res.rounds, posts):
            break
        res.rounds += 1
        if res.rounds > max_rounds:
            raise RuntimeError(f"simulation did not finish within {max_rounds} rounds")
        g = reduce_posts(posts)  # decoded once for every rank (each runtime rank decodes its own)
        g = g._replace(rows=layout.decode_all(g.rows))
        moved: dict[int, dict] = {}
        for r, c in enumerate(cores):
            o = c.collect(g)
            _take(o, r, out, res, pool_size if one else 0)
            if o.release:
                waited(r)
            for q, origin, b in o.send:  # the exchange: to the core that runs rank q
                moved.setdefault(q // pool_size if one else q, {})[origin] = b
            res.moved += len(o.send)
        if on_moved is not None:
            on_moved(res.rounds - 1, moved)
        for r, c in enumerate(cores):
            if c.receiving:
                c.receive(moved.pop(r, {}))
        if moved:
            raise ProtocolError(f"the exchange sent batches to cores that expected none: {sorted(moved)}")
        res.targets.append(cores[0].decision.target)
        res.decision_s.extend(p.seconds - b for p, b in zip(pols, before))
    for r, c in enumerate(cores):
        res.unemitted[r] = list(c.stats.unemitted_indices)  # (pooled: PAD, nothing unemitted)
        res.stats.append(c.stats)
        res.reserve_taken.append(orders[r].reserve_taken if orders[r] is not None else 0)
    res.undealt = list(orders[0].undealt()) if orders[0] is not None else []
    return res


def replay_rank(rank: int, rounds: Sequence[tuple[Post, Gathered]], shards: Sequence[Sequence],
                settings: LoaderSettings, *, deal: Sequence | None = None, aheads: Sequence[int] | None = None,
                received: Sequence[Mapping] | None = None) -> list[dict]:
    """One rank alone, fed what `simulate` (same arguments) recorded with ``on_round``: ``rounds[k]`` is
    this rank's round-k `Post` and what that round's collective returned (`Gathered`, the headers as int
    vectors).  What a rank's process spends per round, as it would see it (no other rank's state in the
    process): per round ``{"decode_s", "collect_s", "policy_s", "local_s", "replicated_s", "plan_s"}``: decoding the
    N headers, the WAIT row on them (the replicated decision and the deal, this rank's partition of its
    window and the release of the last round's batches), the policy's part of this round (summarize,
    propose, partition), the EMIT/FILL rows before the post, and the replicated decision alone
    (`Replicated.decide`, inside the WAIT row: what reads the N headers), and ``plan_s``, the round exchange's
    plan (inside the WAIT row; 0 without the exchange).  Raises ProtocolError if
    this rank posts other than the recorded post (the replay is not the recorded run); a recorded post
    with counts None has its header checked only.  Pooled (``placement=odb.Pooled(G)``): the rank is lane
    ``rank mod G`` of its pool, a replica as the runtime runs it.  With the round exchange (as `simulate`
    ran it) ``received[k]``, by origin slot, the batches
    moved into this rank's core (or its pool's) after round k's collect, as ``(positions, indices, sizes,
    counts)`` (`simulate`'s ``on_moved``): this rank is handed the ones it expects (``receive_s``, in
    ``collect_s``); ProtocolError if one is not there."""
    # one replica alone, as the runtime's (no deal shared with other replicas: `DealtOrder`'s shared_deals None)
    setting = _Setting(len(shards), settings, deal, aheads, share_deals=False)
    core, pol, _ = setting.core(rank, shards[rank], rank % setting.lanes, replica=_TimedReplicated)
    rep = core.replica
    ok = lambda: 0  # noqa: E731
    out = []
    for k, (mine, g) in enumerate(rounds):
        before, before_rep, before_plan, t0 = pol.seconds, rep.seconds, core.stats.exchange_plan_s, time.perf_counter()
        post = None
        while not core.waiting and not core.done:
            o = core.advance(ok)
            post = o.post if o.post is not None else post
        t1 = time.perf_counter()
        if post is None or list(post.header) != list(mine.header) or \
                (mine.counts is not None and list(post.counts) != list(mine.counts)):
            raise ProtocolError(f"replay of rank {rank}: round {k}'s post differs from the recorded one")
        rows = setting.layout.decode_all(g.rows)
        t2 = time.perf_counter()
        o = core.collect(g._replace(rows=rows))
        err = o.local_error or o.replicated_error or o.abort_error
        if err is not None:
            raise err
        t3 = t4 = t5 = time.perf_counter()
        if core.receiving:  # the exchange: what the transport hands over, as recorded (a new Batch each pass,
            # built outside the timed parts)
            got = received[k] if received is not None else {}
            missing = [s for _, s in o.expect if s not in got]
            if missing:
                raise ProtocolError(f"replay of rank {rank}: round {k} expects slots {missing} the recording lacks")
            batches = {s: Batch([None] * len(got[s][0]), *map(tuple, got[s])) for _, s in o.expect}
            t4 = time.perf_counter()
            core.receive(batches)
            t5 = time.perf_counter()
        out.append({"decode_s": t2 - t1, "collect_s": t3 - t2 + t5 - t4, "policy_s": pol.seconds - before,
                    "local_s": t1 - t0, "replicated_s": rep.seconds - before_rep, "receive_s": t5 - t4,
                    "plan_s": core.stats.exchange_plan_s - before_plan})
    return out


def _take(o, r: int, out: list, res: SimResult, lanes: int = 0) -> None:
    """Core r's released batches into ``out`` (``lanes``: core r is pool r's one core, its batches go to
    the rank of their lane)."""
    err = o.local_error or o.replicated_error or o.abort_error
    if err is not None:
        raise err
    for b in o.release:
        q = r * lanes + b.lane if lanes else r
        out[q].append(None if b.filler else list(b.positions))
        if res.infos is not None:
            res.infos[q].append(b.info)

