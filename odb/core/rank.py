"""`RankCore`: one rank's protocol state around the table, for one pass; pure (no torch, no threads).

Legend
    raw item   what the data source returns: ``(position, index, sample, measure)``, ``measure``
               being ``(sizes, label tokens)``, None (a drop: preprocessing returned None) or a
               `Failure` (the exception of preprocessing or measurement, with the index)
    usable     a raw item with sizes, a non-zero length and, unless ``oversize="alone"``, within
               the budget; only usable items reach the table (``take_sample``)
    status     the table's input ``in.quit``: OK, CLOSED (the consumer stopped), FAILED (a local
               error); the first non-OK value stays
    `Out`      what one step leaves for the driver: the fired row, a header to post, batches to
               release (with their `StepInfo`), the end of this rank's batches (JOIN), errors

A driver (the runtime's engine thread, `odb.core.sim`) repeats: in WAIT, run the round's collective
on every rank's `odb.core.header.Post` and call `collect(gathered)`; otherwise call `step(status)`.
The core fires exactly one table row per call (`odb.protocol.machine.step`) and never calls back
into its driver: the data source is an object it reads (``next``, ``pulled``, ``dry``,
``remaining``), the status a function it reads, and every effect is in the returned `Out`.  The
round's replicated decision is `odb.core.replica.Replicated.decide`; the header layout
`odb.core.header`.

Exact loss scaling: the batches of round r are held until the collective of round r + 1 (or the
final stop) returns every rank's counts for them, then released with their global counts.

The round exchange (a layout with ``exchange``; `odb.batching.exchange`): round r's batches are held as
formed, their fills posted in round r + 1's header.  When that collective returns, every rank computes the
same `exchange_plan` from the gathered fills, and the core hands its driver the batches to send
(`Out.send`) and the slots it expects (`Out.expect`); the driver moves them and calls `receive` before the
core's next step.  The placed batches' counts go into round r + 2's header, at the steps they run, and they
are released when that collective returns.  The pass's last round is planned at the first stop, which the
table then sends through one more round (``return_flush``, cfg ``xchg = 1``, which an exchanging core
requires): its collective carries that round's counts.  A batch's counts are posted once, where it runs.
"""

from __future__ import annotations

import time
from itertools import chain, compress
from operator import attrgetter, itemgetter
from typing import Any, Callable, NamedTuple, Sequence

from ..batching.base import call_partition, check_partition, summaries_for
from ..batching.deal import policy_intake, sample_cost
from ..batching.exchange import NO_FILL, batch_key, plan_origins, rank_fill_array, runs_on
from ..errors import ConfigError, ProtocolError, RankFailure, SampleError
from ..protocol import machine
from ..protocol.table import DGAP, DONE, JOIN, QUOTA, WAIT
from .header import REPLICATED, Gathered, HeaderLayout, Headers, Post
from .info import LoaderStats, step_info
from .pool import lane_of, lane_steps, pool_rows
from .replica import Replicated

__all__ = ["RankCore", "Out", "Batch", "Item", "Failure", "Interrupted", "OK", "CLOSED", "FAILED", "NO_LABELS_AFTER"]

OK, CLOSED, FAILED = 0, 1, 2
_STATUS = {CLOSED: "stopped iterating (close(), a break out of the loop, or garbage collection)",
           FAILED: "failed with a local error (its own exception says which)"}
# loss_basis="label_tokens": when this many real samples (every rank's, from the gathered counts)
# have been released in an epoch and not one label token among them, the data carries no labels
# and every loss_scale would be 0: every rank raises (`RankCore._release`).
NO_LABELS_AFTER = 64


class Interrupted(Exception):
    """Raised by a data source's ``next`` that gave up waiting because the rank must stop."""


class Failure(NamedTuple):
    """An exception raised while preprocessing (``stage="preprocessing"``) or measuring one sample."""

    stage: str
    type: str
    message: str
    tb: str


class Item(NamedTuple):
    """One usable sample in the window."""

    pos: int
    index: Any
    sample: Any
    sizes: tuple
    labels: int


_SIZES = attrgetter("sizes")
_SECOND = itemgetter(1)


class Batch:
    """One batch on its way to the consumer: samples and, once released, their `StepInfo`."""

    __slots__ = ("samples", "positions", "indices", "sizes", "counts", "info", "lane")

    def __init__(self, samples, positions, indices, sizes, counts, info=None, lane=0):
        self.samples, self.positions, self.indices = samples, positions, indices
        self.sizes, self.counts, self.info, self.lane = sizes, counts, info, lane

    @property
    def filler(self) -> bool:
        return self.indices is None


class Out(NamedTuple):
    """What one `RankCore` call leaves for its driver (module docstring)."""

    step: machine.Step | None = None     # the fired row (None: no row fired, take the step again)
    trace: dict | None = None            # the row's extra trace fields
    post: Post | None = None             # SYNC: a header and counts to post to the round's collective
    release: tuple = ()                  # batches with their StepInfo, in step order
    end: bool = False                    # JOIN: this rank emits no more batches (keep driving the core)
    local_error: BaseException | None = None       # this rank only: hand it over now; the status is FAILED
    replicated_error: BaseException | None = None  # every rank alike: hand it over behind `release`
    abort_error: BaseException | None = None       # the epoch ended by another rank's abort
    send: tuple = ()                     # exchange: (rank, origin slot, batch) for the driver to send
    expect: tuple = ()                   # exchange: (rank, origin slot) the driver must hand to `receive`


class RankCore:
    """One rank's side of the protocol for one pass (module docstring).

    :param source: ``next() -> raw item | None`` (None: exhausted; may raise `Interrupted` or any
        error, which becomes this rank's local error), ``pulled`` (raw items returned this pass),
        ``dry`` (dealt sharding: its keys ran dry), ``remaining() -> list | None`` (indices not
        read yet, for QUOTA's count).
    :param template: ``template(fallback)`` returns a sample to build PAD fillers from when the rank has
        seen none within the budget; ``fallback`` is the cheapest over-budget sample it saw (None if none);
        may raise.
    :param oversize: "alone" | "skip" | "error".
    :param loss_slot: the `odb.core.info.LOSS_BASES` slot ``loss_scale`` divides by.
    :param lane: pooled windows (``layout.lanes`` > 1, `odb.core.pool`): this rank's lane in its pool;
        the core is its pool's replica and releases this lane's batches.  None (a simulation only): the
        pool's one core releases every lane's batches (`Batch.lane`), posts their counts summed, and
        reads the P pool headers as gathered.
    :param traced: build each row's trace fields (`Out.trace`: the gathered headers' projections, O(N) a
        round); False (no trace written) leaves `Out.trace` None.
    """

    def __init__(self, *, rank: int, world_size: int, mode: int, policy, cost, replica: Replicated,
                 layout: HeaderLayout, source, oversize: str, loss_slot: int, stats: LoaderStats,
                 template: Callable[[], Any], lane: int | None = 0, traced: bool = True):
        self.rank, self.world_size, self.mode, self.traced = rank, world_size, mode, traced
        self.lanes, self.lane = layout.lanes, lane
        self.policy, self.cost, self.replica, self.layout = policy, cost, replica, layout
        self.source, self.oversize, self.loss_slot, self.stats = source, oversize, loss_slot, stats
        self.W = layout.window
        self.cfg = replica.cfg
        self.deal = replica.order
        self.epoch = replica.epoch
        self.local = machine.initial_local(DGAP, self.cfg)
        self.status = OK
        self._status_fn: Callable[[], int] = lambda: OK
        self._template_fn = template
        self._sample_cost = sample_cost(cost)
        self._cost_taken = 0             # summed cost (x COST_SCALE) of the usable items taken
        self._window: list[Item] = []
        self._groups: list[int] = []
        self._held: list[Batch] = []     # this round's batches, released after the next collective
        self.exchange = layout.exchange
        self._placed: list[tuple[int, Batch]] = []  # exchange: the round before's, (step, batch) as placed
        self._fills = [NO_FILL] * layout.window if self.exchange else ()
        self._round_target = 0           # exchange: the target of the round whose batches are held
        self._planned: int | None = None  # exchange: the target of the round the last collect planned (traced)
        self._pending: dict | None = None  # exchange: the slots a transfer still owes this core
        self._attention = float(getattr(policy, "attention", 0.0) or 0.0) if self.exchange else 0.0
        self._slack = layout.slack  # budget balance (basis points): a compared setting, in the layout
        self._send: tuple = ()
        self._expect: tuple = ()
        if self.exchange and self.cfg.get("xchg") != 1:
            raise ConfigError("a layout with the round exchange needs the table's flush round (cfg xchg = 1, "
                              "`Shared.exchange`): without it the pass's last round could not be exchanged")
        if self.exchange and (mode == JOIN or self.deal is None):
            raise ConfigError("the round exchange needs mode 'pad' or 'quota' (every rank runs the same steps) and "
                              "dealt sharding (a moved batch's positions are in the global order)")
        self._counts = [0] * layout.counts_len
        self._fetched: Item | None = None
        self._prepared: tuple[list[int], list[int]] | None = None
        self._sized: list | None = None  # the window's sizes at this round's post, for its partition
        self._rows: Headers | None = None  # the last collective's headers
        self._totals: Sequence[int] = ()  # and its reduced counts (`Gathered`)
        self._tokens_max: Sequence[int] = ()
        self._decision = None
        self._errors: list[BaseException] = []
        self._posted = 0                 # header collectives entered
        self._steps = 0                  # batches released (StepInfo.step)
        self._template: Any = None       # the cheapest sample within budget seen (fillers replay it)
        self._template_cost = 0
        self._fallback: Any = None       # while none fits: the cheapest over-budget one (the template cuts it)
        self._fallback_cost = 0
        self._labels_seen = self._samples_seen = 0  # gathered, this pass
        self._ended = False

    # -- the driver's calls -------------------------------------------------------
    @property
    def waiting(self) -> bool:
        """In WAIT: the driver must gather every rank's header and call `collect`."""
        return self.local["ph"] == WAIT

    @property
    def done(self) -> bool:
        return self.local["ph"] == DONE

    @property
    def ended(self) -> bool:
        """JOIN: this rank has handed out its last batch (`Out.end` was returned)."""
        return self._ended

    @property
    def receiving(self) -> bool:
        """The exchange: the driver owes this core the batches of `Out.expect` (`receive`)."""
        return self._pending is not None

    @property
    def decision(self):
        """The last collective's `odb.core.replica.Decision` (None before the first)."""
        return self._decision

    @property
    def posted(self) -> int:
        """Header collectives this rank has entered."""
        return self._posted

    def step(self, status: Callable[[], int]) -> Out:
        """Fire one FILL or EMIT row; `status()` is the driver's stop status (read when a row asks)."""
        if self.waiting or self.done:
            raise ProtocolError(f"RankCore.step in phase {self.local['ph']}; use collect() in WAIT")
        if self._pending is not None:
            raise ProtocolError(f"rank {self.rank}: RankCore.step before the exchange's batches were received")
        self._status_fn = status
        self._fetched = None
        try:
            s = machine.step(DGAP, self.local, self._input, self.cfg, self._choose, self._selected)
        except _Restart:  # no row fired (a fetch was interrupted or failed); take the step again
            return Out(local_error=self._take_error())
        return self._effects(s)

    def collect(self, gathered: Gathered) -> Out:
        """Fire the WAIT row on what the round's collective returned: every rank's header in rank order
        (an ``(N, length)`` int array as the transport hands it, int vectors, or the `Headers` a simulation
        decodes once for all its ranks) and the reduced counts.

        Raises what `Replicated.decide` raises (every rank alike: a collective mismatch, a
        divergence, another epoch)."""
        if not self.waiting:
            raise ProtocolError(f"RankCore.collect in phase {self.local['ph']}")
        self._rows = self.layout.decode_all(gathered.rows)
        if self.lane is not None:  # the N ranks' headers -> the P pools' (the rows themselves without pooling)
            self._rows = pool_rows(self._rows, self.lanes, self.replica.round,
                                   self._round_target if self.exchange else None)
        self.layout.check_reduced(gathered)
        self._totals, self._tokens_max = gathered.totals, gathered.tokens_max
        self._decision = self.replica.decide(self._rows)
        s = machine.step(DGAP, self.local, self._decision.inputs, self.cfg, self._choose, self._selected)
        return self._effects(s)

    # -- inputs and choices (read by machine.step) -------------------------------
    def _quit(self) -> int:
        if self.status == OK:
            self.status = int(self._status_fn()) if not self._errors else FAILED
        return self.status

    def _input(self, name: str):
        if name == "quit":
            return self._quit()
        if name == "src_has":
            try:
                self._fetched = self._fetch()
            except Interrupted:
                raise _Restart() from None
            except Exception as e:  # a worker error, a SampleError: local to this rank
                self._fail(e)
                raise _Restart() from None
            return self._fetched is not None
        raise ProtocolError(f"the table asked for input {name!r} outside a collect step")

    def _selected(self, row) -> None:
        """Prepare a ``post`` row's header before its payload reads ``in.quit``: a failure here is
        posted as ``st = FAILED`` in this very header (every rank leaves in this round)."""
        if row.effect.kind != "post":
            return
        # the window's sizes, kept for this round's partition: in WAIT, between this post and the collect, the
        # table fires no row that changes the window; the policy is handed its own copy, so a policy that
        # reorders the list it is handed changes nothing the partition reads
        self._sized = list(map(_SIZES, self._window))
        sizes = self._sized.copy()
        S, lad = self.layout.summary_len, self.layout.ladder_len
        try:
            summary = [int(v) for v in self.policy.summarize(sizes, self.cost, bool(self.local["exhausted"]))]
            if len(summary) != S:
                raise ProtocolError(f"policy summary has {len(summary)} ints, summary_len says {S}")
            intake = [0] * lad if self.deal is None else [int(v) for v in policy_intake(self.policy, sizes, self.cost,
                                                                                            self.W)]
            self._prepared = (summary, intake)
        except Exception as e:
            self._fail(ProtocolError(
                f"rank {self.rank}: the alignment policy {type(self.policy).__name__} failed to summarize its "
                f"window of {len(sizes)} samples in round {self._posted}: {type(e).__name__}: {e}"))
            self._prepared = ([0] * S, [0] * lad)

    def _choose(self, row, choice, lo: int, hi: int, params: dict) -> int:
        if self._quit() != OK:
            return lo  # stopping: the batches are dropped; any value the table allows will do
        if choice.name == "use":
            if lo == 0:
                self._groups = []
                return 0
            target, sizes, self._sized = self._decision.target, self._sized, None
            if sizes is None or len(sizes) != len(self._window):
                raise ProtocolError(f"rank {self.rank}: round {self._posted - 1}'s partition without its post's "
                                    "window (a collect the table fired without a post)")
            try:
                groups = call_partition(self.policy, sizes, target, lo, self.cost,
                                        summaries_for(self.policy, self._rows))
                check_partition(groups, len(sizes), lo, sizes, self.cost)
            except Exception as e:  # a policy bug is local to this rank: stop through the table
                self._fail(ProtocolError(
                    f"alignment policy {type(self.policy).__name__} broke the partition contract in round "
                    f"{self._posted - 1} on rank {self.rank} (target {target}, real {lo}, window "
                    f"{len(sizes)}): {type(e).__name__}: {e}"))
                return lo
            used = list(chain.from_iterable(groups))
            keep = [True] * len(sizes)  # the rest in window order (the partition check refused repeats)
            for p in used:
                keep[p] = False
            self._window = list(map(self._window.__getitem__, used)) + list(compress(self._window, keep))
            self._groups = list(map(len, groups))
            return len(used)
        if choice.name == "take":
            return self._groups.pop(0)
        raise ProtocolError(f"row {row.name} asks for unknown choice {choice.name!r}")

    def _fetch(self) -> Item | None:
        """The next usable sample, or None at the end; drops, empty and skipped oversize samples are
        counted and passed over, so the table only sees usable ones."""
        while True:
            raw = self.source.next()
            if raw is None:
                return None
            pos, index, sample, meas = raw
            if isinstance(meas, Failure):
                what = "preprocessing (the dataset's __getitem__/__iter__)" if meas.stage == "preprocessing" \
                    else "measuring its length (length_fn / input_ids)"
                raise SampleError(f"rank {self.rank}: dataset index {index} failed in {what}: {meas.type}: "
                                  f"{meas.message}\n--- worker traceback ---\n{meas.tb}")
            if meas is None:
                self.stats.dropped += 1
                continue
            sizes, labels = meas
            if sizes[0] == 0:
                self.stats.empty += 1
                continue
            fits = self.cost.fits([sizes])
            if not fits:
                self.stats.oversize += 1
                use = self.cost.utilisation([sizes])
                if not self.stats.oversize_worst or use > self.stats.oversize_worst[0]:
                    self.stats.oversize_worst = (use, sizes, index)
                if self.oversize == "error":
                    raise SampleError(
                        f"rank {self.rank}: dataset index {index} has sizes {sizes}, over the budget of cost "
                        f"model {getattr(self.cost, 'name', self.cost)!r}; oversize='error' stops here. Use "
                        "oversize='alone' (a batch of its own) or 'skip' (counted), or raise token_budget")
                if self.oversize == "skip":
                    self.stats.oversize_skipped += 1
                    continue
            c = self._sample_cost(sizes)
            if self.deal is not None:
                self._cost_taken += c
            if fits:  # fillers replay the cheapest sample within budget seen (never an oversize one)
                if self._template is None or c < self._template_cost:
                    self._template, self._template_cost = sample, c
            elif self._template is None and (self._fallback is None or c < self._fallback_cost):
                self._fallback, self._fallback_cost = sample, c
            return Item(pos, index, sample, sizes, labels)

    # -- effects ----------------------------------------------------------------------
    def _effects(self, s: machine.Step) -> Out:
        post, release, end, rep_err, abort_err, trace = None, (), False, None, None, {}
        if s.effect == "fetch" and s.inputs.get("src_has"):
            self._window.append(self._fetched)
        elif s.effect == "post":
            post, trace = self._post(s)
        elif s.effect == "collect":
            release, rep_err, trace = self._after_collect(s)
        elif s.effect == "emit":
            taken, self._window = self._window[:s.count], self._window[s.count:]
            self._hold(taken)
        elif s.effect == "filler":
            self._hold(None)
        if len(self._window) != s.after["buf"]:
            raise ProtocolError(f"rank core window holds {len(self._window)} samples, the table says "
                                f"buf={s.after['buf']} after {s.row}")
        self.local = s.after
        if not self.traced:
            trace = None
        if s.row == "return_go" and self.mode == JOIN and self.local["buf"] == 0 and self.local["exhausted"] and not self._ended:
            end = self._ended = True  # nothing held, the source exhausted: no more batches (JOIN keeps posting)
        if self.done and self.local["aborted"] and self.status == OK:
            abort_err = self._abort_error(self.local["rd"] - 1)
        send, expect, self._send, self._expect = self._send, self._expect, (), ()
        return Out(s, trace, post, release, end, self._take_error(), rep_err, abort_err, send, expect)

    def _filler(self, lane: int = 0) -> Batch:
        if self._template is None and self._quit() == OK:
            try:
                self._template = self._template_fn(self._fallback)
            except Exception as e:  # no sample to build a filler from: stop through the table
                self._fail(e)
        return Batch([self._template], (), None, (), (0, 0, 0), lane=lane)

    def _hold(self, taken: list[Item] | None) -> None:
        k = len(self._held)
        if taken is None:
            b = self._filler()
        else:
            sizes = tuple(it.sizes[0] for it in taken)
            b = Batch([it.sample for it in taken], tuple(it.pos for it in taken), tuple(it.index for it in taken),
                      sizes, (sum(sizes), sum(it.labels for it in taken), len(taken)))
            self.stats.budget_use_sum += self.cost.utilisation([it.sizes for it in taken])
            self.stats.budget_batches += 1
        self._held.append(b)
        lane, m = lane_of(k, self.lanes)
        if self.exchange:  # the fill for the plan; the counts are posted where the batch is placed (`_post`)
            if taken is not None:
                self._fills[k] = batch_key([it.sizes for it in taken], self.cost, self._attention, self._slack)
            return
        if self.lane is None:  # the pool's one core (a simulation): every lane's counts, summed
            self._counts[3 * m:3 * m + 3] = [a + c for a, c in zip(self._counts[3 * m:3 * m + 3], b.counts)]
        elif lane == self.lane:  # this lane's own batches, at its own step index
            self._counts[3 * m:3 * m + 3] = b.counts

    def _post(self, s: machine.Step) -> tuple[Post, dict]:
        if s.payload["shape"] != self.layout.length:
            raise ProtocolError(f"table header shape {s.payload['shape']} != the layout's {self.layout.length}")
        summary, intake = self._prepared
        self._prepared = None
        digest = self.replica.digest()
        fills = self._fills
        if self.exchange:
            self._fills = [NO_FILL] * self.layout.window
            c = self._counts
            for m, b in self._placed:  # the placed round's counts at the steps they run (a pool's one core: summed)
                c[3 * m:3 * m + 3] = [a + x for a, x in zip(c[3 * m:3 * m + 3], b.counts)]
        header = self.layout.encode(
            st=s.payload["st"], round=self._posted, n=s.payload["n"], epoch=self.epoch, digest=digest,
            summary=summary, taken=self.source.pulled, cost=self._cost_taken, dry=int(self.source.dry),
            reserve=0 if self.deal is None else self.deal.reserve_taken, intake=intake, fills=fills)
        counts, self._counts = self._counts, [0] * self.layout.counts_len
        self._posted += 1
        trace = {"round": self._posted - 1, "summary": summary, "replicated": [self.epoch, *digest]}
        if self.exchange and self.traced:
            trace["fills"] = list(fills)
        return Post(header, counts), trace

    def _after_collect(self, s: machine.Step) -> tuple[tuple, BaseException | None, dict | None]:
        rows, rnd = self._rows, self._posted - 1
        self.stats.rounds += 1
        release, rep_err, self._planned = (), None, None
        if s.row == "return_abort":
            self._held = []  # the epoch ends here on every rank: the last round's batches are not released
            self._placed = []
        else:
            release, rep_err = self._release(final=s.after["ph"] == DONE)
        if s.row == "return_stop" and self.mode == QUOTA:
            self._count_unemitted()
        if not self.traced:
            return release, rep_err, None
        return release, rep_err, {"round": rnd, "collective": {
            "headers": [{"st": st, "n": n, "shape": self.layout.length}
                        for st, n in zip(rows.values("st"), rows.values("n"))],
            "summaries": [list(h) for h in rows.summaries], "rounds": rows.values("round"),
            "replicated": [list(v) for v in zip(*map(rows.values, REPLICATED))],
            "inputs": dict(self._decision.inputs),
            **({"fills": rows.fills.tolist(), "planned": self._planned} if self.exchange else {})}}

    def _release(self, final: bool) -> tuple[tuple, BaseException | None]:
        """The batches whose global counts this collective returned (module docstring): the previous round's,
        or with the exchange the round placed one collective ago, then at the pass's end the previous round's
        as formed; with the exchange and the pass going on, the previous round's batches are planned."""
        if not self.exchange:
            held, self._held = self._lanes(self._held), []
            return self._hand(held, self._totals, self._tokens_max, self._posted - 2, final)
        if final and self._held:  # the flush round emits nothing: the last round formed was planned
            raise ProtocolError(f"rank {self.rank}: the pass ended with {len(self._held)} batches unplanned; the "
                                "round exchange needs the table's flush round (cfg xchg = 1)")
        placed, self._placed = self._placed, []
        out, err = self._hand(placed, self._totals, self._tokens_max, self._posted - 3, final)
        if err is not None:  # every rank stops here (the counts are gathered): nothing more is planned
            self._held = []
            return out, err
        if not final:
            self._plan()
            self._round_target = self._decision.target
        return out, None

    def _plan(self) -> None:
        """The exchange of the previous round's batches (module docstring): this core's sends and the slots it
        expects, from the gathered fills only (`exchange_plan`, in its array form `plan_origins`).  A pool's
        replicas hold every batch of their pool, so a batch that moves between two ranks of one pool moves in
        memory; only batches that leave their pool are sent, each by the lane that formed it."""
        t0 = time.perf_counter()
        G, T, held = self.lanes, self._round_target, self._held
        self._planned = T  # the trace's: the target of the round planned (the conformance check recomputes it)
        if len(held) != T:
            raise ProtocolError(f"rank {self.rank}: {len(held)} batches held for a round of target {T}")
        self._held = []
        plan = plan_origins(rank_fill_array(self._rows.fills, G, T), self._slack)  # origin r * S + k, -1: filler
        S, dest = plan.shape[1], runs_on(plan)
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
        rows = {q: [None if o < 0 else divmod(o, S) for o in plan[q].tolist()] for q in own}
        expect = tuple((o[0], o) for q in own for o in rows[q] if o is not None and o[0] not in home)
        self._send, self._expect = tuple(send), expect
        self._pending = {"rows": [(q - pool * G, rows[q]) for q in own], "kept": kept,
                         "expect": {o for _, o in expect}}
        self.stats.exchange_plan_s += time.perf_counter() - t0
        if not expect:
            self.receive({})

    def receive(self, got: dict, lost: bool = False) -> None:
        """The exchange's batches this core expected (`Out.expect`), by origin slot: the driver calls it once
        after the collect that planned them, before the next `step`.  ProtocolError on a missing or an extra one,
        unless ``lost`` (the transfer failed on the data, and this rank's status is no longer OK: the next round
        aborts on every rank and releases none of them): a missing one is then a zero-weight filler."""
        p = self._pending
        if p is None:
            raise ProtocolError(f"rank {self.rank}: RankCore.receive without an exchange pending")
        if lost:
            if self._quit() == OK:
                raise ProtocolError(f"rank {self.rank}: the exchange lost batches while this rank goes on")
            got = {o: got.get(o) or self._filler() for o in p["expect"]}
        if set(got) != p["expect"]:
            raise ProtocolError(f"rank {self.rank}: the exchange delivered slots {sorted(got)}, the plan expects "
                                f"{sorted(p['expect'])}")
        placed, kept = [], p["kept"]
        for j, row in p["rows"]:
            for m, o in enumerate(row):
                b = self._filler(j) if o is None else (kept.pop(o) if o in kept else got[o])
                b.lane = j
                placed.append((m, b))
        self._placed, self._pending = placed, None

    def _hand(self, held: list, totals: Sequence[int], tokens_max: Sequence[int], rnd: int,
              final: bool) -> tuple[tuple, BaseException | None]:
        """`held` (step index in its round, batch) with the global counts `totals` and `tokens_max`.

        ``loss_basis="label_tokens"``: a step with tokens but no label token on any rank gets
        ``loss_scale = 0`` on every rank (counted in ``stats.zero_label_steps``); once
        `NO_LABELS_AFTER` real samples of this pass (every rank's) were released without one label
        token, or the pass ends so, every rank raises SampleError after the same step."""
        ws, slot = self.world_size, self.loss_slot
        own, epoch, step = self.lane or 0, self.epoch, self._steps
        stats = self.stats  # its running sums in locals, written back once: the same float additions in order
        t_max, t_mean, zero, labels, samples = (stats.step_tokens_max, stats.step_tokens_mean, stats.zero_label_steps,
                                                self._labels_seen, self._samples_seen)
        for k, b in held:
            g = totals[3 * k:3 * k + 3]  # every rank's count b of its k-th batch, summed
            g0, g1, g2 = g
            loc, basis_g, filler = b.counts, g[slot], b.filler
            scale = 0.0 if filler or basis_g == 0 else ws * loc[slot] / basis_g
            if b.lane == own:  # a step's global figures once (the pool's one core: at lane 0)
                if g0 > 0:  # the straggler estimate: the largest rank's tokens against the mean rank's
                    t_max += tokens_max[k]
                    t_mean += g0 / ws
                    if slot == 1 and g1 == 0:
                        zero += 1
                labels += g1
                samples += g2
            b.info = step_info(() if filler else b.indices, filler, loc[2], g2, loc[0], g0, loc[1], g1, scale, step,
                               rnd, epoch)
            step += 1
        stats.step_tokens_max, stats.step_tokens_mean, stats.zero_label_steps = t_max, t_mean, zero
        self._labels_seen, self._samples_seen, self._steps = labels, samples, step
        if self.loss_slot == 1 and self._labels_seen == 0 and self._samples_seen > 0 and (
                self._samples_seen >= NO_LABELS_AFTER or final):
            if self.status == OK:
                self.status = FAILED  # every rank sees the same counts, so every rank stops here
            return (), SampleError(
                f"rank {self.rank}: {self._samples_seen} samples of epoch {self.epoch} (all ranks) hold tokens but "
                "not one label token (labels all -100, or shift_labels=True on one-token labels): with "
                "loss_basis='label_tokens' every loss_scale would be 0 and the model would never change. Give "
                "the samples 'labels', or pass loss_basis='tokens'")
        return tuple(map(_SECOND, held)), None

    def _lanes(self, held: list[Batch]) -> list[tuple[int, Batch]]:
        """(step index in the round, batch) of this lane's batches of the round in step order (every
        lane's, lane by lane, when ``lane`` is None): pool batch k is lane ``k mod G``'s step ``k div G``,
        and a lane one short runs a zero-weight filler (`odb.core.pool`)."""
        if self.lanes == 1:
            return list(enumerate(held))
        steps = lane_steps(len(held), self.lanes)
        out = []
        for j in (range(self.lanes) if self.lane is None else (self.lane,)):
            mine = held[j::self.lanes]
            for m, b in enumerate(mine):
                b.lane = j
                out.append((m, b))
            out += [(m, self._filler(j)) for m in range(len(mine), steps)]
        return out

    def _count_unemitted(self) -> None:
        left = [it.index for it in self._window]
        rest = self.source.remaining()
        if self.deal is not None and self.rank == 0:  # what no rank was dealt: counted once, on rank 0
            rest = (rest or []) + self.deal.undealt()
        self.stats.unemitted += len(left) + (len(rest) if rest else 0)
        self.stats.unemitted_indices.extend(left + (rest or []))

    def _abort_error(self, rnd: int) -> RankFailure:
        bad = [(r, st) for r, st in enumerate(self._rows.values("st")) if st != OK]
        G = self.lanes  # pooled: the rows are the pools' (`odb.core.pool`)
        who = (lambda r: f"rank {r}") if G == 1 else (lambda r: f"a rank of pool {r} (ranks {r * G}..{r * G + G - 1})")
        what = "; ".join(f"{who(r)} {_STATUS.get(st, f'posted status {st}')}" for r, st in bad)
        return RankFailure(
            f"rank {self.rank}: in round {rnd} of epoch {self.epoch}: {what}, while this rank was still iterating; "
            "every rank stopped in that round. Every rank must iterate the loader to the end of the epoch, or all "
            "ranks must stop at the same step (e.g. the same max_steps).")

    def _fail(self, e: BaseException) -> None:
        """A local error: the status becomes FAILED (the table takes every rank to the abort round)."""
        self._errors.append(e)
        if self.status == OK:
            self.status = FAILED

    def _take_error(self) -> BaseException | None:
        errs, self._errors = self._errors, []
        return errs[0] if errs else None


class _Restart(Exception):
    """No row fired inside ``machine.step``: the step is taken again."""
