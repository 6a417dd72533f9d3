"""The engine: one rank's background thread that executes the DGAP table for one epoch.

Legend
    N        world size of the loader's gloo group; W the window (``buffer_size``)
    S        the alignment policy's ``summary_len``
    L        the length of `odb.batching.deal.intake_ladder` (W): 20 for W = 1024
    header   int64[H], H = 7 + S + L + 3W (`header_len`):
             [st, round, n, summary(S), taken, cost, dry, reserve, intake(L), counts(3W)]
             ``st`` and ``n`` are the table's payload (``st = in.quit``,
             ``n = buf``); ``round`` is a diagnostic slot (the engine checks
             that every rank posted the same round; the table does not read
             it); ``taken, cost, dry, reserve`` feed dealt sharding (items this
             rank's source returned this epoch, their summed cost x
             ``COST_SCALE``, whether its key iterator ran dry, keys it took
             itself; posted always, read only when dealing); ``intake`` is
             `odb.batching.deal.policy_intake` of the window at the post
             (zeros unless dealing), which bounds the rank's next fill;
             ``counts[3k + b]`` is this rank's count b (tokens, label
             tokens, samples) of its k-th batch of the PREVIOUS round
             (k < T <= W), 0 for fillers and absent batches
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
choose)``.  ``inputs`` is lazy: ``src_has`` pulls one sample from the source
only when a guard asks; ``ready`` waits (at most ``timeout_s``) for the
round's all-gather, then every collective input comes from
``machine.collective_inputs`` over the gathered headers and the policy's
proposal.  ``choose`` asks the policy for ``use`` (via ``partition``) and
``take``.  The engine computes no target, stop or filler count itself.

Dealt sharding (``deal``, a `DealtOrder`): right after each round's
collective, every rank feeds the gathered ``taken, cost, dry, reserve`` and each
rank's bound on its next fill (`odb.batching.deal.intake_bound` of the gathered
``n``, ``intake`` and the round's target, plus the inner DataLoader's prefetch
and one) to its replica
of the dealer and appends its share to its source's keys (see
`odb.batching.deal`); the deal is a function of the gathered headers only, so
every position goes to exactly one rank.  The table is unchanged: a dealt
source is a finite source whose length is decided online.

Exact loss scaling: the batches of round r are held until the collective of
round r+1 (or the final stop round) returns every rank's counts for them,
then released to the consumer with their global counts (one round of
bounded prefetch).
"""

from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch

from ..batching.base import call_partition, check_partition
from ..errors import ProtocolError, RankFailure, SampleError
from ..protocol import machine
from ..protocol.expr import Let, Scope, evaluate
from ..protocol.table import DGAP, DONE, JOIN, QUOTA
from .info import LoaderStats, StepInfo
from ..batching.deal import intake_bound, intake_ladder, policy_intake, sample_cost
from ..batching.deal import DealtOrder
from .source import Item, Source, _Failure
from .trace import TraceWriter

__all__ = ["Engine", "Batch", "OK", "CLOSED", "FAILED", "header_len"]

_DEAL = 4  # header ints for dealt sharding: taken, cost, dry, reserve


def header_len(summary_len: int, W: int) -> int:
    """Ints in one rank's header (module docstring)."""
    return 3 + summary_len + _DEAL + len(intake_ladder(W)) + 3 * W

OK, CLOSED, FAILED = 0, 1, 2
_STATUS = {CLOSED: "stopped iterating (close(), a break out of the loop, or garbage collection)",
           FAILED: "failed with a local error (its own exception says which)"}


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
                 queue_size: int, deal: DealtOrder | None = None):
        self.group, self.rank, self.world_size = group, rank, world_size
        self.W, self.mode, self.policy, self.cost = W, mode, policy, cost
        self.S = int(policy.summary_len)
        self.header_len = header_len(self.S, W)
        self._lad = len(intake_ladder(W))
        self._off = 3 + self.S + _DEAL + self._lad  # where counts start in a header
        self.deal = deal
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
        self._coll: dict | None = None
        self._gathered: list[list[int]] | None = None
        self._last: list[list[int]] = []  # the headers of the last completed collective
        self._work = None
        self._posted = 0                 # header collectives entered
        self._steps = 0                  # batches released (StepInfo.step)
        self._template: Any = None
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
            self._fetched, self._coll, self._gathered = None, None, None
            try:
                s = machine.step(DGAP, local, self._input, self.cfg, self._choose)
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
        bad = [(r, h[0]) for r, h in enumerate(self._last) if h[0] != OK]
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

    # -- inputs and choices (called by machine.step) ---------------------------
    def _input(self, name: str):
        if name == "quit":
            return self._quit
        if name == "src_has":
            try:
                self._fetched = self._fetch()
            except Exception as e:  # worker error, SampleError (oversize="error", no length), ...
                self._local_error(e)
                raise _Restart() from None
            return self._fetched is not None
        if self._coll is None:
            self._collect()
        return self._coll[name]

    def _target(self) -> int:
        """The round's target: the table's own ``Let("target")`` on this round's collective inputs."""
        return int(evaluate(Let("target"), Scope(inputs=self._coll, cfg=self.cfg, lets=DGAP.let_map)))

    def _choose(self, row, choice, lo: int, hi: int, params: dict) -> int:
        if self._quit != OK:
            return lo  # stopping: the batches are dropped; any value the table allows will do
        if choice.name == "use":
            real = lo
            if real == 0:
                self._groups = []
                return 0
            target = self._target()
            sizes = [it.sizes for it in self._window]
            try:
                groups = call_partition(self.policy, sizes, target, real, self.cost,
                                        [h[3:3 + self.S] for h in self._gathered])  # this round's summaries
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
        """
        while True:
            raw = self.source.next()
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
            if not self.cost.fits([sizes]):
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
            if self.deal is not None:
                self._cost_taken += self._sample_cost(sizes)
            if self._template is None:
                self._template = sample
            return item

    # -- effects ------------------------------------------------------------------
    def _apply(self, s: machine.Step) -> dict:
        if s.row == "take_sample":
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
        sizes = [it.sizes for it in self._window]
        try:
            summary = [int(v) for v in self.policy.summarize(sizes, self.cost, bool(s.after["x"]))]
            if len(summary) != self.S:
                raise ProtocolError(f"policy summary has {len(summary)} ints, summary_len says {self.S}")
            intake = ([0] * self._lad if self.deal is None else
                      [int(v) for v in policy_intake(self.policy, sizes, self.cost, self.W)])
        except Exception as e:
            # The row has fired with this step's st; the header must still be posted (peers wait for
            # it), so post a neutral summary and let the next header carry st = FAILED.
            self._local_error(e)
            summary, intake = [0] * self.S, [0] * self._lad
        deal = [self.source.pulled, self._cost_taken, int(self.source.dry),
                0 if self.deal is None else self.deal.reserve_taken]
        header = [int(s.payload["st"]), self._posted, int(s.payload["n"]), *summary, *deal, *intake,
                  *self._counts]
        self._counts = [0] * (3 * self.W)
        self._enter(header)
        return {"round": self._posted - 1, "summary": summary}

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
        rnd = self._posted - 1
        t0 = time.perf_counter()
        headers = self._wait()
        rounds = {h[1] for h in headers}
        if rounds != {rnd}:  # every rank sees the same headers, so every rank raises this
            raise ProtocolError(f"collective mismatch in round {rnd}: ranks posted rounds "
                                f"{[h[1] for h in headers]}")
        summaries = [h[3:3 + self.S] for h in headers]
        proposal = int(self.policy.propose(summaries, self.W))
        lo = evaluate(DGAP.proposal.lo, Scope(cfg=self.cfg))
        hi = evaluate(DGAP.proposal.hi, Scope(cfg=self.cfg))
        if not lo <= proposal <= hi:
            raise ProtocolError(f"policy proposal {proposal} outside the table's bounds [{lo}, {hi}] "
                                f"in round {rnd}")
        self._coll = machine.collective_inputs(DGAP, _table_headers(headers), proposal, self.cfg)
        self._gathered = self._last = headers
        if self.deal is not None and not self.deal.done:
            d = 3 + self.S
            target = self._target()
            extra = self.source.ahead + 1  # what the inner DataLoader may pull ahead, and one
            need = [intake_bound(self.W, h[2], h[d + _DEAL:self._off], target) + extra for h in headers]
            self.deal.deal(*([h[d + j] for h in headers] for j in range(_DEAL)), need=need)
        self.stats.collective_s += time.perf_counter() - t0

    def _after_collect(self, s: machine.Step) -> dict:
        headers = self._gathered
        rnd = self._posted - 1
        self.stats.rounds += 1
        if s.row == "return_abort":
            self._held = []  # the epoch ends here on every rank: the last round's batches are not released
        else:
            self._release(headers)
        if s.row == "return_stop" and self.mode == QUOTA:
            self._count_unemitted()
        extra = {"round": rnd, "collective": {
            "headers": _table_headers(headers), "summaries": [h[3:3 + self.S] for h in headers],
            "rounds": [h[1] for h in headers], "inputs": dict(self._coll)}}
        return extra

    def _release(self, headers: list[list[int]]) -> None:
        """Hand the previous round's batches to the consumer with their global counts."""
        held, self._held = self._held, []
        off = self._off
        for k, b in enumerate(held):
            g = [sum(h[off + 3 * k + j] for h in headers) for j in range(3)]
            loc = b.counts
            basis_g = g[self.loss_slot]
            scale = 0.0 if b.filler or basis_g == 0 else self.world_size * loc[self.loss_slot] / basis_g
            b.info = StepInfo(indices=() if b.filler else b.indices, filler=b.filler, local_samples=loc[2],
                              global_samples=g[2], local_tokens=loc[0], global_tokens=g[0],
                              local_label_tokens=loc[1], global_label_tokens=g[1], loss_scale=scale,
                              step=self._steps, round=self._posted - 2, epoch=self.epoch)
            self._steps += 1
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


def _table_headers(headers: list[list[int]]) -> list[dict]:
    """The table's view of the gathered headers: the payload (``st``, ``n``) and the shape."""
    return [{"st": h[0], "n": h[2], "shape": len(h)} for h in headers]
