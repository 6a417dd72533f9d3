"""`ODBDataLoader`: token-budget batches formed after preprocessing, aligned across DDP ranks.

Pipeline on each rank (one box per thread or process):

    inner DataLoader workers      preprocessing (dataset) + length measurement
        -> engine thread          the DGAP table, one row per step; one gloo
                                  all-gather of a fixed header per round
        -> bounded queue          batches of round r, released after round r+1
        -> consumer (the caller)  collate_fn, StepInfo attached, resume bookkeeping

Collectives: every rank must construct its loaders in the same order (each
constructor creates a gloo group with ``dist.new_group``, a collective over the
default group), and every rank must iterate every epoch, or all ranks must stop
at the same step.  A rank that stops early mid-epoch is not hidden: the others
raise `odb.RankFailure` naming the round as soon as its engine tells them, or
within ``timeout_s`` if it died.
"""

from __future__ import annotations

import functools
import itertools
import queue
import signal
import time
import warnings
import weakref
from collections.abc import Mapping, MutableMapping
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import IterableDataset

from .. import __version__
from ..batching.collate import pad_collate
from ..batching.deal import DealtOrder, first_lead
from ..core.replica import Replicated
from ..core.shared import PARAMETERS, Shared, describe_cost, describe_policy, mismatches
from ..errors import ConfigError, ProtocolError, RankFailure, SampleError
from ..protocol.table import DGAP, MODES
from .engine import CLOSED, FAILED, Batch, Engine, header_layout
from .info import LOSS_BASES, STEP_INFO_KEY, LoaderStats
from .source import Source, _measure, shard_order
from .trace import TraceWriter, trace_path

__all__ = ["ODBDataLoader"]

STATE_VERSION = 2  # 2: adds 'sharding' (positions are per rank when fixed, global when dealt)
_OVERSIZE = ("alone", "skip", "error")
_LOADER_IDS = itertools.count()


def _first_usable(dataset, order: list, fits: Callable, limit: int = 16):
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


def _no_template(rank: int):
    raise SampleError(f"rank {rank} has no sample to build a PAD filler batch from (its shard of the "
                      "IterableDataset is empty so far); pass filler_sample=<a processed sample> or use "
                      "mode='join'")


class _Pass:
    """One pass over the loader (what ``iter(loader)`` returns).

    Ending it early (``break``, ``close()``, garbage collection) stops the engine,
    which tells the peers (they raise RankFailure unless they stop at the same step).
    """

    def __init__(self, loader: "ODBDataLoader", eng: Engine):
        self._loader, self._eng = loader, eng
        self._unemitted0 = loader.stats.unemitted
        self.epoch = eng.epoch
        self._open = True

    def __iter__(self) -> "_Pass":
        return self

    def __next__(self) -> MutableMapping:
        loader, eng = self._loader, self._eng
        if loader._closed:
            self._open = False
            raise ConfigError(f"rank {loader.rank}: this ODBDataLoader was closed (close(), a with block or "
                              "garbage collection) while this iterator was held; its batches are gone. Iterate a "
                              "new loader (built alike on every rank)")
        if not self._open:
            raise StopIteration
        try:
            t0 = time.perf_counter()
            kind, payload = loader._get(eng)
            loader.stats.wait_time_s += time.perf_counter() - t0
            if kind == "error":
                raise payload
            if kind == "batch":
                return loader._collate(payload, self.epoch)
        except BaseException:
            self._stop(FAILED)
            raise
        self._open = False
        loader._end_pass(eng, self._unemitted0)
        raise StopIteration

    def _stop(self, status: int) -> None:
        if self._open:
            self._open = False
            self._eng.stop(status)
            self._loader._join(self._eng)

    def close(self) -> None:
        """End this pass early (the engine tells the peers it stopped)."""
        self._stop(CLOSED)

    def __del__(self) -> None:
        try:
            self._stop(CLOSED)
        except Exception:
            pass


def _from_signal_handler(e: BaseException) -> bool:
    """True if `e` was raised by a Python signal handler (one installed now) that interrupted the code
    in `e`'s traceback: torch's SIGCHLD handler reporting a dead DataLoader worker, a user's preemption
    handler.  Such an error is not the interrupted code's (e.g. not collate_fn's) and passes unwrapped."""
    codes = set()
    for sig in signal.valid_signals():
        try:
            h = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        code = getattr(h, "__code__", None)
        if code is not None:
            codes.add(code)
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def _ranges(positions: set) -> list[list[int]]:
    out: list[list[int]] = []
    for p in sorted(positions):
        if out and out[-1][1] == p:
            out[-1][1] = p + 1
        else:
            out.append([p, p + 1])
    return out


class ODBDataLoader:
    """Online dynamic batching: variable-size batches under a cost budget, equal DDP steps.

    :param dataset: map-style ``Dataset`` (``__getitem__`` does the preprocessing) or an
        ``IterableDataset``.  An IterableDataset is iterated in every rank's own
        process, so it must yield this rank's shard itself (e.g. read
        ``torch.distributed.get_rank()``, and ``get_worker_info()`` with workers);
        its StepInfo indices are the positions in that stream.  A sample is a
        mapping with ``input_ids`` (see `length_fn`); returning None drops it (counted).
    :param token_budget: the budget of the cost model (per rank, per batch).
    :param collate_fn: list of samples -> a mutable mapping (the batch); runs in the
        consumer's thread, so its exceptions surface on the failing rank.  Default
        ``odb.batching.pad_collate`` (padded ``input_ids``/``labels``/``attention_mask``,
        other keys kept).
    :param sampler: yields this rank's own dataset indices (shards may be uneven); must
        give the same order again after ``set_epoch(e)`` for resume.  ``set_epoch`` is
        forwarded to it.  Default: a ``seed + epoch`` shuffled permutation dealt round
        robin (shards differ by at most one sample; nothing repeated or dropped).
    :param shuffle: shuffle the default shard (ignored with a sampler).
    :param sharding: how a map-style dataset without a sampler is split across ranks.
        "dealt": one ``seed + epoch`` shuffled order is dealt to the ranks while the
        epoch runs, each rank topped up as it consumes and the end dealt by measured
        cost (``odb.batching.deal``), so the ranks' total costs end about level
        instead of being set by the costliest fixed shard.  Nothing is moved between
        ranks (each preprocesses what it is dealt); every index is still emitted
        exactly once; the deal rides in the header every round already gathers
        (4 ints), plus one all-gather of the yielded positions per pass (resume).
        "fixed": each rank gets its shard up front (the round robin above).
        "auto" (default): "dealt" for a map-style dataset without ``sampler``,
        "fixed" otherwise.  Every rank must construct its loader alike.
    :param seed: seed of the default shuffle.
    :param num_workers: preprocessing workers of the inner DataLoader (0: in the engine thread).
    :param prefetch_factor: per worker, as in DataLoader (None: its default).
    :param persistent_workers: keep workers across epochs, as in DataLoader.
    :param multiprocessing_context: worker start method ("fork", "spawn", ...), as in DataLoader.
    :param worker_init_fn: as in DataLoader.
    :param buffer_size: the window W: samples per rank per round, carry included.
        Larger gives better batches and more prefetch memory (about 2W samples).
        Measured (``make bench-full``: 2 to 64 ranks, at least 8W samples per rank):
        with a padded cost, straggler efficiency averages 0.956 / 0.978 / 0.987 and
        padding 16.4% / 5.5% / 1.6% at W = 64 / 256 / 1024; with a packed cost,
        straggler efficiency averages 0.987 / 0.990 / 0.993.
    :param mode: "pad" (equal steps, zero-weight fillers, every sample once), "join"
        (every sample once; ranks finish at different steps; wrap the model in DDP
        ``Join``) or "quota" (equal steps, no fillers; stops when a rank runs dry;
        the rest is counted in ``stats.unemitted`` and warned about).
    :param cost: the cost model: "padded" | "packed" | "quadratic" | callable |
        multi-resource mapping (see ``odb.batching.make_cost_model``) or a CostModel.
    :param policy: an ``odb.batching.AlignmentPolicy`` (default ``odb.batching.default_policy()``).
    :param oversize: a sample over budget: "alone" (a batch of its own), "skip" or
        "error"; always counted in ``stats.oversize``.
    :param loss_basis: what ``StepInfo.loss_scale`` averages over: "label_tokens",
        "tokens" or "samples".
    :param shift_labels: count label tokens as a causal LM's loss sees them: the
        labels that are not -100 among ``labels[1:]`` of each sample (Hugging Face
        ``*ForCausalLM`` shifts labels by one, so position 0 is never a target).
        Default False: ``labels`` as given (right for seq2seq models, and for a
        causal LM whose preprocessing already sets ``labels[0] = -100``).  Affects
        ``StepInfo.*_label_tokens`` and so ``loss_scale`` with ``loss_basis=
        "label_tokens"``.
    :param length_fn: sample -> int or tuple of ints (sizes per resource, tokens first);
        default ``len(sample["input_ids"])``.  Runs in the workers (must be picklable
        under spawn).  Length 0 samples are skipped and counted (``stats.empty``).
    :param filler_sample: a processed sample (within the budget) used to build PAD fillers
        on a rank that has seen no sample within the budget (default: the cheapest such
        sample the rank has seen; for a map-style rank that has seen none, the first of
        its order, else dataset[0..15], that is not None and fits).  A filler never
        costs more than the budget.
    :param process_group: the data-parallel group to align (default: the whole world).
        With a subgroup, only its members construct the loader.
    :param timeout_s: how long a rank waits for its slowest peer at a header collective,
        and (with ``num_workers > 0``) for one preprocessed sample.  A peer that is *slow*
        (its consumer pausing, e.g. rank 0 alone saving a checkpoint while the others are
        a batch ahead) is waited for up to this long; past it this rank raises
        `odb.RankFailure` (a *hung* peer or worker).  A peer *dead* (its process gone) is
        seen by the transport within seconds whatever this is, and a dead worker within
        ``odb.runtime.source.POLL_S``.  Default 1800 s, torch.distributed's own default
        collective timeout: set it to at least the longest pause of one rank between
        two batches.
    :param trace_dir: if set, every rank writes a JSONL trace per pass (see `odb.runtime.trace`).

    World size 1 (or no initialized process group) needs no group.  ``len(loader)``
    is not defined: the number of batches is decided online.  Use as an iterable,
    optionally in a ``with`` block; `close` (also run by garbage collection) stops
    the engine and the workers.
    """

    def __init__(self, dataset, token_budget: int, collate_fn: Callable | None = None, *,
                 sampler=None, shuffle: bool = True, sharding: str = "auto", seed: int = 0, num_workers: int = 0,
                 prefetch_factor: int | None = None, persistent_workers: bool = False,
                 multiprocessing_context=None, worker_init_fn: Callable | None = None,
                 buffer_size: int = 256, mode: str = "pad", cost: Any = "padded", policy=None,
                 oversize: str = "alone", loss_basis: str = "label_tokens", shift_labels: bool = False,
                 length_fn: Callable | None = None, filler_sample: Mapping | None = None,
                 process_group=None, timeout_s: float = 1800.0, trace_dir: str | None = None):
        self._closed = True  # until construction completes (close() / __del__ are then no-ops)
        self._check_args(token_budget, buffer_size, mode, oversize, loss_basis, timeout_s, num_workers, seed)
        iterable = isinstance(dataset, IterableDataset)
        if iterable and sampler is not None:
            raise ConfigError("sampler= cannot be used with an IterableDataset (it yields its own stream); "
                              "drop the sampler and shard inside the dataset")
        if sharding not in ("auto", "fixed", "dealt"):
            raise ConfigError(f"sharding={sharding!r} is not valid; valid: ['auto', 'dealt', 'fixed']")
        if sharding == "auto":
            sharding = "fixed" if iterable or sampler is not None else "dealt"
        if sharding == "dealt" and (iterable or sampler is not None):
            raise ConfigError("sharding='dealt' deals one shuffled order of a map-style dataset; it cannot be "
                              "used with " + ("an IterableDataset" if iterable else "sampler=") +
                              " (that decides each rank's samples itself)")
        self.sharding = sharding
        self.dataset, self.collate_fn = dataset, collate_fn or pad_collate
        self.sampler, self.shuffle, self.seed = sampler, shuffle, int(seed)
        self.buffer_size, self.mode, self.oversize, self.loss_basis = int(buffer_size), mode, oversize, loss_basis
        if not isinstance(shift_labels, bool):
            raise ConfigError(f"shift_labels must be True or False, got {shift_labels!r}")
        self.shift_labels = shift_labels
        self.timeout_s, self.trace_dir, self.filler_sample = float(timeout_s), trace_dir, filler_sample
        self.cost, self.policy = self._make_policy(cost, policy, token_budget)
        self.token_budget = token_budget
        self._length_fn = length_fn
        if filler_sample is not None:
            self._check_filler(filler_sample)
        self.layout = header_layout(int(self.policy.summary_len), self.buffer_size)
        self.shared = self._shared(dataset)
        self._source = Source(dataset, length_fn=length_fn, num_workers=num_workers,
                              prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                              multiprocessing_context=multiprocessing_context, worker_init_fn=worker_init_fn,
                              shift_labels=shift_labels, worker_timeout_s=float(timeout_s))
        self.rank, self.world_size, self._group = self._make_group(process_group)
        self._aheads = self._agree(self._source.ahead)  # every rank's prefetch, gathered
        self.stats = LoaderStats()
        self._loader_id = next(_LOADER_IDS)
        self._epoch = 0
        self._done: set = set()      # positions of this epoch's order yielded to the user (or counted)
        self._complete = False       # the last pass of this epoch ran to its end
        self._passes = 0
        self._engine: Engine | None = None
        self._engine_drained = False  # the consumer saw "end" (JOIN: the engine may still run)
        self._pass = None             # a weak reference to the last pass (set_epoch refuses while it is open)
        self._num_positions = None   # length of this epoch's order (-1: IterableDataset), set per pass
        self._closed = False

    # -- construction helpers ---------------------------------------------------
    @staticmethod
    def _check_args(token_budget, buffer_size, mode, oversize, loss_basis, timeout_s, num_workers, seed) -> None:
        if isinstance(buffer_size, bool) or not (isinstance(buffer_size, int) and buffer_size >= 1):
            raise ConfigError(f"buffer_size must be an int >= 1 (samples per rank per round), got {buffer_size!r}")
        if mode not in MODES:
            raise ConfigError(f"mode={mode!r} is not valid; valid: {sorted(MODES)}")
        if oversize not in _OVERSIZE:
            raise ConfigError(f"oversize={oversize!r} is not valid; valid: {list(_OVERSIZE)}")
        if loss_basis not in LOSS_BASES:
            raise ConfigError(f"loss_basis={loss_basis!r} is not valid; valid: {sorted(LOSS_BASES)}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ConfigError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        if isinstance(num_workers, bool) or not (isinstance(num_workers, int) and num_workers >= 0):
            raise ConfigError(f"num_workers must be an int >= 0, got {num_workers!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"seed must be an int, got {seed!r}")
        if isinstance(token_budget, bool) or not isinstance(token_budget, (int, float, Mapping)):
            raise ConfigError(f"token_budget must be a positive number (or a mapping for a multi-resource "
                              f"cost), got {token_budget!r}")
        if isinstance(token_budget, (int, float)) and token_budget <= 0:
            raise ConfigError(f"token_budget must be > 0, got {token_budget!r}")

    @staticmethod
    def _make_policy(cost, policy, budget):
        from .. import batching
        from ..batching.base import CostModel

        if not isinstance(cost, CostModel):
            cost = batching.make_cost_model(cost, budget)
        if policy is None:
            policy = batching.default_policy()
        return cost, policy

    def _check_filler(self, sample) -> None:
        try:
            sizes, _ = _measure(sample, self._length_fn, self.shift_labels)
        except Exception as e:
            raise ConfigError(f"filler_sample cannot be measured ({type(e).__name__}: {e}); pass a processed "
                              "sample like the dataset's") from None
        if not self.cost.fits([sizes]):
            raise ConfigError(f"filler_sample has sizes {sizes}, over the budget of cost {describe_cost(self.cost)}; "
                              "every filler step would exceed the budget; pass a sample within the budget")

    def _fits(self, sample) -> bool:
        try:
            return self.cost.fits([_measure(sample, self._length_fn, self.shift_labels)[0]])
        except Exception:
            return False

    def _shared(self, dataset) -> Shared:
        """The settings every rank's replicated decisions depend on (`odb.core.shared`)."""
        # the default order (no sampler, map-style) is built on every rank from shuffle, seed and the
        # dataset's length; with a sampler or an IterableDataset each rank brings its own samples
        own_order = self.sampler is None and not isinstance(dataset, IterableDataset)
        order = f"shuffle={self.shuffle} seed={self.seed} positions={len(dataset)}" if own_order else "own"
        return Shared(protocol=f"odb {__version__} table {DGAP.hash[:16]}", window=self.buffer_size,
                      mode=self.mode, sharding=self.sharding, header_len=self.layout.length,
                      policy=describe_policy(self.policy), cost=describe_cost(self.cost),
                      loss_basis=self.loss_basis, shift_labels=self.shift_labels, order=order)

    def _make_group(self, process_group):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            if process_group is not None:
                raise ConfigError("process_group was given but torch.distributed is not initialized")
            return 0, 1, None
        base = process_group if process_group is not None else dist.group.WORLD
        rank, world_size = dist.get_rank(base), dist.get_world_size(base)
        if world_size == 1:
            return rank, 1, None
        timeout = timedelta(seconds=self.timeout_s)
        try:
            if process_group is None:
                # SYNC: every rank of the default group must construct its loaders in the same order
                group = dist.new_group(backend="gloo", timeout=timeout)
            else:
                ranks = dist.get_process_group_ranks(process_group)
                # SYNC: every member of process_group must construct its loaders in the same order
                group = dist.new_group(ranks=ranks, backend="gloo", timeout=timeout, use_local_synchronization=True)
        except RuntimeError as e:  # the store barrier of new_group timed out: a rank did not construct one
            raise RankFailure(f"rank {rank}: creating the ODBDataLoader's gloo group did not complete within "
                              f"timeout_s={self.timeout_s}: a rank died or did not construct its loader (every rank "
                              f"must construct its loaders in the same order). torch said: {str(e)[:300]}") from None
        return rank, world_size, group

    def _gather(self, what: str, absent: str, call: Callable[[], Any]) -> None:
        """Run one loader-level collective; a gloo error (timeout, a peer gone) becomes RankFailure."""
        try:
            call()
        except RuntimeError as e:
            raise RankFailure(f"rank {self.rank}: {what} did not complete within timeout_s={self.timeout_s}: a "
                              f"peer rank died or {absent}. gloo said: {str(e)[:300]}") from None

    def _agree(self, ahead: int) -> tuple[int, ...]:
        """The construction check: one fixed-shape all-gather of `Shared` (every field compared) and of
        each rank's prefetch (gathered, not compared: the deals read every rank's).  A mismatch is a
        ConfigError on every rank naming each setting and every rank's value; returns the prefetches."""
        if self._group is None:
            return (int(ahead),)
        send = torch.tensor(self.shared.vector() + [int(ahead)], dtype=torch.int64)
        every = [torch.empty_like(send) for _ in range(self.world_size)]
        # SYNC: every rank reaches this once per loader, right after creating its group
        self._gather("the construction check of ODBDataLoader", "did not construct its loader",
                     lambda: torch.distributed.all_gather(every, send, group=self._group))
        rows = [t.tolist() for t in every]
        bad = mismatches(rows)
        if bad:  # every rank gathered the same rows, so every rank takes this branch and gathers the text
            texts: list = [None] * self.world_size
            # SYNC: every rank reaches this when the construction check found a mismatch
            self._gather("the construction check's report", "did not construct its loader",
                         lambda: torch.distributed.all_gather_object(texts, self.shared.describe(), group=self._group))
            col = {name: j for j, name in enumerate(Shared.names())}
            what = "; ".join(f"{name} ({PARAMETERS[name]}): " + ", ".join(f"rank {r} {t[col[name]]}"
                                                                         for r, t in enumerate(texts))
                             for name in bad)
            raise ConfigError(f"rank {self.rank}: the ranks built this ODBDataLoader differently ({what}); every "
                              "rank must pass the same settings (and a dataset of the same length): each rank "
                              "would decide the rounds differently, repeating and losing samples")
        return tuple(row[-1] for row in rows)

    # -- epochs and order --------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (the default shuffle uses ``seed + epoch``; forwarded to the sampler, and
        to the dataset when it has ``set_epoch``, e.g. a shuffled HF ``IterableDataset``).

        A different epoch forgets which samples of the old one were yielded.  Raises ConfigError
        while a pass of another epoch is open (an iterator that has not ended and was not closed):
        its remaining batches belong to the old epoch's order.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch must be an int >= 0, got {epoch!r}")
        live = self._pass() if self._pass is not None else None
        if live is not None and live._open and epoch != self._epoch:
            raise ConfigError(f"rank {self.rank}: set_epoch({epoch}) while a pass over epoch {self._epoch} is "
                              "open; finish iterating it, or close it first (it.close(), or let the iterator go)")
        if epoch != self._epoch:
            self._done, self._complete = set(), False
        self._epoch = int(epoch)
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        if callable(getattr(self.dataset, "set_epoch", None)):
            self.dataset.set_epoch(epoch)

    def _order(self) -> list | None:
        if self._source.iterable:
            return None
        if self.sampler is not None:
            return list(iter(self.sampler))
        if self.sharding == "dealt":  # the global order; positions are global, dealt while the epoch runs
            return shard_order(len(self.dataset), 0, 1, self.shuffle, self.seed, self._epoch)
        return shard_order(len(self.dataset), self.rank, self.world_size, self.shuffle, self.seed, self._epoch)

    # -- iteration ------------------------------------------------------------------
    def __iter__(self) -> Iterator[MutableMapping]:
        if self._closed:
            raise ConfigError("this ODBDataLoader is closed; construct a new one (on every rank)")
        self._finish_engine()
        if self._complete:
            self._done, self._complete = set(), False
        it = _Pass(self, self._start_engine())
        self._pass = weakref.ref(it)
        return it

    def _end_pass(self, eng: Engine, unemitted0: int) -> None:
        self._engine_drained = True
        self._complete = True
        self.stats.epochs += 1
        left = self.stats.unemitted - unemitted0
        if left:
            warnings.warn(f"mode='quota' stopped epoch {self._epoch} on rank {self.rank} with {left} samples "
                          "unemitted (another rank ran out of data first); their indices are in "
                          "loader.stats.unemitted_indices. Use mode='pad' or 'join' to emit every sample.",
                          stacklevel=3)

    def _all_done(self) -> set:
        """Dealt sharding: the positions of this epoch yielded on ANY rank (resume), gathered."""
        if self._group is None:
            return set(self._done)
        mine = _ranges(self._done)
        every: list = [None] * self.world_size
        # SYNC: every rank reaches this once per pass, before its engine starts (same config on every rank)
        self._gather("the start-of-pass gather of dealt sharding", "did not start this pass",
                     lambda: torch.distributed.all_gather_object(every, mine, group=self._group))
        return {p for ranges in every for a, b in ranges for p in range(a, b)}

    def _start_engine(self) -> Engine:
        order = self._order()
        deal = None
        if self.sharding == "dealt":
            done = self._all_done()
            deal = DealtOrder([(p, i) for p, i in enumerate(order) if p not in done], self.world_size, self.rank,
                              lead=first_lead(self.buffer_size, self._aheads), stats=self.stats)
            deal.first()
            self._source.start(None, frozenset(), deal=deal)
        else:
            keys = None if order is None else [(p, i) for p, i in enumerate(order) if p not in self._done]
            self._source.start(keys, frozenset(self._done))
        self._num_positions = -1 if order is None else len(order)
        if self.filler_sample is not None:
            template = functools.partial(lambda s: s, self.filler_sample)
        elif order is None:
            template = functools.partial(_no_template, self.rank)
        else:
            template = functools.partial(_first_usable, self.dataset, order, self._fits)
        trace = None
        mode = MODES[self.mode]
        if self.trace_dir is not None:
            trace = TraceWriter(trace_path(self.trace_dir, self._loader_id, self._passes, self.rank), {
                "table": DGAP.hash, "cfg": {"W": self.buffer_size, "mode": mode, "header_len": self.layout.length},
                "rank": self.rank, "world_size": self.world_size, "epoch": self._epoch, "mode": self.mode,
                "loader": self._loader_id, "iteration": self._passes, "policy": type(self.policy).__name__,
                "sharding": self.sharding})
        self._passes += 1
        eng = Engine(group=self._group, rank=self.rank, world_size=self.world_size, W=self.buffer_size,
                     mode=mode, policy=self.policy, cost=self.cost, source=self._source,
                     oversize=self.oversize, loss_slot=LOSS_BASES[self.loss_basis], epoch=self._epoch,
                     stats=self.stats, timeout_s=self.timeout_s, template=template, trace=trace,
                     queue_size=max(2, self.buffer_size), layout=self.layout,
                     replica=Replicated(self.shared, world_size=self.world_size, aheads=self._aheads,
                                        policy=self.policy, order=deal, epoch=self._epoch))
        self._engine, self._engine_drained = eng, False
        eng.start()
        return eng

    def _get(self, eng: Engine):
        # Only queue.Empty is a wait: anything else raised here (torch's dead-worker error from its
        # SIGCHLD handler, a signal handler's exception, KeyboardInterrupt) goes to the caller, and
        # the pass stops through the table (FAILED).
        while True:
            try:
                return eng.out.get(timeout=1.0)
            except queue.Empty:  # make sure the engine is still alive
                if not eng.thread.is_alive() and eng.out.empty():
                    raise ProtocolError(f"rank {self.rank}: the engine thread ended without a result "
                                        f"(error: {eng.error!r})") from None

    def _collate(self, b: Batch, epoch: int) -> MutableMapping:
        info = b.info
        where = "a filler batch" if info.filler else f"dataset indices {list(info.indices)}"
        try:
            batch = self.collate_fn(b.samples)
        except Exception as e:
            if _from_signal_handler(e):  # e.g. torch's dead-worker error, raised wherever the main thread was
                raise
            raise SampleError(f"rank {self.rank}: collate_fn raised {type(e).__name__}: {e} on {where} "
                              f"(step {info.step}, round {info.round})") from e
        if not isinstance(batch, MutableMapping):
            raise SampleError(f"rank {self.rank}: collate_fn returned {type(batch).__name__} for {where}; it "
                              "must return a mutable mapping (e.g. a dict) so the StepInfo can ride along")
        batch[STEP_INFO_KEY] = info
        st = self.stats
        st.steps += 1
        if info.filler:
            st.fillers += 1
        else:
            if epoch == self._epoch:  # the ledger is this epoch's (set_epoch refuses while a pass is open)
                self._done.update(b.positions)
            st.samples += len(b.samples)
            st.real_tokens += sum(b.sizes)
            st.padded_tokens += len(b.sizes) * max(b.sizes)
        return batch

    def _join(self, eng: Engine) -> None:
        # bounded: the engine's last collective waits at most timeout_s
        if not eng.join(self.timeout_s + 10):
            warnings.warn(f"rank {self.rank}: ODB engine thread did not stop within {self.timeout_s + 10}s; "
                          "it is a daemon thread and will not block interpreter exit", stacklevel=3)

    def _finish_engine(self) -> None:
        """Wait for the previous pass's engine (JOIN: it keeps posting until the global stop)."""
        eng, self._engine = self._engine, None
        if eng is None or not eng.thread.is_alive():
            return
        if not self._engine_drained:
            eng.stop(CLOSED)
            self._join(eng)
            return
        while eng.thread.is_alive():  # each of its collectives is bounded by timeout_s
            eng.join(1.0)
        if eng.error is not None:
            warnings.warn(f"rank {self.rank}: after this rank's data ended (join mode) the protocol failed: "
                          f"{eng.error}", stacklevel=3)

    # -- checkpointing ------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Which positions of this rank's order for the current epoch were yielded.

        Samples buffered or prefetched but not yet yielded are not recorded, so a
        fresh loader given this state emits them again: across the two runs every
        sample is emitted exactly once.  Per-rank: save each rank's own state, and
        load each into the same rank (with ``sharding="dealt"`` the next pass
        gathers every rank's record, so all ranks must resume together).
        """
        return {"version": STATE_VERSION, "world_size": self.world_size, "rank": self.rank, "seed": self.seed,
                "sharding": self.sharding,
                "epoch": self._epoch,
                f"rank_{self.rank}": {"done": _ranges(self._done), "complete": self._complete,
                                      "num_positions": self._num_positions}}

    def load_state_dict(self, state: Mapping) -> None:
        """Resume from `state_dict()` of the same rank, world size and seed (strict).

        Every field is validated; anything else raises ConfigError naming the field and what was
        found: version, world size (the shards would change), rank (the state is another rank's),
        seed (the order would change), sharding (positions would mean other samples), the epoch,
        the yielded ranges (pairs ``[a, b)`` of ints, increasing, disjoint, inside this rank's
        order), the completion flag (a bool), the order's length (the dataset or sampler must be
        unchanged), missing or unknown keys.  Refused while a pass is open.
        """
        if not isinstance(state, Mapping):
            raise ConfigError(f"state must be a mapping from ODBDataLoader.state_dict, got {type(state).__name__}")
        live = self._pass() if self._pass is not None else None
        if live is not None and live._open:
            raise ConfigError(f"rank {self.rank}: load_state_dict while a pass is open; finish or close it first")
        sd = dict(state)
        version = sd.pop("version", None)
        if version != STATE_VERSION or isinstance(version, bool):
            raise ConfigError(f"state version {version!r} is not supported (this loader reads {STATE_VERSION})")
        for key, mine, why in (("world_size", self.world_size, "the per-rank shards would change"),
                               ("rank", self.rank, "this state belongs to another rank"),
                               ("seed", self.seed, "the sample order would change"),
                               ("sharding", self.sharding, "positions would mean other samples")):
            if key not in sd:
                raise ConfigError(f"state has no {key!r} key; it was not written by ODBDataLoader.state_dict")
            got = sd.pop(key)
            if got != mine or type(got) is not type(mine):
                raise ConfigError(f"cannot resume: state has {key}={got!r}, this loader has {mine!r} ({why})")
        epoch = sd.pop("epoch", None)
        mine = sd.pop(f"rank_{self.rank}", None)
        if mine is None:
            raise ConfigError(f"state lacks 'rank_{self.rank}' (the record of this rank's yielded samples)")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"state has epoch={epoch!r}; it must be an int >= 0")
        if sd:
            raise ConfigError(f"state has unknown keys {sorted(sd)}; refusing to guess what they mean")
        if not isinstance(mine, Mapping):
            raise ConfigError(f"state's rank_{self.rank} is a {type(mine).__name__}, not a mapping")
        mine = dict(mine)
        missing = {"done", "complete", "num_positions"} - set(mine)
        if missing:
            raise ConfigError(f"state's rank_{self.rank} lacks {sorted(missing)}")
        done, complete, num = mine.pop("done"), mine.pop("complete"), mine.pop("num_positions")
        if mine:
            raise ConfigError(f"rank state has unknown keys {sorted(mine)}")
        if not isinstance(complete, bool):
            raise ConfigError(f"state has complete={complete!r}; it must be True or False (whether the last pass "
                              "of the epoch ran to its end)")
        if num is not None and (isinstance(num, bool) or not isinstance(num, int) or num < -1):
            raise ConfigError(f"state has num_positions={num!r}; it must be None, -1 or an int >= 0")
        self.set_epoch(epoch)
        order = self._order()
        now = -1 if order is None else len(order)
        if num is not None and num != now:
            raise ConfigError(f"cannot resume: this rank's order had {num} positions, now {now} (the dataset "
                              "or sampler changed)")
        positions = self._ranges_to_set(done, now)
        self._done = positions
        self._complete = complete

    @staticmethod
    def _ranges_to_set(done, total: int) -> set:
        """The positions of a state's yielded ranges, validated (see `load_state_dict`)."""
        if not isinstance(done, (list, tuple)):
            raise ConfigError(f"state's done is a {type(done).__name__}; it must be a list of [start, stop] ranges")
        out: set = set()
        prev = -1
        for k, rg in enumerate(done):
            ok = isinstance(rg, (list, tuple)) and len(rg) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) for v in rg)
            if not ok or not 0 <= rg[0] < rg[1] or rg[0] < prev or (total >= 0 and rg[1] > total):
                where = f"in 0..{total}" if total >= 0 else "non-negative"
                raise ConfigError(f"state's done[{k}] = {rg!r} is not a range [start, stop) of ints with start < "
                                  f"stop, {where}, after the previous range (ends at {prev}); the state is "
                                  "damaged or from another dataset; resuming from it would skip or repeat samples")
            prev = rg[1]
            out.update(range(rg[0], rg[1]))
        return out

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Stop the engine (telling peers if mid-epoch), the workers, and the gloo group.

        Idempotent.  In JOIN mode after this rank's data ended, waits for the peers
        to finish the epoch (each collective bounded by ``timeout_s``).
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._finish_engine()
        finally:
            self._source.close()
            if self._group is not None:
                import torch.distributed as dist

                try:
                    if dist.is_initialized():
                        dist.destroy_process_group(self._group)
                except Exception:  # the default group may be gone already (interpreter exit)
                    pass
                self._group = None

    def __enter__(self) -> "ODBDataLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
