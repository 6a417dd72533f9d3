"""The engine: one rank's background thread that drives its `odb.core.rank.RankCore` for one pass.

Legend
    N        world size of the loader's gloo group; W the window (``buffer_size``)
    quit     the rank's stop status, the table's input ``in.quit``: OK (0); CLOSED (1): the consumer
             stopped iterating (close(), a break, garbage collection); FAILED (2): a local error
    out      the queue to the consumer: ``("batch", Batch)``, ``("end", None)``, ``("error", exc)``; bounded in
             rounds, not samples (`Engine._park`): after round r's collective the engine waits until the consumer
             has taken every batch released before it, so a rank holds about 3W preprocessed samples: the window,
             the round's batches held until the next collective, the queue (two rounds' releases at most)

The loop: while the core is in WAIT, post nothing and wait (at most ``timeout_s``) for the round's
collective (`odb.runtime.transport`), then ``core.collect(gathered)``; otherwise ``core.advance(quit)`` (the
rows up to the next post; traced, ``core.step(quit)``, one row a call, each row a trace line).  The engine
does what the returned `odb.core.rank.Out` says: post the header and counts (SYNC), move the round exchange's
batches (`odb.runtime.transport.BatchTransfer`, bounded by ``timeout_s``), queue the released batches, write
the trace line, hand errors over.  It decides nothing itself.

Pauses: the engine waits for its consumer only at a round boundary, after a round's collective and its
exchange, never inside one, and for a condition in batches of rounds that is the same on every rank (every rank
still in the epoch releases the same number of batches per round).  So a pause every rank takes at the same step
(an evaluation, a checkpoint every rank writes) parks every engine after the same round, with no collective
in flight, for as long as it lasts; only a rank whose peers wait in a collective for it counts against
``timeout_s`` (a consumer slower on one rank, a hung peer).  A bound in samples, which differ per rank, parked
one engine before the next post while its peer waited in that round's collective (issue 61).

Stopping is driven by the table only: once ``quit > 0`` the core fetches nothing more and its next
header posts it; every rank then leaves through ``return_abort`` in the same round.  A rank that did
not stop itself gets a RankFailure behind its queued batches; a local error reaches the consumer at
once.  A peer that died is seen by gloo within seconds; a slow or hung one within ``timeout_s``.
"""

from __future__ import annotations

import queue
import threading
import time

from ..core.header import Gathered, Post
from ..core.rank import RankCore
from ..core.types import CLOSED, FAILED, OK, Batch
from ..errors import ProtocolError, RankFailure
from ..protocol.table import DGAP
from .group import collective_failure
from .trace import TraceWriter
from .transport import BatchTransfer, HeaderGather, counts_mode

__all__ = ["Engine", "Batch", "OK", "CLOSED", "FAILED"]


class Engine:
    """Runs one pass of `core` in a daemon thread (module docstring); every collective is bounded by
    ``timeout_s``."""

    def __init__(self, *, core: RankCore, source, group, timeout_s: float, trace: TraceWriter | None, stats,
                 placement: str = "placement='auto' (the default)"):
        self.core, self.group, self.timeout_s, self.trace, self.stats = core, group, timeout_s, trace, stats
        self.rank, self.world_size, self.epoch = core.rank, core.world_size, core.epoch
        self.source = source
        source.stopping = lambda: self._quit != OK  # a fetch waiting on a worker gives up when this rank stops
        self.out: queue.Queue = queue.Queue()
        self._room = threading.Condition()        # the consumer took a batch (`taken`), or this rank stops
        self._taken = 0                            # batches the consumer took from `out`
        self._released = (0, 0)                    # batches released before the last collect, and by its end
        self.error: BaseException | None = None   # the first error of this rank (local or fatal)
        self._quit = OK                            # only ever goes from OK to CLOSED or FAILED
        lay = core.layout  # the mode reads N and the compared layout only: every rank picks the same one
        self.transport = HeaderGather(group, self.world_size, counts_mode(self.world_size, lay.length, lay.steps))
        self.transfer = BatchTransfer(group, placement) if lay.exchange else None
        self.thread = threading.Thread(target=self._run, name=f"odb-engine-rank{self.rank}", daemon=True)

    # -- control ---------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def stop(self, status: int) -> None:
        """Set this rank's quit status (CLOSED or FAILED, what the peers are told); the first one stays."""
        if self._quit == OK:
            self._quit = status
        with self._room:
            self._room.notify()  # a parked engine goes on (its consumer is gone)

    @property
    def stopping(self) -> bool:
        return self._quit != OK

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
            # Drop this thread's hold on the gloo group and its buffers: a process group kept alive by a
            # finished engine would otherwise be destroyed during interpreter finalization.
            self.group = None
            self.transport.release()
            if self.transfer is not None:
                self.transfer.release()

    def _loop(self) -> None:
        core, seq, status = self.core, 0, (lambda: self._quit)
        # untraced, the FILL and EMIT rows up to a post run in one call: a trace logs every row, one call each
        fire = core.step if self.trace is not None else core.advance
        while not core.done:
            collected = core.waiting
            if collected:
                t0 = time.perf_counter()
                gathered = self._wait()
                self.stats.collective_s += time.perf_counter() - t0
                out = core.collect(gathered)
                moves = self._exchange(out) if out.send or out.expect or core.receiving else None
            else:
                out, moves = fire(status), None
            if out.local_error is not None:
                self._local_error(out.local_error)
            if out.step is None:
                continue  # no row fired; take the step again (quit may have changed)
            if out.post is not None:
                self._enter(out.post)
            for b in out.release:
                self._put(("batch", b))
            if out.replicated_error is not None:
                self._replicated_error(out.replicated_error)
            if self.trace is not None:
                s = out.step
                self.trace.write({"seq": seq, "row": s.row, "before": s.before, "after": s.after, "inputs": s.inputs,
                                  "params": s.params, "effect": s.effect, "payload": s.payload, "count": s.count,
                                  "table": DGAP.hash, **(out.trace or {}), **({"exchange": moves} if moves else {})})
            seq += 1
            if out.end:  # JOIN: this rank emits no more batches; its iterator ends while this thread posts
                self._put(("end", None))
            if out.abort_error is not None:
                self._aborted(out.abort_error)
            if collected:
                self._released = (self._released[1], self._released[1] + len(out.release))
                if not core.done:
                    self._park()
        if not core.local["aborted"] and not core.ended:
            self._put(("end", None))

    # -- errors ------------------------------------------------------------------------
    def _aborted(self, err: BaseException) -> None:
        """The epoch ended by another rank's abort: the RankFailure goes BEHIND the queued batches, which
        were released with their global counts and are valid on every rank (a consumer that stops at the
        same step as the peer, the same max_steps, never sees it)."""
        if self._quit != OK:
            return
        self.error = err
        if self.trace is not None:
            self.trace.write({"failure": f"{type(err).__name__}: {str(err)[:500]}"})
        self._put(("error", err))

    def _local_error(self, e: BaseException) -> None:
        """A rank-local error: to the consumer at once, ahead of queued batches; quit becomes FAILED."""
        if self.error is None:
            self.error = e
            if self.trace is not None:
                self.trace.write({"local_error": f"{type(e).__name__}: {str(e)[:500]}"})
            self._deliver_error(e)
        self.stop(FAILED)

    def _replicated_error(self, e: BaseException) -> None:
        """An error every rank raises alike: behind the released batches, so every rank's consumer raises
        after the same number of batches; quit becomes FAILED (the next collective aborts every rank)."""
        if self.error is None:
            self.error = e
            if self.trace is not None:
                self.trace.write({"local_error": f"{type(e).__name__}: {str(e)[:500]}"})
            self._put(("error", e))
        self.stop(FAILED)

    def _fail(self, e: BaseException) -> None:
        """An error that ends this thread: a RankFailure (peers gone, hung), or a ProtocolError or
        ConfigError every rank raises alike in the same round."""
        if self.trace is not None:
            self.trace.write({"failure": f"{type(e).__name__}: {str(e)[:500]}"})
        if self.error is not None and self._quit != OK:
            return  # this rank stopped itself; its consumer already has its own error or is gone
        self.error = e
        self._deliver_error(e)

    # -- the collective --------------------------------------------------------------
    def _enter(self, post: Post) -> None:
        """SYNC: every rank must reach this, once per round, in the same order."""
        self.transport.post(post)

    def _wait(self) -> Gathered:
        t0 = time.monotonic()
        try:
            return self.transport.collect(self.timeout_s)
        except Exception as e:  # gloo raises RuntimeError (timeout, peer closed the connection)
            raise RankFailure(collective_failure(
                f"rank {self.rank}: the header collective of round {self.core.posted - 1}", time.monotonic() - t0,
                self.timeout_s, "a peer rank hung, stopped iterating without close(), or its consumer paused "
                "alone longer than that (a pause every rank takes at the same step is not counted)", e)) from None

    def _exchange(self, out) -> dict:
        """The round exchange's moves the collect just planned (`odb.core.rank`): every rank makes its own,
        whatever its quit status (the peers expect them); the received batches go to the core before its
        next step.  Returns the trace's record: what went where, by origin slot, with the positions."""
        t0 = time.perf_counter()
        try:
            got, errors = self.transfer.move(out.send, out.expect, self.timeout_s)
        except ProtocolError:  # a peer sent what the plan does not name: the replicas diverged
            raise
        except Exception as e:  # gloo raises RuntimeError (timeout, peer closed the connection)
            peers = sorted({int(q) for q, _, _ in out.send} | {int(r) for r, _ in out.expect})
            raise RankFailure(collective_failure(
                f"rank {self.rank}: the round exchange after round {self.core.posted - 1} (with ranks {peers})",
                time.perf_counter() - t0, self.timeout_s, "a peer rank hung", e)) from None
        for e in errors:  # the data's (a batch that cannot be pickled): this rank stops through the table
            self._local_error(e)
        if self.core.receiving:  # a core that only sends has placed its batches already
            self.core.receive(got, lost=bool(errors))
        st, tr = self.stats, self.transfer
        st.exchange_s += time.perf_counter() - t0
        st.exchange_sent += len(out.send)
        st.exchange_received += len(got)
        st.exchange_bytes += tr.bytes_sent + tr.bytes_received
        tr.bytes_sent = tr.bytes_received = 0
        return {"send": [[int(q), *map(int, o), list(b.positions)] for q, o, b in out.send],
                "recv": [[*map(int, o), list(got[tuple(o)].positions)] for _, o in out.expect if tuple(o) in got],
                "lost": [[*map(int, o)] for _, o in out.expect if tuple(o) not in got]}

    # -- output ------------------------------------------------------------------------
    def _park(self) -> None:
        """At a round boundary (a collect and its exchange done, no collective in flight): wait until the
        consumer has taken every batch released before this collect, or this rank stops.  Not bounded by
        ``timeout_s``: a consumer's pause is not a failure; a peer waiting for this rank in the next collective
        is what bounds it (module docstring)."""
        need = self._released[0]
        with self._room:
            while self._quit == OK and self._taken < need:
                self._room.wait(0.05)

    def _put(self, item) -> None:
        """Queue `item` for the consumer; once stopping (quit > 0) it is dropped (nobody reads it)."""
        if self._quit == OK:
            self.out.put(item)

    def taken(self, item) -> None:
        """The consumer took `item` from the queue (`_park` counts its batches)."""
        if item[0] == "batch":
            with self._room:
                self._taken += 1
                self._room.notify()

    def _deliver_error(self, e: BaseException) -> None:
        while True:  # the consumer gets the error at once, ahead of queued batches
            try:
                self.out.get_nowait()
            except queue.Empty:
                break
        self.out.put(("error", e))

