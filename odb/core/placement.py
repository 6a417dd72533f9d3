"""Placement: where each batch a rank core forms runs, and which loss counts its rank posts for it.

Legend
    N, G, P   ranks in the loader's group, ranks per pool (``Pooled(G)``), pools (``P = N / G``);
              pool p holds the ranks ``p G .. p G + G - 1`` (consecutive ranks: under torchrun, a host's)
    lane j    the j-th rank of its pool (``rank mod G``); without pooling G = 1 and every rank is lane 0
    k         a batch's index in its round as formed (decreasing fill, `odb.batching.policy` rule 5)
    lag       collectives between a batch's forming and its release: 2 (formed in round r, counts posted in
              r + 1's header) or 3 with the exchange (placed after r + 1, counts posted in r + 2's)

The user chooses it with one setting, ``placement=``: ``"auto"`` (the default: `resolve_placement`, the exchange
on two ranks or more where it can run), None, `Pooled` or `Exchanged` (values, compared across ranks as resolved).
Each pass then holds one stage, chosen once by the header layout (`stage_for`):

    `OwnStage`       ``placement=None``: batch k runs on the rank that formed it, at step k of the round.
    `PoolStage`      `Pooled(G)`, pooled windows (G > 1): the G ranks of a pool run one window of G W samples as
                 replicas of one core (dealt sharding deals to the P pools; each rank preprocesses every sample
                 of its pool; no sample moves between processes).  Pool batch k goes to lane ``k mod G`` as its
                 step ``k div G`` (`lane_of`); a lane one short runs a zero-weight filler, so every rank runs
                 ``ceil(T / G)`` steps a round; `lane_proposal` makes T a multiple of G wherever the table allows.
                 Only pools align through the round collective: `pool_rows` turns the N gathered headers into
                 the P rows the table reads, and a pool whose lanes posted different headers stops every rank
                 (`ProtocolError`) before any batch the diverged replicas placed is released.
    `ExchangeStage`  `Exchanged(pool=G, slack=s)`, the round exchange (`odb.batching.exchange`; with or without
                 pools): round r's batches are
                 held as formed, their fills posted in round r + 1's header; its collect plans, from the
                 gathered fills only, which rank runs which batch at which step; the core's driver moves them
                 (`Out.send`, `Out.expect`, `RankCore.receive`); their counts go into round r + 2's header.
                 The pass's last round is planned at the first stop, which the table sends through one more
                 round (``return_flush``, cfg ``xchg = 1``).  A batch's counts are posted once, where it runs.

The core calls, each round: `hold` for every batch it forms, in order (EMIT and filler rows); `posted` at its
post (the header's fills and the counts); `rows` on the collect (the gathered headers as the table's
participants); `release` after the replicated decision (the batches whose global counts this collective
returned, and with the exchange the plan of the round before); `drop` when the epoch ends without them.  A
stage never calls back into the core: it is handed a filler factory.  Each lane posts the counts of its own
batches only, at its own step index, so their sum over the N ranks is each step's global count.

A rank's counters (``loader.stats``) count its pool's samples and batches under pooling, so each of a pool's
ranks reports the same; its steps, samples and tokens are its own batches'.  Cost against the gain:
``docs/decisions/2026-12-02-pooled-windows.md`` (each rank preprocesses G times the samples it trains on and
holds G W of them), ``docs/decisions/2026-12-05-exchange-design.md``.  Pure: no torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from ..batching.exchange import NO_FILL, batch_key, plan_origins, rank_fill_array, runs_on
from ..errors import ConfigError, ProtocolError
from ..protocol.table import JOIN
from .header import Header, HeaderLayout, Headers
from .types import Batch, counts_at, put_counts

__all__ = ["Pooled", "Exchanged", "AUTO", "DEFAULT_EXCHANGE", "placement_of", "placement_label", "resolve_placement",
           "OwnStage", "PoolStage", "ExchangeStage", "Release", "stage_for", "check_pool", "pool_rows", "pool_aheads",
           "lane_of", "lane_proposal", "lane_steps"]


def _int_at_least_1(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{name}={v!r} is not valid: it must be an int >= 1 (ranks sharing one window, e.g. a "
                          "host's)")


@dataclass(frozen=True)
class Pooled:
    """``placement=odb.Pooled(size)``: pooled windows.  The `size` consecutive ranks of a pool (a host's, under
    torchrun) run one window of ``size * buffer_size`` samples and split its batches; each preprocesses every
    sample of its pool (``size`` times the preprocessing), no sample moves between processes.  Balances as a
    ``size`` times larger ``buffer_size`` does: raise ``buffer_size`` first.  Needs mode "pad" and dealt sharding,
    deterministic preprocessing (checked every round), and the same ``num_workers`` and prefetch on a pool's ranks.
    """

    size: int

    def __post_init__(self) -> None:
        _int_at_least_1("Pooled size", self.size)

    lanes = property(lambda self: self.size)
    exchange = False
    slack_bp = 0

    def as_dict(self) -> dict:
        return {"kind": "pooled", "size": self.size}


@dataclass(frozen=True)
class Exchanged:
    """``placement=odb.Exchanged(pool=1, slack=0.0)``: the round exchange.  After each round's collective every
    rank computes, from the gathered fills only, which rank runs which of the round's batches, so that one step's
    batches are neighbours in cost on every rank, and moves them point to point (a batch's samples, once).
    ``pool``: with pooled windows of that many ranks (`Pooled`); ``slack``: the share of a round's step time its
    plan may spend balancing the budget cost too, 0 to 0.1.  Needs mode "pad" or "quota" and dealt sharding of a
    map-style dataset.  ``docs/guide/scaling.md`` gives what it buys and costs."""

    pool: int = 1
    slack: float = 0.0

    def __post_init__(self) -> None:
        _int_at_least_1("Exchanged pool", self.pool)
        sl = self.slack
        if isinstance(sl, bool) or not isinstance(sl, (int, float)) or not 0 <= sl <= 0.1:
            raise ConfigError(f"Exchanged slack={sl!r} is not valid: it must be a number from 0 to 0.1")

    lanes = property(lambda self: self.pool)
    exchange = True
    slack_bp = property(lambda self: int(round(self.slack * 10_000)))  # the int every rank compares, the plan reads

    def as_dict(self) -> dict:
        return {"kind": "exchanged", "pool": self.pool, "slack": self.slack}


AUTO = "auto"
# what "auto" resolves to where the exchange can run: at every scale grid point it lifts the straggler efficiency
# of the window alone (0.882-0.987 there) to the targets' side (docs/decisions/2026-12-06-default-placement.md)
DEFAULT_EXCHANGE = Exchanged(pool=1, slack=0.0125)


def resolve_placement(value: "Pooled | Exchanged | str | None", *, world: int, mode: str,
                      sharding: str) -> "Pooled | Exchanged | None":
    """The placement a pass runs: `value` itself, or for ``"auto"`` (the default) `DEFAULT_EXCHANGE` where the
    exchange can run and pays (two ranks or more, mode "pad" or "quota", dealt sharding), else None.  Reads
    only what every rank holds alike (the group's size and compared settings), so every rank resolves alike;
    the construction check compares the result."""
    if value != AUTO:
        return value
    return DEFAULT_EXCHANGE if world >= 2 and mode in ("pad", "quota") and sharding == "dealt" else None


def placement_label(value: "Pooled | Exchanged | str | None") -> str:
    """The ``placement=`` setting as the user wrote it, for messages."""
    if value == AUTO:
        return "placement='auto' (the default)"
    return "placement=None" if value is None else f"placement=odb.{value!r}"


def placement_of(value: Any) -> "Pooled | Exchanged | str | None":
    """The ``placement=`` setting as a value: ``"auto"``, None, a `Pooled` or an `Exchanged`, or the mapping their
    ``as_dict`` gives (the JSON form, what ``odb plan --json`` prints).  ConfigError for anything else."""
    if value is None or value == AUTO or isinstance(value, (Pooled, Exchanged)):
        return value
    if isinstance(value, Mapping):
        kw = dict(value)
        kind = kw.pop("kind", None)
        try:
            if kind == "pooled":
                return Pooled(**kw)
            if kind == "exchanged":
                return Exchanged(**kw)
        except TypeError as e:
            raise ConfigError(f"placement={value!r}: {e}") from None
    raise ConfigError(f"placement={value!r} is not valid: it must be 'auto', None, odb.Pooled(size), "
                      "odb.Exchanged(pool=1, slack=0.0), or the mapping their as_dict() gives")


class Release(NamedTuple):
    """What a stage releases on a collect: ``(step index in its round, batch)`` pairs, in step order, the lag
    of their round (legend), and with the exchange this core's sends and expected slots (`RankCore.Out`)."""

    batches: list
    lag: int
    send: tuple = ()
    expect: tuple = ()


class OwnStage:
    """``placement=None``: every batch runs where it was formed (module docstring)."""

    lanes = 1
    own_lane = 0   # the lane whose batches count a step's global figures once (`RankCore._hand`)
    pending = None  # no transfer owed
    trace: dict = {}

    def __init__(self, layout: HeaderLayout, rank: int):
        self.layout, self.rank = layout, rank
        self._held: list[Batch] = []
        self._counts = [0] * layout.counts_len

    def hold(self, b: Batch, sizes: list | None) -> None:
        """Batch `b` formed next in the round (`sizes`: its samples' sizes; None for a filler)."""
        k = len(self._held)
        self._held.append(b)
        put_counts(self._counts, k, b.counts)

    def posted(self) -> tuple[Sequence[int], list[int]]:
        """The header's fills and the round's counts at the post; the counts start again."""
        counts, self._counts = self._counts, [0] * self.layout.counts_len
        return (), counts

    def rows(self, gathered, round_index: int) -> Headers:
        """The table's rows from the collective's gathered headers (an int array, vectors or `Headers`)."""
        return self.layout.decode_all(gathered)

    def release(self, final: bool, rows: Headers, target: int) -> Release:
        """The batches whose global counts this collective returned: the round before's."""
        held, self._held = self._held, []
        return Release(list(enumerate(held)), 2)

    def drop(self) -> None:
        """The epoch ends without the batches held (an abort, a replicated error)."""
        self._held = []

    def who(self, r: int) -> str:
        """A participant of the table's rows, named for an error."""
        return f"rank {r}"


class PoolStage(OwnStage):
    """Pooled windows, G > 1 (module docstring).  ``lane`` None (a simulation only): the pool's one core
    releases every lane's batches (`Batch.lane`), posts their counts summed, and reads the P pool rows."""

    def __init__(self, layout: HeaderLayout, rank: int, lane: int | None, filler: Callable[[int], Batch]):
        super().__init__(layout, rank)
        self.lanes, self.lane, self._filler = layout.lanes, lane, filler
        self.own_lane = lane or 0

    def hold(self, b: Batch, sizes: list | None) -> None:
        k = len(self._held)
        self._held.append(b)
        lane, m = lane_of(k, self.lanes)
        if self.lane is None:  # the pool's one core: every lane's counts, summed
            put_counts(self._counts, m, [a + c for a, c in zip(counts_at(self._counts, m), b.counts)])
        elif lane == self.lane:  # this lane's own batches, at its own step index
            put_counts(self._counts, m, b.counts)

    def rows(self, gathered, round_index: int) -> Headers:
        return self._pool_rows(gathered, round_index, None)

    def _pool_rows(self, gathered, round_index: int, fills_read: int | None) -> Headers:
        """The N ranks' headers as the P pools' (`pool_rows`); the pool's one core gathers the P rows as they are."""
        rows = self.layout.decode_all(gathered)
        return rows if self.lane is None else pool_rows(rows, self.lanes, round_index, fills_read)

    def release(self, final: bool, rows: Headers, target: int) -> Release:
        held, self._held = self._held, []
        return Release(self._lanes(held), 2)

    def _lanes(self, held: list[Batch]) -> list[tuple[int, Batch]]:
        """(step index in the round, batch) of this lane's batches of the round in step order (every lane's,
        lane by lane, when ``lane`` is None): pool batch k is lane ``k mod G``'s step ``k div G``, and a lane
        one short runs a zero-weight filler."""
        steps = lane_steps(len(held), self.lanes)
        out = []
        for j in (range(self.lanes) if self.lane is None else (self.lane,)):
            mine = held[j::self.lanes]
            for m, b in enumerate(mine):
                b.lane = j
                out.append((m, b))
            out += [(m, self._filler(j)) for m in range(len(mine), steps)]
        return out

    def who(self, r: int) -> str:
        G = self.lanes
        return f"rank {r}" if G == 1 else f"a rank of pool {r} (ranks {r * G}..{r * G + G - 1})"


class ExchangeStage(PoolStage):
    """The round exchange, pooled or not (module docstring).  ``attention``: the policy's, for the fills
    posted (`odb.batching.exchange.batch_key`); the layout's ``slack`` its budget balance."""

    def __init__(self, layout: HeaderLayout, rank: int, lane: int | None, filler: Callable[[int], Batch], *,
                 cost, attention: float, stats, cfg: dict, mode: int, dealt: bool):
        if cfg.get("xchg") != 1:
            raise ConfigError("a layout with the round exchange needs the table's flush round (cfg xchg = 1, "
                              "`Shared.exchange`): without it the pass's last round could not be exchanged")
        if mode == JOIN or not dealt:
            raise ConfigError("the round exchange needs mode 'pad' or 'quota' (every rank runs the same steps) and "
                              "dealt sharding (a moved batch's positions are in the global order)")
        super().__init__(layout, rank, lane, filler)
        self.cost, self.attention, self.stats, self.slack = cost, float(attention or 0.0), stats, layout.slack
        self._placed: list[tuple[int, Batch]] = []  # the round before's, (step, batch) as placed
        self._fills = [NO_FILL] * layout.window
        self._round_target = 0    # the target of the round whose batches are held
        self.pending: dict | None = None  # the slots a transfer still owes this core
        self._seen: Headers | None = None  # the last collect's rows, and the target it planned (the trace's)
        self._planned: int | None = None

    @property
    def trace(self) -> dict:
        """The collect's trace fields: the gathered fills and the target of the round planned (None: none)."""
        return {"fills": self._seen.fills.tolist(), "planned": self._planned}

    def hold(self, b: Batch, sizes: list | None) -> None:
        k = len(self._held)
        self._held.append(b)  # the counts are posted where the batch is placed (`posted`)
        if sizes is not None:
            self._fills[k] = batch_key(sizes, self.cost, self.attention, self.slack)

    def posted(self) -> tuple[Sequence[int], list[int]]:
        fills, self._fills = self._fills, [NO_FILL] * self.layout.window
        c = self._counts
        for m, b in self._placed:  # the placed round's counts at the steps they run (a pool's one core: summed)
            put_counts(c, m, [a + x for a, x in zip(counts_at(c, m), b.counts)])
        return fills, super().posted()[1]

    def rows(self, gathered, round_index: int) -> Headers:
        self._seen = self._pool_rows(gathered, round_index, self._round_target)
        self._planned = None
        return self._seen

    def release(self, final: bool, rows: Headers, target: int) -> Release:
        """The round placed one collective ago; then, the pass going on, the plan of the round before."""
        if final and self._held:  # the flush round emits nothing: the last round formed was planned
            raise ProtocolError(f"rank {self.rank}: the pass ended with {len(self._held)} batches unplanned; the "
                                "round exchange needs the table's flush round (cfg xchg = 1)")
        placed, self._placed = self._placed, []
        if final:
            return Release(placed, 3)
        send, expect = self._plan(rows)
        self._round_target = target
        return Release(placed, 3, send, expect)

    def drop(self) -> None:
        self._held, self._placed, self.pending, self._planned = [], [], None, None

    def _plan(self, rows: Headers) -> tuple[tuple, tuple]:
        """The exchange of the round before's batches: this core's sends and the slots it expects, from the
        gathered fills only (`exchange_plan`, in its array form `plan_origins`).  A pool's replicas hold every
        batch of their pool, so a batch that moves between two ranks of one pool moves in memory; only batches
        that leave their pool are sent, each by the lane that formed it."""
        t0 = time.perf_counter()
        G, T, held = self.lanes, self._round_target, self._held
        self._planned = T  # the target of the round planned (the conformance check recomputes it)
        if len(held) != T:
            raise ProtocolError(f"rank {self.rank}: {len(held)} batches held for a round of target {T}")
        self._held = []
        plan, dest = _round_plan(rows, G, T, self.slack)  # origin r * S + k, -1: filler
        S = plan.shape[1]
        pool = self.rank if self.lane is None else self.rank // G
        home = range(pool * G, pool * G + G)  # the pool's ranks
        own = list(home) if self.lane is None else [self.rank]  # the ranks whose batches this core releases
        send, kept = [], {}
        for k, b in enumerate(held):
            if b.filler:
                continue  # fillers never move
            j, m = lane_of(k, G)
            origin = (pool * G + j, m)
            q = int(dest[origin[0] * S + m])
            if q < 0:  # its fill was posted as a filler's: the plan has no place for it (a broken invariant)
                raise ProtocolError(f"rank {self.rank}: batch {origin} of the round is not in its plan")
            if q in home:
                if q in own:
                    kept[origin] = b
            elif self.lane is None or j == self.lane:  # leaves the pool: the lane that formed it sends it
                send.append((q, origin, b))
        plans = {q: [None if o < 0 else divmod(o, S) for o in plan[q].tolist()] for q in own}
        expect = tuple((o[0], o) for q in own for o in plans[q] if o is not None and o[0] not in home)
        self.pending = {"rows": [(q - pool * G, plans[q]) for q in own], "kept": kept,
                        "expect": {o for _, o in expect}}
        self.stats.exchange_plan_s += time.perf_counter() - t0
        if not expect:
            self.receive({})
        return tuple(send), expect

    def receive(self, got: dict, lost: bool = False) -> None:
        """The batches this core expected, by origin slot (`RankCore.receive`); ``lost``: a missing one is a
        zero-weight filler (the next round aborts on every rank and releases none of them)."""
        p = self.pending
        if p is None:
            raise ProtocolError(f"rank {self.rank}: RankCore.receive without an exchange pending")
        if lost:
            got = {o: got.get(o) or self._filler(0) for o in p["expect"]}
        if set(got) != p["expect"]:
            raise ProtocolError(f"rank {self.rank}: the exchange delivered slots {sorted(got)}, the plan expects "
                                f"{sorted(p['expect'])}")
        placed, kept = [], p["kept"]
        for j, row in p["rows"]:
            for m, o in enumerate(row):
                b = self._filler(j) if o is None else (kept.pop(o) if o in kept else got[o])
                b.lane = j
                placed.append((m, b))
        self._placed, self.pending = placed, None


def stage_for(layout: HeaderLayout, *, rank: int, lane: int | None, filler: Callable[[int], Batch], cost,
              attention: float, stats, cfg: dict, mode: int, dealt: bool) -> OwnStage:
    """The placement stage of a pass: the one place that reads the layout's ``lanes`` and ``exchange``."""
    if layout.exchange:
        return ExchangeStage(layout, rank, lane, filler, cost=cost, attention=attention, stats=stats, cfg=cfg,
                             mode=mode, dealt=dealt)
    if layout.lanes > 1:
        return PoolStage(layout, rank, lane, filler)
    return OwnStage(layout, rank)


# -- pooled windows: the rules every pooled stage and the replicated decision share -------------------------
def check_pool(world_size: int, lanes: int, mode: str, sharding: str, aheads: Sequence[int] = (),
               name: str | None = None) -> None:
    """ConfigError unless `lanes` ranks per pool can run here: they divide the world, PAD mode (every
    lane runs the same steps a round), dealt sharding (the pool's lanes read one dealt order), and the
    lanes of a pool read ahead alike (`aheads`, every rank's prefetch as gathered: a source reads its
    i-th key when its core takes item ``i - ahead``, so a lane that reads further ahead would take a
    reserve position in another round than its pool's other lanes).  `name`: the setting as the user
    passed it (`placement_label`), for the messages; default ``odb.Pooled(lanes)``."""
    name = name or f"odb.Pooled({lanes!r})"
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
        raise ConfigError(f"{name} is not valid: its pool must be an int >= 1 (ranks sharing one window)")
    if lanes == 1:
        return
    if world_size % lanes:
        raise ConfigError(f"{name}: a pool of {lanes} does not divide the {world_size} ranks of the loader's group; "
                          "use the ranks per host (torchrun's --nproc-per-node) or 1")
    if mode != "pad":
        raise ConfigError(f"{name}: a pool of {lanes} needs mode='pad' (got {mode!r}): a pool's ranks split each "
                          "round's batches and run zero-weight fillers where the split is uneven")
    if sharding != "dealt":
        raise ConfigError(f"{name}: a pool of {lanes} needs dealt sharding (got {sharding!r}): every rank of a pool "
                          "reads the pool's dealt positions; a sampler or an IterableDataset decides each rank's own")
    for p in range(len(aheads) // lanes):
        mine = list(aheads[p * lanes:(p + 1) * lanes])
        if len(set(mine)) > 1:
            raise ConfigError(f"{name}: ranks {p * lanes}..{p * lanes + lanes - 1} read ahead "
                              f"{mine} samples (num_workers x prefetch_factor); a pool's ranks must read its "
                              "samples in step, so give them the same num_workers and prefetch_factor")


def pool_aheads(aheads: Sequence[int], lanes: int) -> tuple[int, ...]:
    """Each pool's prefetch for the dealer: the largest of its lanes' (gathered at construction)."""
    return tuple(max(aheads[p * lanes:(p + 1) * lanes]) for p in range(len(aheads) // lanes))


# The last round's exchange plan, a pure function of the gathered fills, the lanes, the round's target and the
# slack: keyed by the gathered `Headers`' identity (held here, so it cannot be reused; a round's gathered headers are
# immutable) and those settings.  The simulation's N cores read one `Headers` a round and plan it once, not N times
# (the plan is O(N) a core); in a training process the next round's headers miss.
_LAST_PLAN: list = [None]


def _round_plan(rows: Headers, lanes: int, target: int, slack: int) -> tuple[np.ndarray, np.ndarray]:
    """(`plan_origins` of the round's fills, `runs_on` of it), shared with every core that reads these rows."""
    hit, key = _LAST_PLAN[0], (lanes, target, slack)
    if hit is not None and hit[0] is rows and hit[1] == key:
        return hit[2]
    plan = plan_origins(rank_fill_array(rows.fills, lanes, target), slack)
    out = (plan, runs_on(plan))
    _LAST_PLAN[0] = (rows, key, out)
    return out


def pool_rows(rows: Headers, lanes: int, round_index: int, fills_read: int | None = None) -> Headers:
    """The P pool rows of N gathered headers (module docstring): lane 0's header with the largest stop
    status of its lanes.  ProtocolError, on every rank alike, if a pool's lanes posted different headers
    while none of them stops.  ``fills_read`` (the round exchange): how many of the header's fill slots the
    plan reads (the held round's target; the rest hold `NO_FILL`); only those are compared, with every other
    field: a pool window's G W fills are most of the header (1,024 of 1,087 ints at W = 128, G = 8), and
    comparing them all read 9 MB a round at 1,024 ranks (docs/decisions/2026-12-05-exchange-decision-time.md)."""
    if lanes == 1:
        return rows
    if len(rows) % lanes:
        raise ProtocolError(f"round {round_index}: {len(rows)} headers do not make pools of {lanes}")
    a = rows.array.reshape(len(rows) // lanes, lanes, -1)  # pool, lane, field
    st = a[:, :, rows.layout.index["st"]].max(axis=1)
    live = st == 0
    if live.any():  # a pool none of whose lanes stops: every lane must have posted lane 0's header
        read = a if fills_read is None else a[:, :, :rows.layout._fills + fills_read]
        b = read if live.all() else read[live]  # (every pool runs but at the end: no copy)
        if (b[:, 1:] != b[:, :1]).any():  # one pass; the pool and lane at fault are found only then
            p, j = np.nonzero((b != b[:, :1]).any(axis=2))
            p, j = int(np.flatnonzero(live)[p[0]]), int(j[0])
            h, h0 = rows[p * lanes + j], rows[p * lanes]
            bad = [f for f in Header._fields if getattr(h, f) != getattr(h0, f)]
            raise ProtocolError(
                f"pooled ranks diverged in round {round_index}: rank {p * lanes + j} posted other "
                f"{bad} than rank {p * lanes} of its pool. A pool's ranks must preprocess and measure "
                "its samples alike (deterministic preprocessing, the same length_fn and oversize); "
                "every rank stops in this round. Leave placement at None for preprocessing that is random")
    at = rows.layout.index["st"]
    if (a[:, 0, at] == st).all():  # lane 0's headers are the pools' as they are: a view, not a copy of the
        return Headers(rows.layout, a[:, 0])  # unread fill slots (most of a pooled header, cold from the gather)
    out = a[:, 0].copy()
    out[:, at] = st
    return Headers(rows.layout, out)


def lane_proposal(proposal: int, lanes: int, hi: int) -> int:
    """The round's proposal as a multiple of `lanes` (the nearest, ties up, at least `lanes`), within the
    table's upper bound `hi` (the pool window, itself a multiple): a replicated decision that reads the
    policy's proposal and the compared pool size only."""
    if lanes == 1:
        return proposal
    return min(hi, lanes * max(1, (2 * proposal + lanes) // (2 * lanes)))


def lane_of(k: int, lanes: int) -> tuple[int, int]:
    """(lane, its step in the round) of pool batch `k`."""
    return k % lanes, k // lanes


def lane_steps(batches: int, lanes: int) -> int:
    """Steps every lane runs in a round of `batches` pool batches."""
    return -(-batches // lanes)
