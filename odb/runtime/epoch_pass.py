"""`Pass`: one pass over the loader (what ``iter(loader)`` returns); it owns consumption.

Each ``next()`` takes the engine's next item (a batch, the end, an error), collates the batch in the
caller's thread, attaches its `StepInfo`, records its positions in the epoch's ledger and counts it.
Ending the pass early (``break``, ``close()``, garbage collection) stops the engine, which tells the
peers (they raise RankFailure unless they stop at the same step).  Any exception raised while the
caller waits (torch's dead-worker error from its SIGCHLD handler, a signal handler's, Ctrl-C) goes to
the caller and stops the pass through the table.
"""

from __future__ import annotations

import queue
import signal
import time
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Callable

from ..core.info import STEP_INFO_KEY
from ..core.rank import Batch
from ..errors import ConfigError, ProtocolError, SampleError
from .engine import CLOSED, FAILED, Engine

if TYPE_CHECKING:
    from .loader import ODBDataLoader

__all__ = ["Pass", "first_usable", "no_template"]


def first_usable(dataset, order: list, fits: Callable, limit: int = 16):
    """A filler template for a rank that has seen no sample within budget (map-style): the first
    of up to `limit` indices (its own order, else 0, 1, ...) whose preprocessing returns a
    sample within the budget (`fits`), so a filler never costs more than the budget."""
    candidates = (order or list(range(min(len(dataset), limit))))[:limit]
    for idx in candidates:
        sample = dataset[idx]
        if sample is not None and fits(sample):
            return sample
    raise SampleError(f"no sample to build a PAD filler batch from: dataset indices {candidates} returned "
                      "None or samples over the budget; pass filler_sample=<a processed sample within the "
                      "budget> or use mode='join'")


def no_template(rank: int):
    raise SampleError(f"rank {rank} has no sample to build a PAD filler batch from (its shard of the "
                      "IterableDataset is empty so far); pass filler_sample=<a processed sample> or use "
                      "mode='join'")


def _from_signal_handler(e: BaseException) -> bool:
    """True if `e` was raised by a Python signal handler (one installed now) that interrupted the code
    in `e`'s traceback: torch's SIGCHLD handler reporting a dead DataLoader worker, a user's preemption
    handler.  Such an error is not the interrupted code's (e.g. not collate_fn's) and passes unwrapped."""
    codes = set()
    for sig in signal.valid_signals():
        try:
            code = getattr(signal.getsignal(sig), "__code__", None)
        except (OSError, ValueError):
            continue
        if code is not None:
            codes.add(code)
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


class Pass:
    """One pass over `loader` driven by `eng` (module docstring)."""

    def __init__(self, loader: "ODBDataLoader", eng: Engine):
        self._loader, self._eng = loader, eng
        self._unemitted0 = loader.stats.unemitted
        self.epoch = eng.epoch
        self.open = True

    def __iter__(self) -> "Pass":
        return self

    def __next__(self) -> MutableMapping:
        loader = self._loader
        if loader.closed:
            self.open = False
            raise ConfigError(f"rank {loader.rank}: this ODBDataLoader was closed (close(), a with block or "
                              "garbage collection) while this iterator was held; its batches are gone. Iterate a "
                              "new loader (built alike on every rank)")
        if not self.open:
            raise StopIteration
        try:
            t0 = time.perf_counter()
            kind, payload = self._get()
            loader.stats.wait_time_s += time.perf_counter() - t0
            if kind == "error":
                raise payload
            if kind == "batch":
                return self._collate(payload)
        except BaseException:
            self._stop(FAILED)
            raise
        self.open = False
        loader.end_pass(self._unemitted0)
        raise StopIteration

    def _get(self):
        # Only queue.Empty is a wait: anything else raised here (torch's dead-worker error from its
        # SIGCHLD handler, a signal handler's exception, KeyboardInterrupt) goes to the caller.
        eng = self._eng
        while True:
            try:
                return eng.out.get(timeout=1.0)
            except queue.Empty:  # make sure the engine is still alive
                if not eng.thread.is_alive() and eng.out.empty():
                    raise ProtocolError(f"rank {eng.rank}: the engine thread ended without a result "
                                        f"(error: {eng.error!r})") from None

    def _collate(self, b: Batch) -> MutableMapping:
        loader, info = self._loader, b.info
        where = "a filler batch" if info.filler else f"dataset indices {list(info.indices)}"
        try:
            batch = loader.collate_fn(b.samples)
        except Exception as e:
            if _from_signal_handler(e):  # e.g. torch's dead-worker error, raised wherever the main thread was
                raise
            raise SampleError(f"rank {loader.rank}: collate_fn raised {type(e).__name__}: {e} on {where} "
                              f"(step {info.step}, round {info.round})") from e
        if not isinstance(batch, MutableMapping):
            raise SampleError(f"rank {loader.rank}: collate_fn returned {type(batch).__name__} for {where}; it "
                              "must return a mutable mapping (e.g. a dict) so the StepInfo can ride along")
        batch[STEP_INFO_KEY] = info
        st = loader.stats
        st.steps += 1
        if info.filler:
            st.fillers += 1
        else:
            loader.ledger.record(b.positions, self.epoch)
            st.samples += len(b.samples)
            st.real_tokens += sum(b.sizes)
            st.padded_tokens += len(b.sizes) * max(b.sizes)
        return batch

    def _stop(self, status: int) -> None:
        if self.open:
            self.open = False
            self._eng.stop(status)
            self._loader.join_engine(self._eng)

    def close(self) -> None:
        """End this pass early (the engine tells the peers it stopped)."""
        self._stop(CLOSED)

    def __del__(self) -> None:
        try:
            self._stop(CLOSED)
        except Exception:
            pass
