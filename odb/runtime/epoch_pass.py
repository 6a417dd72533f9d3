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
import warnings
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from ..batching.dealt_order import DealtOrder, Keys
from ..batching.intake import first_lead
from ..core.info import LOSS_BASES, Receipts, attach_step_info
from ..core.placement import pool_aheads
from ..core.rank import START_SAMPLES, RankCore
from ..core.replica import Replicated
from ..core.shared import describe_cost
from ..core.types import Batch
from ..errors import ConfigError, ProtocolError, SampleError
from ..protocol.table import DGAP, MODES
from .engine import CLOSED, FAILED, Engine
from .ledger import ranges
from .observe import PassObserver
from .source import measure_sample
from .trace import TraceWriter, trace_path

if TYPE_CHECKING:  # the members' types only (the loader's modules import this one)
    from ..batching.base import AlignmentPolicy, CostModel
    from ..core.header import HeaderLayout
    from ..core.info import LoaderStats
    from ..core.shared import Shared
    from ..settings import LoaderSettings
    from .group import LoaderGroup
    from .ledger import EpochLedger
    from .source import Source

__all__ = ["Pass", "PassHost", "start_engine", "filler_template", "cut_to_budget", "check_filler", "sample_fits"]


class PassHost(Protocol):
    """What a pass reads of its loader (`odb.ODBDataLoader` is one): the loader hands itself to `start_engine`
    and `Pass`, which read these members and nothing else, and call back only `end_pass` and `join_engine`."""

    rank: int
    world_size: int
    settings: LoaderSettings
    dataset: Any             # the user's: map-style or iterable, any sample type
    collate_fn: Callable
    cost: CostModel          # the built cost model and policy, the header layout and the compared settings
    policy: AlignmentPolicy
    layout: HeaderLayout
    shared: Shared
    sharding: str            # "dealt" or "fixed"
    mode: str
    timeout_s: float
    stats: LoaderStats       # the pass counts into it
    ledger: EpochLedger      # the pass records its batches there
    source: Source           # this rank's preprocessing
    group: LoaderGroup
    aheads: Sequence[int]    # every rank's prefetch, gathered at construction
    loader_id: int
    closed: bool             # read on every batch: the loader was closed under the pass
    joined: int              # open join contexts (`odb.integrations.join_context`)
    hinted: bool             # the planner's hint was logged (`odb.runtime.observe`)
    placement_given: str     # ``placement=`` as the user wrote it (`odb.core.placement.placement_label`), for messages

    @property
    def epoch(self) -> int: ...

    @property
    def order_kind(self) -> str: ...

    def fits(self, sample) -> bool: ...

    def end_pass(self, unemitted0: int) -> None: ...

    def join_engine(self, eng: Engine) -> None: ...


def sample_fits(sample, cost, settings) -> bool:
    """The sample, measured as the loader measures it, fits the budget (False if it cannot be measured)."""
    try:
        return cost.fits([measure_sample(sample, settings.length_fn, bool(settings.shift_labels))[0]])
    except Exception:
        return False


def check_filler(sample, cost, settings) -> None:
    """Raise ConfigError unless a user's ``filler_sample`` can be measured and fits the budget."""
    try:
        sizes, _ = measure_sample(sample, settings.length_fn, bool(settings.shift_labels))
    except Exception as e:
        raise ConfigError(f"filler_sample cannot be measured ({type(e).__name__}: {e}); pass a processed "
                          "sample like the dataset's") from None
    if not cost.fits([sizes]):
        raise ConfigError(f"filler_sample has sizes {sizes}, over the budget of cost {describe_cost(cost)}; "
                          "every filler step would exceed the budget; pass a sample within the budget")


def cut_to_budget(sample, fits: Callable) -> Any:
    """A filler's content from an over-budget `sample`: its longest prefix within the budget (`fits`), every
    label -100 (a filler carries zero weight, so only its shape matters).  Cut are the values along the
    sequence: 1-D tensors, arrays and lists as long as ``input_ids``; other values stay.  None when the
    sample holds a tensor of 2 or more dimensions (images: cutting the text would cut their placeholder
    tokens) or no prefix fits."""
    if not isinstance(sample, Mapping) or "input_ids" not in sample:
        return None
    ids = sample["input_ids"]
    n = len(ids) if isinstance(ids, (list, tuple)) or getattr(ids, "ndim", 1) == 1 else -1
    if n < 2:
        return None
    seq = {}
    for k, v in sample.items():
        if isinstance(v, (list, tuple)) and len(v) == n or getattr(v, "ndim", None) == 1 and len(v) == n:
            seq[k] = v
        elif (getattr(v, "ndim", 0) or 0) >= 2:
            return None

    def cut(m: int):
        out = dict(sample)
        for k, v in seq.items():
            out[k] = v[:m]
        if "labels" in seq:
            lab = seq["labels"][:m]
            out["labels"] = [-100] * m if isinstance(lab, (list, tuple)) else lab * 0 - 100
        return out
    lo, hi = 0, n  # the largest m in [1, n) whose cut fits: fits(lo) or lo == 0, not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(cut(mid)):
            lo = mid
        else:
            hi = mid
    return cut(lo) if lo >= 1 else None


def filler_template(loader: "PassHost", order: list | None) -> Callable:
    """The core's ``template(fallback)`` for a rank that saw no sample within the budget: the user's
    ``filler_sample`` if given (checked against the budget at construction); else the cheapest over-budget
    sample it saw cut to the budget; else (map-style) the first of up to 16 indices of its order whose sample
    fits or can be cut; else a SampleError that names the settings which would work."""
    fits, s = loader.fits, loader.settings
    fixes = "pass filler_sample=<a processed sample within the budget>" + (
        " or use mode='join'" if s.placement is None else "")

    def template(fallback):
        if s.filler_sample is not None:  # a rank with no sample at all (an empty stream) included
            return s.filler_sample
        candidates = [] if order is None else (order or list(range(min(len(loader.dataset), 16))))[:16]
        samples = []  # preprocessed one at a time: the first that fits ends the search
        for idx in candidates:
            sample = loader.dataset[idx]
            if sample is not None and fits(sample):
                return sample
            if sample is not None:
                samples.append(sample)
        for sample in ([fallback] if fallback is not None else []) + samples:
            cut = cut_to_budget(sample, fits)
            if cut is not None:
                return cut
        if order is None:
            raise SampleError(f"rank {loader.rank} has no sample to build a PAD filler batch from (its shard of the "
                              "IterableDataset gave none that fits the budget or can be cut to it); " + fixes)
        raise SampleError(f"no sample to build a PAD filler batch from: dataset indices {candidates} returned None or "
                          "samples over the budget that cannot be cut to it (they hold images or other tensors); "
                          + fixes)
    return template


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


# A pass on more than one rank in which not one batch's StepInfo was taken by its 64th batch (or its end)
# is a loop that never weights its loss: PAD fillers would train at full weight (`Pass.__next__`).  64
# leaves room for loops that prefetch (Lightning 1 batch, an accumulation window of up to 63).
UNREAD_LIMIT = 64


class Pass:
    """One pass over `loader` driven by `eng` (module docstring).

    A newer ``iter(loader)`` replaces it: it is closed, and its next use raises `ConfigError`.
    """

    def __init__(self, loader: "PassHost", eng: Engine, before):
        """`before`: the loader's stats just before `eng` started (`LoaderStats.snapshot`)."""
        self._loader, self._eng = loader, eng
        self._unemitted0 = before.unemitted
        self._oversize0 = before.oversize
        self.epoch = eng.epoch
        self.open = True
        self.replaced = False
        self.receipts = Receipts()
        self._yielded = 0
        total = len(loader.dataset) if loader.order_kind == "own" else None
        self._observer = PassObserver(loader, self.epoch, total, before)

    def __iter__(self) -> "Pass":
        return self

    def __next__(self) -> MutableMapping:
        loader = self._loader
        if self.replaced:
            raise ConfigError(f"rank {loader.rank}: this iterator of the ODBDataLoader was replaced by a newer "
                              "iter(loader), which started the epoch again (as torch's DataLoader does); iterate "
                              "the newer one. Keep one iterator per loader at a time")
        if loader.closed:
            self.open = False
            raise ConfigError(f"rank {loader.rank}: this ODBDataLoader was closed (close(), a with block or "
                              "garbage collection) while this iterator was held; its batches are gone. Iterate a "
                              "new loader (built alike on every rank)")
        if not self.open:
            raise StopIteration
        try:
            self._check_use()
            t0 = time.perf_counter()
            kind, payload = self._get()
            loader.stats.wait_time_s += time.perf_counter() - t0
            if kind == "error":
                raise payload
            if kind == "batch":
                return self._collate(payload)
            self._check_weighted(end=True)
        except BaseException:
            self._stop(FAILED)
            raise
        self.open = False
        loader.end_pass(self._unemitted0)
        self._observer.end(loader, completed=True)
        raise StopIteration

    def _check_use(self) -> None:
        """The mistakes that would hang or mis-train silently on more than one rank, raised before the next
        batch: JOIN outside a join context, a loop that never takes a StepInfo.  Every rank runs the same
        loop, so every rank raises at the same step."""
        loader = self._loader
        if loader.world_size == 1:
            return
        if self._yielded == 0 and loader.mode == "join" and not loader.joined:
            raise ConfigError(
                f"rank {loader.rank}: mode='join' outside a join context: the rank whose data ends first would "
                "leave the loop while its peers block in the model's gradient all-reduce (DDP), a hang the loader "
                "cannot see. Wrap the loop in `with odb.integrations.join_context(model, loader):` (DDP Join; "
                "model=None if the loop runs no collective of its own), or use mode='pad' (equal steps)")
        self._check_weighted(end=False)

    def _check_weighted(self, end: bool) -> None:
        loader = self._loader
        if (loader.world_size == 1 or self.receipts.taken
                or not (self._yielded >= UNREAD_LIMIT or end and self._yielded)):
            return
        raise ConfigError(
            f"rank {loader.rank}: {self._yielded} batches and not one StepInfo taken: the loss is not weighted, so "
            "each rank's mean counts alike whatever its tokens, and PAD fillers (zero-weight repeats of a sample) "
            "train at full weight. Take it from every batch, info = odb.pop_step_info(batch), and backpropagate "
            "odb.integrations.weighted_loss(model(**batch), info.loss_scale); or use odb.integrations.TrainStream "
            "or an adapter, which do it")

    def _get(self):
        # Only queue.Empty is a wait: anything else raised here (torch's dead-worker error from its
        # SIGCHLD handler, a signal handler's exception, KeyboardInterrupt) goes to the caller.
        eng = self._eng
        while True:
            try:
                item = eng.out.get(timeout=1.0)
                eng.taken(item)
                return item
            except queue.Empty:  # make sure the engine is still alive
                if not eng.thread.is_alive() and eng.out.empty():
                    raise ProtocolError(f"rank {eng.rank}: the engine thread ended without a result "
                                        f"(error: {eng.error!r})") from None

    def _collate(self, b: Batch) -> MutableMapping:
        loader, info = self._loader, b.info
        where = "a filler batch" if info.filler else f"dataset indices {list(info.indices)}"
        samples = b.samples
        if info.filler and loader.settings.filler_sample is not None:
            samples = [loader.settings.filler_sample]
        try:
            batch = loader.collate_fn(samples)
        except Exception as e:
            if _from_signal_handler(e):  # e.g. torch's dead-worker error, raised wherever the main thread was
                raise
            raise SampleError(f"rank {loader.rank}: collate_fn raised {type(e).__name__}: {e} on {where} "
                              f"(step {info.step}, round {info.round})") from e
        if not isinstance(batch, MutableMapping):
            raise SampleError(f"rank {loader.rank}: collate_fn returned {type(batch).__name__} for {where}; it "
                              "must return a mutable mapping (e.g. a dict) so the StepInfo can ride along")
        try:
            batch = attach_step_info(batch, info, self.receipts)
        except (AttributeError, TypeError):
            raise SampleError(f"rank {loader.rank}: collate_fn returned a {type(batch).__name__}, which takes no "
                              "attribute for the StepInfo; return a dict (or a mapping that takes attributes, such "
                              "as transformers' BatchEncoding)") from None
        st = loader.stats
        st.steps += 1
        loader.ledger.record(b.positions, self.epoch, info.global_samples)
        if info.filler:
            st.fillers += 1
        else:
            st.samples += len(b.samples)
            st.real_tokens += sum(b.sizes)
            st.padded_tokens += len(b.sizes) * max(b.sizes)
        if st.oversize > self._oversize0:
            self._announce_oversize()
        if self._yielded == 0 and st.same_start:
            self._announce_same_start(st.same_start)
        self._yielded += 1
        self._observer.batch(info, b.sizes if not info.filler else ())
        return batch

    def _announce_oversize(self) -> None:
        """Once per pass: samples over the budget (an out-of-memory risk, or samples not trained)."""
        loader, st = self._loader, self._loader.stats
        n, (use, sizes, index) = st.oversize - self._oversize0, st.oversize_worst
        self._oversize0 = float("inf")
        what = ("each trains as a batch of its own, so a batch may cost up to that: on a GPU an out-of-memory risk"
                if loader.settings.oversize == "alone" else "they are skipped, not trained (loader.stats."
                "oversize_skipped)")
        warnings.warn(f"rank {loader.rank}, epoch {self.epoch}: {n} sample(s) over the budget so far, the costliest "
                      f"{use:.2f}x the budget (dataset index {index}, sizes {tuple(sizes)}); {what}. Raise "
                      "token_budget, truncate samples in preprocessing, or set oversize='skip' or 'error'. The "
                      "epoch's summary (logging 'odb') repeats the count", stacklevel=3)

    def _announce_same_start(self, groups: list) -> None:
        """Ranks whose samples of this epoch began alike (`odb.core.rank`'s ``start_digest``): on every rank,
        before its first batch is trained."""
        loader = self._loader
        what = "; ".join(f"ranks {g}" for g in groups)
        src = ("its IterableDataset" if loader.order_kind == "stream" else "its sampler")
        fix = ("split the stream by rank (datasets.distributed.split_dataset_by_node(ds, rank, world_size), or "
               "skip all but every world_size-th sample by torch.distributed.get_rank() in __iter__)"
               if loader.order_kind == "stream" else
               "give each rank its own indices (torch's DistributedSampler), or drop sampler= and let the loader "
               "shard the dataset")
        warnings.warn(f"rank {loader.rank}, epoch {self.epoch}: {what} began the epoch with the same "
                      f"{START_SAMPLES} samples (their content digests are equal): each rank reads the same data "
                      f"from {src}, so every sample trains on each of them. Fix: {fix}. If every rank is meant to "
                      "read the same samples (a synthetic benchmark), ignore this", stacklevel=3)

    def _stop(self, status: int) -> None:
        if self.open:
            self.open = False
            self._observer.end(self._loader, completed=False)
            self._eng.stop(status)
            self._loader.join_engine(self._eng)

    def replace(self) -> None:
        """A newer iterator of the loader starts: end this one (the engine tells the peers it stopped)."""
        self.replaced = True
        self._stop(CLOSED)

    def close(self) -> None:
        """End this pass early (the engine tells the peers it stopped)."""
        self._stop(CLOSED)

    def __del__(self) -> None:
        try:
            self._stop(CLOSED)
        except Exception:
            pass


def start_engine(loader: "PassHost", order: list | None, index: int) -> Engine:
    """Begin the `index`-th pass of `loader` over `order` (None: a stream): the dealt order and its first deal (dealt
    sharding gathers every rank's yielded positions first), the source, the filler template, the trace,
    and the rank core its engine drives; returns the started engine."""
    s, done, deal = loader.settings, loader.ledger.done, None
    lanes = s.lanes  # pooled windows (`odb.core.placement`): the table's participants are the pools
    aheads = pool_aheads(loader.aheads, lanes)
    if loader.sharding == "dealt":
        every = {p for rgs in loader.group.gather_done(ranges(done)) for a, b in rgs for p in range(a, b)}
        deal = DealtOrder(Keys.of(order, every), loader.world_size // lanes, loader.rank // lanes,
                          lead=first_lead(loader.layout.window, aheads), stats=loader.stats)
        deal.first()
        loader.source.start(None, frozenset(), deal=deal)
    else:
        keys = None if order is None else [(p, i) for p, i in enumerate(order) if p not in done]
        loader.source.start(keys, frozenset(done))
    template = filler_template(loader, order)
    trace = None
    if s.trace_dir is not None:
        cfg = loader.shared.table_cfg()
        trace = TraceWriter(trace_path(s.trace_dir, loader.loader_id, index, loader.rank), {
            "table": DGAP.hash, "cfg": cfg, "rank": loader.rank, "world_size": loader.world_size,
            "epoch": loader.epoch, "mode": s.mode, "loader": loader.loader_id, "iteration": index,
            "policy": type(loader.policy).__name__, "sharding": loader.sharding, "lanes": lanes,
            "exchange_slack": loader.layout.slack})
    replica = Replicated(loader.shared, world_size=loader.world_size // lanes, aheads=aheads, policy=loader.policy,
                         order=deal, epoch=loader.epoch)
    core = RankCore(rank=loader.rank, world_size=loader.world_size, mode=MODES[s.mode], policy=loader.policy,
                    cost=loader.cost, replica=replica, layout=loader.layout, source=loader.source,
                    oversize=s.oversize, loss_slot=LOSS_BASES[s.loss_basis], stats=loader.stats, template=template,
                    lane=loader.rank % lanes, traced=trace is not None, start_digest=loader.order_kind != "own")
    eng = Engine(core=core, source=loader.source, group=loader.group.group, timeout_s=loader.timeout_s, trace=trace,
                 stats=loader.stats, placement=loader.placement_given)
    eng.start()
    return eng
