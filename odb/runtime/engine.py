"""The engine: one rank's background thread that executes the DGAP table for one epoch.

Legend
    N        world size of the loader's gloo group; W the window (``buffer_size``)
    header   one rank's round header, `odb.core.header.HeaderLayout` (named fields:
             the table's payload ``st`` and ``n``, the round index, the epoch and
             the replicated digest, the policy summary, the dealing fields and the
             previous round's per-batch counts)
    quit     the rank's stop status, the table's input ``in.quit``: OK (0);
             CLOSED (1): the consumer stopped iterating (close(), a break, or
             garbage collection); FAILED (2): a local error (a fetch raised, the
             policy broke its contract, no filler template).

Stopping is driven by the table only.  Once ``quit > 0`` the rank fetches
nothing more (the FILL guards read ``quit == 0`` before ``src_has``), finishes
the rows of its current phase (EMIT rows still run; their batches are dropped,
not queued), and its next ``post_header`` posts ``st = quit``.  That
collective's ``max_st > 0`` sends every rank through ``return_abort`` to DONE
in the same round, so no peer is left blocked in a collective.  A rank that
did not stop itself then raises `RankFailure` naming the round and the ranks
that posted a non-zero status; a stopping rank exits quietly (its consumer is
gone, or already holds its local error).  A fetch that raises fires no row: the
error is recorded and handed to the consumer, quit becomes FAILED and the step
is taken again (the table then picks ``post_header``).

One runtime step is one table row: ``machine.step(DGAP, local, inputs, cfg,
choose, selected)``.  ``inputs`` is lazy: ``src_has`` pulls one sample from the
source only when a guard asks; ``ready`` waits (at most ``timeout_s``) for the
round's all-gather, then `odb.core.replica.Replicated.decide` turns the
gathered headers into the collective inputs, the proposal, the target and the
deal (every rank alike).  ``selected`` prepares a ``post`` row's header (the
policy's summary and intake) before the row's payload reads ``in.quit``, so a
failure there is posted as ``st = FAILED`` in that very header.  ``choose``
asks the policy for ``use`` (via ``partition``) and ``take``.  The engine
computes no target, stop or filler count itself.

Dealt sharding: the replica applies each round's deal right after the
collective (`odb.core.replica`); the source reads the rank's keys through the
epoch's `odb.batching.deal.DealtOrder`.  The table is unchanged: a dealt source
is a finite source whose length is decided online.

Exact loss scaling: the batches of round r are held until the collective of
round r+1 (or the final stop round) returns every rank's counts for them,
then released to the consumer with their global counts (one round of
bounded prefetch).
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from datetime import timedelta
from typing import Any, Callable

import torch

from ..batching.base import call_partition, check_partition
from ..batching.deal import intake_ladder, policy_intake, sample_cost
from ..core.header import Header, HeaderLayout
from ..core.replica import Replicated
from ..errors import ProtocolError, RankFailure, SampleError
from ..protocol import machine
from ..protocol.table import DGAP, DONE, JOIN, QUOTA
from .info import LoaderStats, StepInfo
from .source import Interrupted, Item, Source, _Failure
from .trace import TraceWriter

__all__ = ["Engine", "Batch", "OK", "CLOSED", "FAILED", "header_layout", "NO_LABELS_AFTER"]

OK, CLOSED, FAILED = 0, 1, 2
_STATUS = {CLOSED: "stopped iterating (close(), a break out of the loop, or garbage collection)",
           FAILED: "failed with a local error (its own exception says which)"}
# loss_basis="label_tokens": when this many real samples (every rank's, from the gathered counts)
# have been released in an epoch and not one label token among them, the data carries no labels
# and every loss_scale would be 0: every rank raises (see `Engine._release`).
NO_LABELS_AFTER = 64


def header_layout(summary_len: int, W: int) -> HeaderLayout:
    """The header layout of a loader with this policy summary length and window."""
    return HeaderLayout(summary_len, W, len(intake_ladder(W)))


class _Restart(Exception):
    """A fetch raised inside the ``src_has`` input: no row fired; take the step again (quit is now FAILED)."""


class Batch:
    """One batch on its way to the consumer: samples and their StepInfo."""

    __slots__ = ("samples", "positions", "indices", "sizes", "counts", "info")

    def __init__(self, samples, positions, indices, sizes, counts, info=None):
        self.samples, self.positions, self.indices = samples, positions, indices
        self.sizes, self.counts, self.info = sizes, counts, info

    @property
    def filler(self) -> bool:
        return self.indices is None


class Engine:
    """Runs one epoch of the table on this rank in a daemon thread.

    Items on `out`: ``("batch", Batch)``, ``("end", None)`` (no more batches
    for this rank: DONE, or in JOIN the rank has nothing left), ``("error",
    exc)``.  `stop` sets the rank's ``quit`` status: the thread runs the table
    to the next collective, which posts it, and every rank ends there through
    ``return_abort`` (see the module doc).  Bounded: each collective waits at
    most ``timeout_s``.
    """

    def __init__(self, *, group, rank: int, world_size: int, W: int, mode: int, policy, cost,
                 source: Source, oversize: str, loss_slot: int, epoch: int, stats: LoaderStats,
                 timeout_s: float, template: Callable[[], Any], trace: TraceWriter | None,
                 queue_size: int, replica: Replicated, layout: HeaderLayout):
        self.group, self.rank, self.world_size = group, rank, world_size
        self.W, self.mode, self.policy, self.cost = W, mode, policy, cost
        self.layout, self.replica = layout, replica
        self.header_len = layout.length
        self.S, self._lad = layout.summary_len, layout.ladder_len
        self.deal = replica.order
        self._sample_cost = sample_cost(cost)
        self._cost_taken = 0             # summed cost (x COST_SCALE) of the usable items the source returned
        self.cfg = {"W": W, "mode": mode, "header_len": self.header_len}
        self.source, self.oversize, self.loss_slot = source, oversize, loss_slot
        self.epoch, self.stats, self.timeout_s = epoch, stats, timeout_s
        self._template_fn, self.trace = template, trace
        self.out: queue.Queue = queue.Queue(maxsize=queue_size)
        self.error: BaseException | None = None   # the first error of this rank (local or fatal)
        self._quit = OK                  # the table's in.quit; only ever goes from OK to CLOSED/FAILED
        self._window: list[Item] = []
        self._groups: list[int] = []
        self._held: list[Batch] = []     # this round's batches, released after the next collective
        self._counts: list[int] = [0] * (3 * W)
        self._fetched: Item | None = None
        self._local: dict = {}           # the table state of the step being taken
        self._prepared: tuple[list[int], list[int]] | None = None  # (summary, intake) of the next post
        self._coll: dict | None = None
        self._target = 0
        self._gathered: list[Header] | None = None
        self._last: list[Header] = []    # the headers of the last completed collective
        self._work = None
        self._posted = 0                 # header collectives entered
        self._steps = 0                  # batches released (StepInfo.step)
        self._template: Any = None       # the filler template: the cheapest sample within budget seen
        self._template_cost = 0.0
        self._labels_seen = 0            # label tokens released this epoch (every rank's, gathered)
        self._samples_seen = 0           # real samples released this epoch (every rank's, gathered)
        self._ended = False              # "end" was handed to the consumer
        self.thread = threading.Thread(target=self._run, name=f"odb-engine-rank{rank}", daemon=True)

    # -- control ---------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def stop(self, status: int) -> None:
        """Set this rank's quit status (CLOSED or FAILED, what the peers are told); the first one stays."""
        if self._quit == OK:
            self._quit = status

    def join(self, timeout: float | None) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()

    # -- the loop --------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - every error reaches the consumer
            self._fail(e)
        finally:
            self.source.stop()
            if self.trace is not None:
                self.trace.close()

    def _loop(self) -> None:
        local = machine.initial_local(DGAP, self.cfg)
        seq = 0
        while local["ph"] != DONE:
            self._fetched, self._coll, self._gathered, self._local = None, None, None, local
            try:
                s = machine.step(DGAP, local, self._input, self.cfg, self._choose, self._selected)
            except _Restart:
                continue  # no row fired; quit is FAILED now, so the table takes post_header next
            extra = self._apply(s)
            if self.trace is not None:
                self.trace.write({"seq": seq, "row": s.row, "before": s.before, "after": s.after,
                                  "inputs": s.inputs, "params": s.params, "effect": s.effect,
                                  "payload": s.payload, "count": s.count, "table": DGAP.hash, **extra})
            seq += 1
            local = s.after
            if s.row == "return_go" and self.mode == JOIN and local["buf"] == 0 and local["x"] and not self._ended:
                # Nothing held and the source is exhausted: this rank emits no more
                # batches; its iterator ends while this thread keeps posting (JOIN).
                self._ended = True
                self._put(("end", None))
        if local["ab"]:
            self._aborted(local["rd"] - 1)
        elif not self._ended:
            self._put(("end", None))

    def _aborted(self, rnd: int) -> None:
        """The epoch ended by ``return_abort`` in round `rnd`.

        If this rank did not stop itself, its consumer gets a RankFailure after
        the batches already queued; a stopping rank returns quietly (its
        consumer is gone, or already holds its own error).
        """
        if self._quit != OK:
            return
        bad = [(r, h.st) for r, h in enumerate(self._last) if h.st != OK]
        what = "; ".join(f"rank {r} {_STATUS.get(st, f'posted status {st}')}" for r, st in bad)
        err = RankFailure(
            f"rank {self.rank}: in round {rnd} of epoch {self.epoch}: {what}, while this rank was still "
            "iterating; every rank stopped in that round. Every rank must iterate the loader to the end of the "
            "epoch, or all ranks must stop at the same step (e.g. the same max_steps).")
        # The batches already queued were released with their global counts and are valid on every
        # rank, so the error goes BEHIND them: if this rank's consumer also stops at the step where the
        # peer stopped (the same max_steps, a checkpoint-and-break), it never sees the error.
        self.error = err
        if self.trace is not None:
            self.trace.write({"failure": f"{type(err).__name__}: {str(err)[:500]}"})
        self._put(("error", err))

    def _local_error(self, e: BaseException) -> None:
        """Record a rank-local error: hand it to the consumer now and set quit to FAILED.

        The table then takes this rank (and its peers) to the abort round; nothing
        here skips a collective.
        """
        if self.error is None:
            self.error = e
            if self.trace is not None:
                self.trace.write({"local_error": f"{type(e).__name__}: {str(e)[:500]}"})
            self._deliver_error(e)
        self.stop(FAILED)

    def _replicated_error(self, e: BaseException) -> None:
        """An error every rank raises alike (decided from gathered values): queued BEHIND the batches
        already released, so every rank's consumer raises after the same number of batches; quit
        becomes FAILED and the next collective takes every rank out through the abort row."""
        if self.error is None:
            self.error = e
            if self.trace is not None:
                self.trace.write({"local_error": f"{type(e).__name__}: {str(e)[:500]}"})
            self._put(("error", e))
        self.stop(FAILED)

    # -- inputs and choices (called by machine.step) ---------------------------
    def _input(self, name: str):
        if name == "quit":
            return self._quit
        if name == "src_has":
            try:
                self._fetched = self._fetch()
            except Interrupted:  # the consumer stopped while the fetch waited: post the status instead
                raise _Restart() from None
            except Exception as e:  # worker error, SampleError (oversize="error", no length), ...
                self._local_error(e)
                raise _Restart() from None
            return self._fetched is not None
        if self._coll is None:
            self._collect()
        return self._coll[name]

    def _selected(self, row) -> None:
        """`machine.step` has chosen `row`: prepare a ``post`` row's header before its payload reads
        ``in.quit`` (module docstring)."""
        if row.effect.kind != "post":
            return
        sizes = [it.sizes for it in self._window]
        try:
            summary = [int(v) for v in self.policy.summarize(sizes, self.cost, bool(self._local["x"]))]
            if len(summary) != self.S:
                raise ProtocolError(f"policy summary has {len(summary)} ints, summary_len says {self.S}")
            intake = ([0] * self._lad if self.deal is None else
                      [int(v) for v in policy_intake(self.policy, sizes, self.cost, self.W)])
            self._prepared = (summary, intake)
        except Exception as e:
            # Posted as st = FAILED in this header (the payload reads quit after this): every rank
            # leaves through return_abort in this round; the placeholders are never read.
            self._local_error(ProtocolError(
                f"rank {self.rank}: the alignment policy {type(self.policy).__name__} failed to summarize its "
                f"window of {len(sizes)} samples in round {self._posted}: {type(e).__name__}: {e}"))
            self._prepared = ([0] * self.S, [0] * self._lad)

    def _choose(self, row, choice, lo: int, hi: int, params: dict) -> int:
        if self._quit != OK:
            return lo  # stopping: the batches are dropped; any value the table allows will do
        if choice.name == "use":
            real = lo
            if real == 0:
                self._groups = []
                return 0
            target = self._target
            sizes = [it.sizes for it in self._window]
            try:
                groups = call_partition(self.policy, sizes, target, real, self.cost,
                                        [list(h.summary) for h in self._gathered])  # this round's summaries
                check_partition(groups, len(sizes), real, sizes, self.cost)
            except Exception as e:  # a policy bug is local to this rank: stop through the table
                self._local_error(ProtocolError(
                    f"alignment policy {type(self.policy).__name__} broke the partition contract in round "
                    f"{self._posted - 1} on rank {self.rank} (target {target}, real {real}, window "
                    f"{len(sizes)}): {type(e).__name__}: {e}"))
                return lo
            used = [p for g in groups for p in g]
            rest = sorted(set(range(len(sizes))) - set(used))
            self._window = [self._window[p] for p in used] + [self._window[p] for p in rest]
            self._groups = [len(g) for g in groups]
            return len(used)
        if choice.name == "take":
            return self._groups.pop(0)
        raise ProtocolError(f"row {row.name} asks for unknown choice {choice.name!r}")

    # -- the data source --------------------------------------------------------
    def _fetch(self) -> Item | None:
        """The next usable sample, or None when the source is exhausted.

        Drops (None), empty samples and skipped oversize samples are counted
        and passed over here, so the table only ever sees usable samples.
        Raises `Interrupted` when this rank is told to stop while the fetch waits.
        """
        while True:
            raw = self.source.next(stopping=lambda: self._quit != OK)
            if raw is None:
                return None
            pos, index, sample, meas = raw
            if isinstance(meas, _Failure):
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
                if self.oversize == "error":
                    raise SampleError(
                        f"rank {self.rank}: dataset index {index} has sizes {sizes}, over the budget of cost "
                        f"model {getattr(self.cost, 'name', self.cost)!r}; oversize='error' stops here. Use "
                        "oversize='alone' (a batch of its own) or 'skip' (counted), or raise token_budget")
                if self.oversize == "skip":
                    self.stats.oversize_skipped += 1
                    continue
            item = Item(pos, index, sample, sizes, labels)
            c = self._sample_cost(sizes)
            if self.deal is not None:
                self._cost_taken += c
            if fits:  # fillers replay the cheapest sample within budget seen (never an oversize one)
                if self._template is None or c < self._template_cost:
                    self._template, self._template_cost = sample, c
            return item

    # -- effects ------------------------------------------------------------------
    def _apply(self, s: machine.Step) -> dict:
        if s.effect == "fetch" and s.inputs.get("src_has"):
            self._window.append(self._fetched)
        elif s.effect == "post":
            return self._post(s)
        elif s.effect == "collect":
            return self._after_collect(s)
        elif s.effect == "emit":
            taken, self._window = self._window[:s.count], self._window[s.count:]
            self._hold(taken)
        elif s.effect == "filler":
            self._hold(None)
        if len(self._window) != s.after["buf"]:
            raise ProtocolError(f"engine window holds {len(self._window)} samples, the table says "
                                f"buf={s.after['buf']} after {s.row}")
        return {}

    def _hold(self, taken: list[Item] | None) -> None:
        k = len(self._held)
        if taken is None:
            if self._template is None and self._quit == OK:
                try:
                    self._template = self._template_fn()
                except Exception as e:  # no sample to build a filler from: stop through the table
                    self._local_error(e)
            b = Batch([self._template], (), None, (), (0, 0, 0))
        else:
            sizes = tuple(it.sizes[0] for it in taken)
            b = Batch([it.sample for it in taken], tuple(it.pos for it in taken),
                      tuple(it.index for it in taken), sizes,
                      (sum(sizes), sum(it.labels for it in taken), len(taken)))
        self._held.append(b)
        self._counts[3 * k:3 * k + 3] = b.counts

    def _post(self, s: machine.Step) -> dict:
        if s.payload["shape"] != self.header_len:
            raise ProtocolError(f"table header shape {s.payload['shape']} != engine header {self.header_len}")
        summary, intake = self._prepared
        self._prepared = None
        digest = self.replica.digest()
        header = self.layout.encode(
            st=s.payload["st"], round=self._posted, n=s.payload["n"], epoch=self.replica.epoch,
            digest=digest, summary=summary, taken=self.source.pulled, cost=self._cost_taken,
            dry=int(self.source.dry), reserve=0 if self.deal is None else self.deal.reserve_taken,
            intake=intake, counts=self._counts)
        self._counts = [0] * (3 * self.W)
        self._enter(header)
        return {"round": self._posted - 1, "summary": summary, "replicated": [self.replica.epoch, *digest]}

    def _enter(self, header: list[int]) -> None:
        """SYNC: every rank must reach this, once per round, in the same order."""
        if self.group is None:
            self._solo = [header]
            self._work = None
        else:
            send = torch.tensor(header, dtype=torch.int64)
            self._recv = [torch.empty_like(send) for _ in range(self.world_size)]
            # SYNC: every rank must reach this (one fixed-shape all-gather per round)
            self._work = torch.distributed.all_gather(self._recv, send, group=self.group, async_op=True)
        self._posted += 1

    def _wait(self) -> list[list[int]]:
        rnd = self._posted - 1
        if self._work is None:
            return self._solo
        try:
            self._work.wait(timeout=timedelta(seconds=self.timeout_s))
        except Exception as e:  # gloo raises RuntimeError (timeout, peer closed the connection)
            raise RankFailure(
                f"rank {self.rank}: the header collective of round {rnd} did not complete within "
                f"timeout_s={self.timeout_s}: a peer rank died, hung, or stopped iterating without "
                f"close(). gloo said: {type(e).__name__}: {str(e)[:300]}") from None
        finally:
            self._work = None
        return [t.tolist() for t in self._recv]

    def _collect(self) -> None:
        t0 = time.perf_counter()
        rows = [self.layout.decode(h) for h in self._wait()]
        decision = self.replica.decide(rows)  # every rank alike, from the gathered rows only
        self._coll, self._target = decision.inputs, decision.target
        self._gathered = self._last = rows
        self.stats.collective_s += time.perf_counter() - t0

    def _after_collect(self, s: machine.Step) -> dict:
        headers = self._gathered
        rnd = self._posted - 1
        self.stats.rounds += 1
        if s.row == "return_abort":
            self._held = []  # the epoch ends here on every rank: the last round's batches are not released
        else:
            self._release(headers, final=s.after["ph"] == DONE)
        if s.row == "return_stop" and self.mode == QUOTA:
            self._count_unemitted()
        extra = {"round": rnd, "collective": {
            "headers": [{"st": h.st, "n": h.n, "shape": self.header_len} for h in headers],
            "summaries": [list(h.summary) for h in headers], "rounds": [h.round for h in headers],
            "replicated": [[h.epoch, h.deal, h.target, h.proposal] for h in headers],
            "inputs": dict(self._coll)}}
        return extra

    def _release(self, headers: list[Header], final: bool) -> None:
        """Hand the previous round's batches to the consumer with their global counts.

        ``loss_basis="label_tokens"``: a step whose batches hold tokens but no label token on
        any rank gets ``loss_scale = 0`` on every rank (nothing to learn from; counted in
        ``stats.zero_label_steps``); once `NO_LABELS_AFTER` real samples of this epoch (every
        rank's) were released without a single label token, or the epoch ends so, every rank
        raises SampleError in the same step: the samples carry no labels and every scale would
        be 0 (a silent no-op training).
        """
        held, self._held = self._held, []
        steps = []
        for k, b in enumerate(held):
            g = [sum(h.count(k, j) for h in headers) for j in range(3)]
            loc = b.counts
            basis_g = g[self.loss_slot]
            scale = 0.0 if b.filler or basis_g == 0 else self.world_size * loc[self.loss_slot] / basis_g
            if self.loss_slot == 1 and g[0] > 0 and g[1] == 0:
                self.stats.zero_label_steps += 1
            self._labels_seen += g[1]
            self._samples_seen += g[2]
            b.info = StepInfo(indices=() if b.filler else b.indices, filler=b.filler, local_samples=loc[2],
                              global_samples=g[2], local_tokens=loc[0], global_tokens=g[0],
                              local_label_tokens=loc[1], global_label_tokens=g[1], loss_scale=scale,
                              step=self._steps, round=self._posted - 2, epoch=self.epoch)
            self._steps += 1
            steps.append(b)
        if self.loss_slot == 1 and self._labels_seen == 0 and self._samples_seen > 0 and (
                self._samples_seen >= NO_LABELS_AFTER or final):
            # every rank sees the same gathered counts, so every rank raises after the same step
            self._replicated_error(SampleError(
                f"rank {self.rank}: {self._samples_seen} samples of epoch {self.epoch} (all ranks) hold "
                "tokens but not one label token (labels all -100, or shift_labels=True on one-token "
                "labels): with loss_basis='label_tokens' every loss_scale would be 0 and the model would "
                "never change. Give the samples 'labels', or pass loss_basis='tokens'"))
            return
        for b in steps:
            self._put(("batch", b))

    def _count_unemitted(self) -> None:
        left = [it.index for it in self._window]
        rest = self.source.remaining()
        if self.deal is not None and self.rank == 0:  # what no rank was dealt: counted once, on rank 0
            rest = (rest or []) + self.deal.undealt()
        self.stats.unemitted += len(left) + (len(rest) if rest else 0)
        self.stats.unemitted_indices.extend(left + (rest or []))

    # -- output and shutdown --------------------------------------------------------
    def _put(self, item) -> None:
        """Queue `item` for the consumer; once stopping (quit > 0) it is dropped (nobody reads it)."""
        while self._quit == OK:
            try:
                self.out.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def _deliver_error(self, e: BaseException) -> None:
        while True:  # the consumer gets the error at once, ahead of queued batches
            try:
                self.out.get_nowait()
            except queue.Empty:
                break
        self.out.put(("error", e))

    def _fail(self, e: BaseException) -> None:
        """An error that ends this thread: a RankFailure (peers gone, hung, or an abort posted by another
        rank), or a global ProtocolError every rank raises alike.  None of these leaves a peer waiting
        on this rank beyond ``timeout_s``."""
        if self.trace is not None:
            self.trace.write({"failure": f"{type(e).__name__}: {str(e)[:500]}"})
        if self.error is not None and self._quit != OK:
            return  # this rank stopped itself; its consumer already has its own error or is gone
        self.error = e
        self._deliver_error(e)
