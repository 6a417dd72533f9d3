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
The core fires exactly one table row per `step` call (`odb.protocol.machine.step`; `advance`, for an untraced
driver, the rows up to the next post in one call, `odb.protocol.machine.run`) and never calls back into its
driver: the data source is an object it reads (``next``, ``pulled``, ``dry``,
``remaining``), the status a function it reads, and every effect is in the returned `Out`.  The
round's replicated decision is `odb.core.replica.Replicated.decide`; the header layout
`odb.core.header`.

Exact loss scaling: the batches of round r are held until the collective of round r + 1 (or the
final stop) returns every rank's counts for them, then released with their global counts.

Placement (`odb.core.placement`): where each formed batch runs, and which counts this rank posts for
it, is one stage the core holds (`OwnStage`, `PoolStage`, `ExchangeStage`, chosen by the header layout); the core
hands it every batch it forms, posts what it returns, and releases what it releases.  With the round exchange the
collect also returns the batches to send (`Out.send`) and the slots expected (`Out.expect`): the driver moves
them and calls `receive` before the core's next step.
"""

from __future__ import annotations

from itertools import chain, compress
from operator import attrgetter, itemgetter
from typing import Any, Callable, NamedTuple, Sequence

from ..batching.base import check_partition, summaries_for
from ..batching.intake import policy_intake, sample_cost, sample_fits
from ..errors import ProtocolError, RankFailure, SampleError
from ..protocol import machine
from ..protocol.table import DGAP, DONE, JOIN, QUOTA, WAIT
from .fingerprint import content_digest, equal_groups
from .header import REPLICATED, Gathered, HeaderLayout, Headers, Post
from .info import LoaderStats, step_info
from .placement import stage_for
from .replica import Replicated
from .types import CLOSED, FAILED, NO_COUNTS, OK, Batch, Counts, Failure, FillerContent, Interrupted, Item, counts_at

__all__ = ["RankCore", "Out", "NO_LABELS_AFTER"]

_STATUS = {CLOSED: "stopped iterating (close(), a break out of the loop, or garbage collection)",
           FAILED: "failed with a local error (its own exception says which)"}
# loss_basis="label_tokens": when this many real samples (every rank's, from the gathered counts)
# have been released in an epoch and not one label token among them, the data carries no labels
# and every loss_scale would be 0: every rank raises (`RankCore._release`).
NO_LABELS_AFTER = 64
# `start_digest`: the first samples of a rank's window compared across ranks.  4: two ranks of a stream split by
# rank that start with the same 4 samples are all but impossible with real data; a stream not split by rank
# starts alike on every rank.
START_SAMPLES = 4


_SIZES = attrgetter("sizes")
_UNTIL = frozenset({"post"})  # `advance` ends at the row that posts
_SECOND = itemgetter(1)


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
        ``remaining() -> list | None`` (indices not read yet, for QUOTA's count), and of the dealt
        order (`odb.batching.dealt_order.DealtOrder`, which the core never reads itself): ``dry`` (its keys
        ran dry), ``reserve_taken`` and ``undealt()`` (0 and [] for fixed shards).
    :param template: ``template(fallback)`` returns a sample to build PAD fillers from when the rank has
        seen none within the budget; ``fallback`` is the cheapest over-budget sample it saw (None if none);
        may raise.
    :param oversize: "alone" | "skip" | "error".
    :param loss_slot: the `odb.core.info.LOSS_BASES` slot ``loss_scale`` divides by.
    :param lane: pooled windows (``layout.lanes`` > 1, `odb.core.placement.PoolStage`): this rank's lane in its
        pool; the core is its pool's replica and releases this lane's batches.  None (a simulation only): the
        pool's one core releases every lane's batches (`Batch.lane`).
    :param traced: build each row's trace fields (`Out.trace`: the gathered headers' projections, O(N) a
        round); False (no trace written) leaves `Out.trace` None.
    :param start_digest: the rank's samples come from a stream or a sampler, not the loader's own order (whose
        positions are disjoint by construction): round 0's header posts, in its ``cost`` field (dealt sharding's
        only), a `odb.core.fingerprint.content_digest` of the window's first `START_SAMPLES` samples, and the
        ranks that posted the same one are recorded in ``stats.same_start`` (the loader warns: each trains the
        others' samples).
    """

    def __init__(self, *, rank: int, world_size: int, mode: int, policy, cost, replica: Replicated,
                 layout: HeaderLayout, source, oversize: str, loss_slot: int, stats: LoaderStats,
                 template: Callable[[], Any], lane: int | None = 0, traced: bool = True, start_digest: bool = False):
        self.rank, self.world_size, self.mode, self.traced = rank, world_size, mode, traced
        self.start_digest = start_digest and replica.order is None
        self.policy, self.cost, self.replica, self.layout = policy, cost, replica, layout
        self.source, self.oversize, self.loss_slot, self.stats = source, oversize, loss_slot, stats
        self.W = layout.window
        self.cfg = replica.cfg
        self.dealt = replica.order is not None  # the deal itself: read by the source, advanced by the replica
        self.epoch = replica.epoch
        self.local = machine.initial_local(DGAP, self.cfg)
        self.status = OK
        self._status_fn: Callable[[], int] = lambda: OK
        self.fillers = FillerContent(template)  # what zero-weight fillers replay
        self._sample_cost, self._fits = sample_cost(cost), sample_fits(cost)
        self._cost_taken = 0             # summed cost (x COST_SCALE) of the usable items taken
        self._window: list[Item] = []
        self._groups: list[int] = []
        # where each formed batch runs and which counts this rank posts (`odb.core.placement`)
        self.placement = stage_for(layout, rank=rank, lane=lane, filler=self._filler, cost=cost,
                                   attention=policy.attention, stats=stats, cfg=self.cfg, mode=mode,
                                   dealt=self.dealt)
        self._send: tuple = ()           # the exchange's moves of the last collect, for its `Out`
        self._expect: tuple = ()
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
        return self.placement.pending is not None

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
        if self.placement.pending is not None:
            raise ProtocolError(f"rank {self.rank}: RankCore.step before the exchange's batches were received")
        self._status_fn = status
        self._fetched = None
        try:
            s = machine.step(DGAP, self.local, self._input, self.cfg, self._choose, self._selected)
        except _Restart:  # no row fired (a fetch was interrupted or failed); take the step again
            return Out(local_error=self._take_error())
        return self._effects(s)

    def advance(self, status: Callable[[], int]) -> Out:
        """`step` repeated up to and including the next row that posts: the same rows, in the same order, on the
        same inputs, and one `Out`, the post's (an untraced driver's call: the FILL and EMIT rows before it build
        no `Step` and leave the driver nothing, a local error they raise included: status FAILED, the table
        goes straight to that post, whose `Out` hands the error over)."""
        if self.waiting or self.done:
            raise ProtocolError(f"RankCore.advance in phase {self.local['ph']}; use collect() in WAIT")
        if self.placement.pending is not None:
            raise ProtocolError(f"rank {self.rank}: RankCore.advance before the exchange's batches were received")
        self._status_fn = status
        self._fetched = None
        self.local = local = dict(self.local)  # this run's own copy, updated row by row
        try:
            s = machine.run(DGAP, local, self._input, self.cfg, self._choose, self._selected, self._fired, _UNTIL)
        except _Restart:  # no row fired (a fetch was interrupted or failed); take the step again
            return Out(local_error=self._take_error())
        return self._effects(s)

    def _fired(self, row, inputs, count) -> None:
        """`advance`'s FILL or EMIT row, its updates applied to ``self.local``: `_effects` for it."""
        kind = row.effect.kind
        if kind == "fetch":
            if inputs.get("src_has"):
                self._window.append(self._fetched)
        elif kind == "emit":
            taken, self._window = self._window[:count], self._window[count:]
            self._hold(taken)
        elif kind == "filler":
            self._hold(None)
        if len(self._window) != self.local["buf"]:
            raise ProtocolError(f"rank core window holds {len(self._window)} samples, the table says "
                                f"buf={self.local['buf']} after {row.name}")

    def collect(self, gathered: Gathered) -> Out:
        """Fire the WAIT row on what the round's collective returned: every rank's header in rank order
        (an ``(N, length)`` int array as the transport hands it, int vectors, or the `Headers` a simulation
        decodes once for all its ranks) and the reduced counts.

        Raises what `Replicated.decide` raises (every rank alike: a collective mismatch, a
        divergence, another epoch)."""
        if not self.waiting:
            raise ProtocolError(f"RankCore.collect in phase {self.local['ph']}")
        self._rows = self.placement.rows(gathered.rows, self.replica.round)  # pooled: the P pools' rows
        self.layout.check_reduced(gathered)
        self._totals, self._tokens_max = gathered.totals, gathered.tokens_max
        self._decision = self.replica.decide(self._rows)
        if self.start_digest and self._posted == 1:  # the gathered digests: every rank records the same groups
            self.stats.same_start = equal_groups(self._rows.values("cost"))
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
            intake = [int(v) for v in policy_intake(self.policy, sizes, self.cost, self.W)] if self.dealt \
                else [0] * lad
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
                groups = self.policy.partition(sizes, target, lo, self.cost,
                                               summaries=summaries_for(self.policy, self._rows))
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
            fits = self._fits(sizes)
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
            if self.dealt:
                self._cost_taken += c
            self.fillers.see(sample, c, fits)
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
        if (s.row == "return_go" and self.mode == JOIN and self.local["buf"] == 0 and self.local["exhausted"]
                and not self._ended):
            end = self._ended = True  # nothing held, the source exhausted: no more batches (JOIN keeps posting)
        if self.done and self.local["aborted"] and self.status == OK:
            abort_err = self._abort_error(self.local["rd"] - 1)
        send, expect, self._send, self._expect = self._send, self._expect, (), ()
        return Out(step=s, trace=trace, post=post, release=release, end=end, local_error=self._take_error(),
                   replicated_error=rep_err, abort_error=abort_err, send=send, expect=expect)

    def _filler(self, lane: int = 0) -> Batch:
        if self.fillers.sample is None and self._quit() == OK:
            try:
                self.fillers.build()
            except Exception as e:  # no sample to build a filler from: stop through the table
                self._fail(e)
        return Batch([self.fillers.sample], (), None, (), NO_COUNTS, lane=lane)

    def _hold(self, taken: list[Item] | None) -> None:
        if taken is None:
            self.placement.hold(self._filler(), None)
            return
        sizes = [it.sizes for it in taken]
        tokens = tuple(z[0] for z in sizes)
        b = Batch([it.sample for it in taken], tuple(it.pos for it in taken), tuple(it.index for it in taken),
                  tokens, Counts(sum(tokens), sum(it.labels for it in taken), len(taken)))
        self.stats.budget_use_sum += self.cost.utilisation(sizes)
        self.stats.budget_batches += 1
        self.placement.hold(b, sizes)

    def _post(self, s: machine.Step) -> tuple[Post, dict]:
        if s.payload["shape"] != self.layout.length:
            raise ProtocolError(f"table header shape {s.payload['shape']} != the layout's {self.layout.length}")
        summary, intake = self._prepared
        self._prepared = None
        digest = self.replica.digest()
        fills, counts = self.placement.posted()
        cost = self._cost_taken
        if self.start_digest and self._posted == 0 and self._window:
            cost = content_digest(it.sample for it in self._window[:START_SAMPLES])
        header = self.layout.encode(
            st=s.payload["st"], round=self._posted, n=s.payload["n"], epoch=self.epoch, digest=digest,
            summary=summary, taken=self.source.pulled, cost=cost, dry=int(self.source.dry),
            reserve=self.source.reserve_taken, intake=intake, fills=fills)
        self._posted += 1
        trace = {"round": self._posted - 1, "summary": summary, "replicated": [self.epoch, *digest]}
        if fills and self.traced:
            trace["fills"] = list(fills)
        return Post(header, counts), trace

    def _after_collect(self, s: machine.Step) -> tuple[tuple, BaseException | None, dict | None]:
        rows, rnd = self._rows, self._posted - 1
        self.stats.rounds += 1
        release, rep_err = (), None
        if s.row == "return_abort":
            self.placement.drop()  # the epoch ends here on every rank: the last round's batches are not released
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
            **self.placement.trace}}

    def _release(self, final: bool) -> tuple[tuple, BaseException | None]:
        """The batches whose global counts this collective returned (`odb.core.placement`: the previous
        round's, or with the exchange the round placed one collective ago), handed with those counts."""
        r = self.placement.release(final, self._rows, self._decision.target)
        out, err = self._hand(r.batches, self._totals, self._tokens_max, self._posted - r.lag, final)
        if err is not None:  # every rank stops here (the counts are gathered): nothing more is placed or moved
            self.placement.drop()
            return out, err
        self._send, self._expect = r.send, r.expect
        return out, None

    def receive(self, got: dict, lost: bool = False) -> None:
        """The exchange's batches this core expected (`Out.expect`), by origin slot: the driver calls it once
        after the collect that planned them, before the next `step`.  ProtocolError on a missing or an extra one,
        unless ``lost`` (the transfer failed on the data, and this rank's status is no longer OK: the next round
        aborts on every rank and releases none of them): a missing one is then a zero-weight filler."""
        if self.placement.pending is None:
            raise ProtocolError(f"rank {self.rank}: RankCore.receive without an exchange pending")
        if lost and self._quit() == OK:
            raise ProtocolError(f"rank {self.rank}: the exchange lost batches while this rank goes on")
        self.placement.receive(got, lost)

    def _hand(self, held: list, totals: Sequence[int], tokens_max: Sequence[int], rnd: int,
              final: bool) -> tuple[tuple, BaseException | None]:
        """`held` (step index in its round, batch) with the global counts `totals` and `tokens_max`.

        ``loss_basis="label_tokens"``: a step with tokens but no label token on any rank gets
        ``loss_scale = 0`` on every rank (counted in ``stats.zero_label_steps``); once
        `NO_LABELS_AFTER` real samples of this pass (every rank's) were released without one label
        token, or the pass ends so, every rank raises SampleError after the same step."""
        ws, slot = self.world_size, self.loss_slot
        own, epoch, step = self.placement.own_lane, self.epoch, self._steps
        stats = self.stats  # its running sums in locals, written back once: the same float additions in order
        t_max, t_mean, zero, labels, samples = (stats.step_tokens_max, stats.step_tokens_mean, stats.zero_label_steps,
                                                self._labels_seen, self._samples_seen)
        for k, b in held:
            g = counts_at(totals, k)  # every rank's counts of its k-th batch, summed
            loc, basis_g, filler = b.counts, g[slot], b.filler
            scale = 0.0 if filler or basis_g == 0 else ws * loc[slot] / basis_g
            if b.lane == own:  # a step's global figures once (the pool's one core: at lane 0)
                if g.tokens > 0:  # the straggler estimate: the largest rank's tokens against the mean rank's
                    t_max += tokens_max[k]
                    t_mean += g.tokens / ws
                    if slot == 1 and g.labels == 0:
                        zero += 1
                labels += g.labels
                samples += g.samples
            b.info = step_info(indices=() if filler else b.indices, filler=filler, local_samples=loc.samples,
                               global_samples=g.samples, local_tokens=loc.tokens, global_tokens=g.tokens,
                               local_label_tokens=loc.labels, global_label_tokens=g.labels, loss_scale=scale,
                               step=step, round=rnd, epoch=epoch)
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

    def _count_unemitted(self) -> None:
        left = [it.index for it in self._window]
        rest = self.source.remaining()
        if self.rank == 0:  # what no rank was dealt: counted once, on rank 0
            rest = (rest or []) + self.source.undealt()
        self.stats.unemitted += len(left) + (len(rest) if rest else 0)
        self.stats.unemitted_indices.extend(left + (rest or []))

    def _abort_error(self, rnd: int) -> RankFailure:
        bad = [(r, st) for r, st in enumerate(self._rows.values("st")) if st != OK]
        who = self.placement.who  # pooled: the rows are the pools'
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
