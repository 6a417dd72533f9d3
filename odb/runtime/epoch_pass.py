"""`Pass`: one pass over the loader (what ``iter(loader)`` returns); it owns consumption.

Each ``next()`` takes the engine's next item (a batch, the end, an error), collates the batch in the
caller's thread, attaches its `StepInfo`, records its positions in the epoch's ledger and counts it.
Ending the pass early (``break``, ``close()``, garbage collection) stops the engine, which tells the
peers (they raise RankFailure unless they stop at the same step).  Any exception raised while the
caller waits (torch's dead-worker error from its SIGCHLD handler, a signal handler's, Ctrl-C) goes to
the caller and stops the pass through the table.
"""

from __future__ import annotations

import functools
import queue
import signal
import time
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Callable

from ..batching.deal import DealtOrder, Keys, first_lead
from ..core.info import LOSS_BASES, STEP_INFO_KEY
from ..core.pool import pool_aheads
from ..core.rank import Batch, RankCore
from ..core.replica import Replicated
from ..core.shared import describe_cost
from ..errors import ConfigError, ProtocolError, SampleError
from ..protocol.table import DGAP, MODES
from .engine import CLOSED, FAILED, Engine
from .ledger import ranges
from .observe import PassObserver
from .source import _measure
from .trace import TraceWriter, trace_path

if TYPE_CHECKING:
    from .loader import ODBDataLoader

__all__ = ["Pass", "start_engine", "first_usable", "no_template", "check_filler", "sample_fits"]


def sample_fits(sample, cost, settings) -> bool:
    """The sample, measured as the loader measures it, fits the budget (False if it cannot be measured)."""
    try:
        return cost.fits([_measure(sample, settings.length_fn, bool(settings.shift_labels))[0]])
    except Exception:
        return False


def check_filler(sample, cost, settings) -> None:
    """Raise ConfigError unless a user's ``filler_sample`` can be measured and fits the budget."""
    try:
        sizes, _ = _measure(sample, settings.length_fn, bool(settings.shift_labels))
    except Exception as e:
        raise ConfigError(f"filler_sample cannot be measured ({type(e).__name__}: {e}); pass a processed "
                          "sample like the dataset's") from None
    if not cost.fits([sizes]):
        raise ConfigError(f"filler_sample has sizes {sizes}, over the budget of cost {describe_cost(cost)}; "
                          "every filler step would exceed the budget; pass a sample within the budget")


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
        total = len(loader.dataset) if loader._order_kind() == "own" else None
        self._observer = PassObserver(loader, self.epoch, total)

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
        self._observer.end(loader, completed=True)
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
        loader.ledger.record(b.positions, self.epoch, info.global_samples)
        if info.filler:
            st.fillers += 1
        else:
            st.samples += len(b.samples)
            st.real_tokens += sum(b.sizes)
            st.padded_tokens += len(b.sizes) * max(b.sizes)
        self._observer.batch(info)
        return batch

    def _stop(self, status: int) -> None:
        if self.open:
            self.open = False
            self._observer.end(self._loader, completed=False)
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


def start_engine(loader: "ODBDataLoader", order: list | None) -> Engine:
    """Begin a pass of `loader` over `order` (None: a stream): the dealt order and its first deal (dealt
    sharding gathers every rank's yielded positions first), the source, the filler template, the trace,
    and the rank core its engine drives; returns the started engine."""
    s, done, deal = loader.settings, loader.ledger.done, None
    lanes = s.pool_size  # pooled windows (`odb.core.pool`): the table's participants are the pools
    aheads = pool_aheads(loader._aheads, lanes)
    if loader.sharding == "dealt":
        every = {p for rgs in loader._group.gather_done(ranges(done)) for a, b in rgs for p in range(a, b)}
        deal = DealtOrder(Keys.of(order, every), loader.world_size // lanes, loader.rank // lanes,
                          lead=first_lead(loader.layout.window, aheads), stats=loader.stats)
        deal.first()
        loader._source.start(None, frozenset(), deal=deal)
    else:
        keys = None if order is None else [(p, i) for p, i in enumerate(order) if p not in done]
        loader._source.start(keys, frozenset(done))
    if s.filler_sample is not None:
        template = functools.partial(lambda x: x, s.filler_sample)
    elif order is None:
        template = functools.partial(no_template, loader.rank)
    else:
        template = functools.partial(first_usable, loader.dataset, order, loader._fits)
    trace = None
    if s.trace_dir is not None:
        cfg = {"W": loader.layout.window, "mode": MODES[s.mode], "header_len": loader.layout.length,
               "xchg": int(s.exchange)}
        trace = TraceWriter(trace_path(s.trace_dir, loader._loader_id, loader._passes, loader.rank), {
            "table": DGAP.hash, "cfg": cfg, "rank": loader.rank, "world_size": loader.world_size,
            "epoch": loader.epoch, "mode": s.mode, "loader": loader._loader_id, "iteration": loader._passes,
            "policy": type(loader.policy).__name__, "sharding": loader.sharding, "lanes": lanes,
            "exchange_slack": loader.layout.slack})
    loader._passes += 1
    replica = Replicated(loader.shared, world_size=loader.world_size // lanes, aheads=aheads, policy=loader.policy,
                         order=deal, epoch=loader.epoch)
    core = RankCore(rank=loader.rank, world_size=loader.world_size, mode=MODES[s.mode], policy=loader.policy,
                    cost=loader.cost, replica=replica, layout=loader.layout, source=loader._source,
                    oversize=s.oversize, loss_slot=LOSS_BASES[s.loss_basis], stats=loader.stats, template=template,
                    lane=loader.rank % lanes, traced=trace is not None)
    eng = Engine(core=core, source=loader._source, group=loader._group.group, timeout_s=loader.timeout_s, trace=trace,
                 queue_size=max(2, s.buffer_size), stats=loader.stats)
    eng.start()
    return eng
