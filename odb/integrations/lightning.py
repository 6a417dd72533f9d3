"""ODB in PyTorch Lightning: a DataModule whose train loader is an `odb.ODBDataLoader`.

    dm = ODBDataModule(train_dataset, odb_loader_kwargs={"token_budget": 4096}, max_samples=...)

    class Module(L.LightningModule):
        def training_step(self, batch, batch_idx):
            weight, info = pop_loss_weight(batch)        # once per batch, before using it
            return self.model(**batch).loss * weight

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
            sched = dm.scheduler(opt, lambda samples: 1 - samples / dm.max_samples)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    L.Trainer(accumulate_grad_batches=K, strategy="ddp", ...).fit(Module(), datamodule=dm)

How it fits Lightning's public surface:

* ``train_dataloader()`` returns an iterable without ``__len__`` (one ODB epoch
  per ``iter()``), so Lightning neither re-wraps it with a DistributedSampler nor
  computes an epoch length; the loader shards by itself.
* Loss: batches come in windows of ``trainer.accumulate_grad_batches``; the
  weight from `pop_loss_weight` is the window weight of
  ``odb.integrations._common`` times K (Lightning divides the training_step loss
  by K).  Lightning's accumulation boundaries (every K batches from the start
  of the epoch, and the last batch) match the windows.
* Progress and the budget: `pop_loss_weight` marks the batch consumed (Lightning
  prefetches one batch, so counting at the loader would run ahead); after the
  optimizer step at which ``max_samples`` global samples were consumed it sets
  ``trainer.should_stop``.  ``scheduler`` is a LambdaLR on consumed samples.
* Checkpoints: the iterable implements ``state_dict`` / ``load_state_dict``, which
  Lightning 2.x stores with the fit loop (``"combined_loader"``) in every
  checkpoint and restores on ``fit(ckpt_path=...)``.  The state is gathered from
  all ranks (Lightning writes from rank 0 only).  Save at optimizer-step
  boundaries (``ModelCheckpoint(every_n_train_steps=...)`` or epoch end).

Limits: mode ``"join"`` is refused (`ConfigError`): Lightning 2.6 has no
uneven-input mechanism in its strategies (no DDP ``Join``), so use ``"pad"``
(default) or ``"quota"``.  Call `pop_loss_weight` exactly once per training
batch.
"""

from __future__ import annotations

from typing import Any, Callable

import lightning.pytorch as pl

from ..errors import ConfigError, SampleError
from ._common import (
    MicroStep,
    TrainProgress,
    TrainStream,
    gather_rank_states,
    make_loader,
    option,
    own_rank_state,
    sample_scheduler,
)

__all__ = ["ODBDataModule", "pop_loss_weight", "STEP_KEY"]

STEP_KEY = "odb_micro_step"


class _Step:
    """What rides in a Lightning batch: the micro-step and the datamodule that consumes it.

    A plain object (not a dataclass), so Lightning's batch transfer leaves it as is.
    """

    __slots__ = ("ms", "dm")

    def __init__(self, ms: MicroStep, dm: "ODBDataModule"):
        self.ms, self.dm = ms, dm


def pop_loss_weight(batch: dict) -> tuple[float, Any]:
    """Remove ODB's entry from a training batch; return ``(loss weight, odb.StepInfo)``.

    Multiply the batch's mean loss (mean over the loader's ``loss_basis``) by the
    weight.  Marks the batch consumed (progress, sample budget -> ``trainer.should_stop``).
    Raises `SampleError` if the batch has no ODB entry (not from `ODBDataModule`, or popped twice).
    """
    try:
        step = batch.pop(STEP_KEY)
    except (KeyError, AttributeError, TypeError):
        raise SampleError(f"batch has no {STEP_KEY!r} entry (type {type(batch).__name__}); pop_loss_weight takes "
                          "a training batch from odb.integrations.lightning.ODBDataModule, once") from None
    return step.dm._consume(step.ms), step.ms.info


class _Epochs:
    """One ODB epoch per ``iter()``; Lightning's stateful-loader interface for checkpoints."""

    def __init__(self, dm: "ODBDataModule"):
        self.dm = dm

    def __iter__(self):
        stream = self.dm.stream
        for k, ms in enumerate(stream.epoch()):
            # Lightning fetches one batch ahead of the step it trains: more unconsumed means that
            # training_step never calls pop_loss_weight (its loss unweighted, PAD fillers at full weight)
            if k - stream._consumed > 2:
                raise ConfigError(
                    f"ODBDataModule: {k} batches handed to Lightning and {stream._consumed} consumed: training_step "
                    "must call `weight, info = pop_loss_weight(batch)` on every batch and return loss * weight (the "
                    "weight makes the step's loss the global per-token mean and gives PAD fillers zero weight)")
            ms.batch[STEP_KEY] = _Step(ms, self.dm)
            yield ms.batch

    def state_dict(self) -> dict:
        # SYNC: Lightning dumps checkpoints on every rank (and writes on rank 0)
        return gather_rank_states(self.dm.stream.state_dict())

    def load_state_dict(self, sd: dict) -> None:
        loader = self.dm.stream.loader
        self.dm.stream.load_state_dict(own_rank_state(sd, loader.rank, loader.world_size))


class ODBDataModule(pl.LightningDataModule):
    """A LightningDataModule whose train loader is an `odb.ODBDataLoader` (module doc).

    :param train_dataset: map-style or iterable dataset of processed samples.
    :param odb_loader_kwargs: passed to `odb.ODBDataLoader` (``token_budget`` required), or an
        `odb.LoaderSettings`.
    :param max_samples: sample budget (global samples); None: only ``max_epochs`` ends the run.
    :param val_dataloader: an optional callable returning an ordinary loader (untouched).
    :param test_dataloader: the same, for testing.
    """

    def __init__(self, train_dataset, *, odb_loader_kwargs, max_samples: int | None = None,
                 val_dataloader: Callable | None = None, test_dataloader: Callable | None = None):
        super().__init__()
        self.train_dataset = train_dataset
        self.odb_loader_kwargs = odb_loader_kwargs if hasattr(odb_loader_kwargs, "buffer_size") \
            else dict(odb_loader_kwargs)
        if option(self.odb_loader_kwargs, "mode", "pad") == "join":
            raise ConfigError(
                "ODBDataModule with mode='join': Lightning 2.x strategies have no uneven-input (DDP Join) "
                "mechanism, so a rank that runs out of batches first would leave its peers blocked in the "
                "gradient all-reduce; use mode='pad' (the default: equal step counts, zero-weight fillers)")
        self.max_samples = max_samples
        self.progress = TrainProgress()
        self.stream: TrainStream | None = None
        self._val, self._test = val_dataloader, test_dataloader
        if val_dataloader is not None:
            self.val_dataloader = val_dataloader
        if test_dataloader is not None:
            self.test_dataloader = test_dataloader

    def train_dataloader(self):
        if self.stream is None:
            k = int(self.trainer.accumulate_grad_batches) if self.trainer is not None else 1
            loader = make_loader(self.train_dataset, self.odb_loader_kwargs)
            self.stream = TrainStream(loader, k, max_samples=self.max_samples, consume_on_yield=False,
                                      progress=self.progress)
        return _Epochs(self)

    def scheduler(self, optimizer, lr_lambda: Callable[[int], float]):
        """A LambdaLR with multiplier ``lr_lambda(consumed samples)``; use ``"interval": "step"``."""
        return sample_scheduler(optimizer, self.progress, lr_lambda)

    def _consume(self, ms: MicroStep) -> float:
        self.stream.consume(ms)
        if ms.sync and self.stream.done and self.trainer is not None:
            self.trainer.should_stop = True
        return ms.loss_weight * self.stream.k

    def teardown(self, stage: str) -> None:
        if self.stream is not None and stage == "fit":
            self.stream.loader.close()
            self.stream = None
