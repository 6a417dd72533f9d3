"""`ODBDataLoader`: token-budget batches formed after preprocessing, aligned across DDP ranks.

Pipeline on each rank (one box per thread or process):

    inner DataLoader workers      preprocessing (dataset) + length measurement  (`source`)
        -> engine thread          the rank's core, one table row per step; one gloo all-gather
                                  of a fixed header per round                   (`engine`, `odb.core`)
        -> bounded queue          batches of round r, released after round r+1
        -> consumer (the caller)  collate_fn, StepInfo attached, the ledger      (`epoch_pass`, `ledger`)

Collectives: every rank must construct its loaders in the same order and alike (`group`), and every
rank must iterate every epoch, or all ranks must stop at the same step.  A rank that stops early is
not hidden: the others raise `odb.RankFailure` naming the round.
"""

from __future__ import annotations

import atexit
import inspect
import itertools
import warnings
import weakref
from collections.abc import Mapping
from typing import Callable, Iterator

from torch.utils.data import IterableDataset

from ..batching.collate import pad_collate
from ..core.header import header_layout
from ..core.info import LoaderStats
from ..core.placement import check_pool, placement_label
from ..errors import ConfigError
from ..settings import LoaderSettings, settings_help
from .engine import CLOSED, Engine
from .epoch_pass import Pass, check_filler, sample_fits, start_engine  # a pass reads the loader as a `PassHost`
from .group import LoaderGroup, dataset_probe, group_size, probe_stable
from .ledger import EpochLedger
from .source import Source, shard_order

__all__ = ["ODBDataLoader"]

_LOADER_IDS = itertools.count()
_OPEN: "weakref.WeakSet[ODBDataLoader]" = weakref.WeakSet()


@atexit.register
def _close_open_loaders() -> None:
    """Close the loaders still open when the interpreter exits, while it is fully alive: a gloo group
    torn down during finalization can abort the process (its worker thread frees a work that needs the
    GIL).  A loader should still be closed explicitly, at the same point on every rank."""
    for loader in list(_OPEN):
        try:
            loader.close()
        except Exception:  # noqa: BLE001 - exiting anyway; one loader's failure must not keep others open
            pass


class ODBDataLoader:
    """Online dynamic batching: variable-size batches under a cost budget, equal DDP steps.

    :param dataset: a map-style ``Dataset`` (``__getitem__`` does the preprocessing) or an
        ``IterableDataset``, which runs in every rank's own process and must yield this rank's
        shard itself (its StepInfo indices are stream positions).  A sample is a mapping with a
        1-D ``input_ids`` (see ``length_fn``); returning None drops it (counted).
    :param token_budget: the cost model's budget per rank and batch (None with a ready cost model
        or a per-resource cost mapping).
    :param collate_fn: list of samples -> a mutable mapping (the batch), run in the consumer's thread;
        default `odb.batching.pad_collate`.  Each batch carries its `odb.StepInfo` as an attribute: take
        it with `odb.pop_step_info` and weight the loss by ``info.loss_scale``.
    :param settings: a `odb.LoaderSettings`, or pass its fields as keywords (below).

    Build it after ``torch.distributed.init_process_group`` (world size 1 needs no group), in the same order
    and alike on every rank.  ``len(loader)`` is not defined: the number of batches is decided online.  Each
    ``iter(loader)`` is a pass over the epoch (`__iter__`).  Close it with `close` or a ``with`` block.
    """

    def __init__(self, dataset, token_budget=None, collate_fn: Callable | None = None, *,
                 settings: LoaderSettings | None = None, **kwargs):  # the keywords: LoaderSettings's fields
        self.closed = True  # until construction completes (close() / __del__ are then no-ops)
        self.source = None            # this rank's preprocessing (`odb.runtime.source.Source`)
        try:  # what one rank may reject by itself; the construction check then tells every rank
            self._build(dataset, token_budget, collate_fn, settings, kwargs)
            failure = None
        except Exception as e:  # noqa: BLE001 - reported to every rank, then re-raised here
            failure = e
        s = getattr(self, "settings", None)
        pg = s.process_group if s is not None else kwargs.get("process_group")
        timeout = s.timeout_s if s is not None else kwargs.get("timeout_s", LoaderSettings.timeout_s)
        try:
            self.group = LoaderGroup(  # the loader's gloo group and its construction check
                pg, float(timeout) if isinstance(timeout, (int, float)) and timeout > 0
                                      else LoaderSettings.timeout_s)
        except Exception:
            self._close_source()
            if failure is not None:
                raise failure from None
            raise
        self.rank, self.world_size = self.group.rank, self.group.world_size
        try:  # every rank's prefetch, gathered with the compared settings (or this rank's failure)
            probe = () if failure or self.group.world_size == 1 or self.order_kind != "own" else \
                dataset_probe(self.dataset, len(self.dataset))  # what this rank's dataset holds at agreed positions
            self.aheads = self.group.agree(  # every rank's prefetch, gathered
                None if failure else self.shared, 0 if failure else self.source.ahead, failure, probe=probe,
                reprobe=lambda ks: probe_stable(self.dataset, len(self.dataset), probe, ks))
        except BaseException:
            self._close_source()
            self.group.destroy()
            raise
        # compared settings and the gathered prefetches: every rank decides alike
        check_pool(self.world_size, s.lanes, s.mode, self.sharding, self.aheads, name=self.placement_given)
        self.stats = LoaderStats()
        self.ledger = EpochLedger()
        self.loader_id = next(_LOADER_IDS)
        self._passes = 0
        self._engine: Engine | None = None
        self._engine_drained = False  # the consumer saw "end" (JOIN: the engine may still run)
        self._pass = None             # a weak reference to the last pass (refused operations while it is open)
        self._epoch_chosen = False    # set_epoch since the last pass began (else a completed epoch advances)
        self.joined = 0               # open join contexts around this loader (`odb.integrations.join_context`)
        self.hinted = False           # the planner's hint was logged (once per loader: `odb.runtime.observe`)
        self.closed = False
        _OPEN.add(self)

    def _build(self, dataset, token_budget, collate_fn, settings, kwargs) -> None:
        """This rank's part of construction: the settings validated and what they derive (no collective)."""
        if settings is None:
            settings = LoaderSettings.from_kwargs({"token_budget": token_budget, **kwargs})
        elif kwargs or token_budget is not None:
            raise ConfigError(f"ODBDataLoader got settings= and also {sorted(kwargs) or ['token_budget']}; pass one")
        self.settings = s = settings
        self.placement_given = placement_label(s.placement)  # as the user wrote it, for messages
        self.dataset, self.collate_fn = dataset, collate_fn or pad_collate
        iterable = isinstance(dataset, IterableDataset)
        self.sharding = s.resolved_sharding(iterable)
        # placement="auto" resolved from the group's size and compared settings; the result is compared
        self.settings = s = s.resolved(group_size(s.process_group), self.sharding)
        self.mode, self.loss_basis, self.seed, self.timeout_s = s.mode, s.loss_basis, s.seed, float(s.timeout_s)
        self.shift_labels = s.resolved_shift(self.collate_fn)
        self.cost, self.policy = s.cost_and_policy()
        if s.filler_sample is not None:
            check_filler(s.filler_sample, self.cost, s)
        self.layout = header_layout(int(self.policy.summary_len), s.buffer_size, s.lanes, s.exchange, s.slack_bp)
        own_order = s.sampler is None and not iterable
        self.shared = s.shared(sharding=self.sharding, header_len=self.layout.length, cost=self.cost,
                               policy=self.policy, num_positions=len(dataset) if own_order else None,
                               shift_labels=self.shift_labels)
        self.source = Source(dataset, length_fn=s.length_fn, num_workers=s.num_workers, dataloader=s.dataloader or {},
                             shift_labels=self.shift_labels, worker_timeout_s=float(s.timeout_s))

    def _close_source(self) -> None:
        if self.source is not None:
            self.source.close()

    def fits(self, sample) -> bool:
        """The sample, measured as this loader measures it, fits the budget."""
        return sample_fits(sample, self.cost, self.settings)

    def _open_pass(self) -> bool:
        live = self._pass() if self._pass is not None else None
        return live is not None and live.open

    # -- epochs and order --------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.ledger.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (the loader's own shuffle uses ``seed + epoch``; forwarded to the sampler, and
        to the dataset when it has ``set_epoch``, e.g. a shuffled HF ``IterableDataset``).

        Optional: a pass that ran to its end is followed by the next epoch anyway (`__iter__`).  Another
        epoch forgets which samples of the old one were yielded.  Raises ConfigError while a pass over
        another epoch is open (its remaining batches belong to the old order).
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch must be an int >= 0, got {epoch!r}")
        if self._open_pass() and epoch != self.epoch:
            raise ConfigError(f"rank {self.rank}: set_epoch({epoch}) while a pass over epoch {self.epoch} is "
                              "open; finish iterating it, or close it first (it.close(), or let the iterator go)")
        self.ledger.set_epoch(epoch)
        self._epoch_chosen = True
        sampler = self.settings.sampler
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        if callable(getattr(self.dataset, "set_epoch", None)):
            self.dataset.set_epoch(epoch)

    def _order(self) -> list | None:
        s = self.settings
        if self.source.iterable:
            return None
        if s.sampler is not None:
            return list(iter(s.sampler))
        if self.sharding == "dealt":  # the global order; positions are global, dealt while the epoch runs
            return shard_order(len(self.dataset), 0, 1, s.shuffle, s.seed, self.epoch)
        return shard_order(len(self.dataset), self.rank, self.world_size, s.shuffle, s.seed, self.epoch)

    # -- passes ------------------------------------------------------------------------
    def __iter__(self) -> Iterator:
        """A pass over the current epoch, as torch's DataLoader: each ``iter()`` starts the epoch anew, and a
        newer iterator replaces an open one (whose next use raises ConfigError).  Two exceptions keep
        exactly-once across runs: after `load_state_dict` the pass continues from the loaded position,
        and after a pass that ran to its end without a `set_epoch` since, the next epoch begins (each
        epoch its own order, on every rank alike)."""
        if self.closed:
            raise ConfigError("this ODBDataLoader is closed; construct a new one (on every rank)")
        old = self._pass() if self._pass is not None else None
        if old is not None and old.open:
            old.replace()
        self._finish_engine()
        if self.ledger.complete and not self._epoch_chosen:
            self.set_epoch(self.epoch + 1)
        self._epoch_chosen = False
        order = self._order()
        self.ledger.start_pass(-1 if order is None else len(order))
        before = self.stats.snapshot()  # before the engine starts counting this pass's samples
        eng = start_engine(self, order, self._passes)
        self._passes += 1
        self._engine, self._engine_drained = eng, False
        it = Pass(self, eng, before)
        self._pass = weakref.ref(it)
        return it

    def __len__(self) -> int:
        """Not defined: a TypeError (what ``len()`` of an unsized iterable raises, which frameworks test for)
        naming what to use instead."""
        raise TypeError(
            "len(ODBDataLoader) is not defined: the number of batches is decided online, after preprocessing. For "
            "a learning-rate schedule count samples instead of steps: odb.integrations.sample_scheduler(optimizer, "
            "stream.progress, lr_lambda) with a TrainStream (docs/guide/plain-loop.md); to stop after a budget, "
            "TrainStream(loader, k, max_samples=...); `odb plan` predicts the number of steps")

    def __bool__(self) -> bool:
        return True  # a loader is truthy (without this, bool() would call __len__)

    def end_pass(self, unemitted0: int) -> None:
        """The pass ran to its end (called by `Pass`)."""
        self._engine_drained = True
        self.ledger.complete = True
        self.stats.epochs += 1
        left = self.stats.unemitted - unemitted0
        if left:
            warnings.warn(f"mode='quota' stopped epoch {self.epoch} on rank {self.rank} with {left} samples "
                          "unemitted (another rank ran out of data first); their indices are in "
                          "loader.stats.unemitted_indices. Use mode='pad' or 'join' to emit every sample.",
                          stacklevel=3)

    def join_engine(self, eng: Engine) -> None:
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
            self.join_engine(eng)
            return
        while eng.thread.is_alive():  # each of its collectives is bounded by timeout_s
            eng.join(1.0)
        if eng.error is not None:
            warnings.warn(f"rank {self.rank}: after this rank's data ended (join mode) the protocol failed: "
                          f"{eng.error}", stacklevel=3)

    # -- checkpointing ------------------------------------------------------------------
    @property
    def order_kind(self) -> str:
        """What decides this rank's samples: "own" (the loader's order), "sampler" or "stream"."""
        return "stream" if self.source.iterable else ("sampler" if self.settings.sampler is not None else "own")

    def state_dict(self) -> dict:
        """This rank's record of the current epoch (`odb.runtime.ledger`).  Per rank: save each rank's
        own state; resume each into the same rank, or merge every rank's (`odb.merge_states`)
        to resume on any number of ranks.  Dealt: the next pass gathers every rank's record, so all
        ranks resume together."""
        return self.ledger.state_dict(world_size=self.world_size, rank=self.rank, seed=self.seed,
                                      shuffle=self.settings.shuffle, sharding=self.sharding, order=self.order_kind,
                                      mode=self.mode)

    def load_state_dict(self, state: Mapping) -> None:
        """Resume from this rank's `state_dict()` (same rank, world size, seed and sharding), or from a
        merged state of any world size (`odb.merge_states`); strict: every field is validated
        (`odb.runtime.ledger.EpochLedger.load_state_dict`).  Refused while a pass is open."""
        if self._open_pass():
            raise ConfigError(f"rank {self.rank}: load_state_dict while a pass is open; finish or close it first")

        def positions_of(epoch: int) -> int:
            self.set_epoch(epoch)
            order = self._order()
            return -1 if order is None else len(order)
        own = self.order_kind == "own"
        self.ledger.load_state_dict(state, world_size=self.world_size, rank=self.rank, seed=self.seed,
                                    shuffle=self.settings.shuffle, sharding=self.sharding, order=self.order_kind,
                                    positions_of=positions_of,
                                    global_positions=len(self.dataset) if own else None)
        if isinstance(state, Mapping) and state.get("kind") == "global":
            self.set_epoch(self.ledger.epoch)  # the sampler and the dataset follow the merged state's epoch
        self._epoch_chosen = False  # a state saved at an epoch's end resumes with the next epoch

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Stop the engine (telling peers if mid-epoch), the workers, and the gloo group.  Idempotent.
        In JOIN mode after this rank's data ended, waits for the peers to finish the epoch (each
        collective bounded by ``timeout_s``)."""
        if self.closed:
            return
        self.closed = True
        _OPEN.discard(self)
        try:
            self._finish_engine()
        finally:
            self._close_source()
            self.group.destroy()

    def __enter__(self) -> "ODBDataLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


ODBDataLoader.__init__.__signature__ = LoaderSettings.loader_signature()  # the documented keywords, for help()
ODBDataLoader.__doc__ = inspect.cleandoc(ODBDataLoader.__doc__) + "\n\n" + inspect.cleandoc(settings_help())
