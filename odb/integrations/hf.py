"""ODB in the Hugging Face `transformers.Trainer` (and its subclasses).

Use `ODBTrainer` in place of `Trainer`, `ODBSeq2SeqTrainer` in place of
`Seq2SeqTrainer`, or put `ODBTrainerMixin` first in the bases of any other
Trainer subclass (a TRL-style SFT trainer)::

    trainer = ODBTrainer(model=model, args=args, train_dataset=ds, data_collator=collate,
                         odb_loader_kwargs={"token_budget": 4096, "mode": "pad"})
    trainer.train()

What the mixin changes, all through the Trainer's public override points
(`get_train_dataloader`, `get_batch_samples`, `compute_loss`,
`create_scheduler`, `train`, a `TrainerCallback`); no Trainer attribute or
class is patched:

* The TRAIN loader is an `odb.ODBDataLoader` over ``train_dataset`` (evaluation
  and test loaders are the Trainer's own).  It is handed to the Trainer as one
  continuous stream over epochs, without ``__len__``: the Trainer's own epoch
  arithmetic (``len // accumulation``) would truncate or stretch an epoch of
  variable-size batches.  The loader's epoch is set by the stream, once per
  pass over the data, not by the Trainer.
* Loss: each accumulation window of ``gradient_accumulation_steps`` batches is
  fetched at once (the Trainer already prefetches it), and each micro-batch's
  mean loss is multiplied by ``W * l_i / sum_window g_j`` (see
  ``odb.integrations._common``).  The Trainer's own ``num_items_in_batch`` path
  is not used for training (it would need one extra all-gather per step, and
  would count PAD fillers); ``loss_is_scaled_for_ga = True`` tells
  ``training_step`` the loss is already normalized over the window.  The result
  equals the global per-token mean over every rank and micro-batch of the
  window (tested numerically against the concatenated global batch).
* Progress: the LR schedule (``args.lr_scheduler_type``, any LambdaLR schedule)
  runs on emitted samples: ``num_training_steps`` is the sample budget and the
  warmup is ``args.get_warmup_steps(budget)`` (so ``warmup_steps < 1`` is a
  share of the samples, and ``warmup_steps >= 1`` is read as samples).  The
  run stops after the optimizer step at which ``max_samples`` global samples
  (default ``num_train_epochs * len(train_dataset)``) have been emitted.  If
  ``args.max_steps <= 0`` it is set to the budget, an upper bound on optimizer
  steps that the Trainer needs for its bookkeeping; a positive ``max_steps``
  stays an extra cap.  The last window of the run is completed with
  zero-weight repeats of its last batch so the optimizer steps at the same
  micro-step on every rank.
* Checkpoints: every rank writes ``odb_rank<r>.pt`` (loader state + progress)
  into the Trainer's ``checkpoint-<step>`` folder; ``train(resume_from_checkpoint=...)``
  restores it, and ``args.ignore_data_skip`` is set True because the loader
  resumes at its exact position (skipping batches on top would lose data).

Limits: mode ``"join"`` is refused (`ConfigError`): the Trainer has no public
hook that wraps its loop in DDP ``Join``; use ``"pad"`` (default) or
``"quota"``.  ``auto_find_batch_size`` and hyperparameter search are not
supported.  Columns are not removed from a ``datasets.Dataset`` (the collate
function must build model inputs itself).  For a causal LM with
``loss_basis="label_tokens"`` the loader must count labels as the shifted loss
sees them: pass ``shift_labels=True`` in ``odb_loader_kwargs`` (counts
``labels[1:]``), or keep the default and set ``labels[0] = -100`` in every
sample (position 0 is never a prediction target); with the default, the latter
is checked per batch, `ConfigError` otherwise.
"""

from __future__ import annotations

import glob
import os
import warnings
from typing import Any

import torch
from transformers import Seq2SeqTrainer, Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ..errors import ConfigError
from ._common import (TrainProgress, TrainStream, hf_schedule, loader_setting, make_loader, option, resharded_state,
                      sample_scheduler, window_weights)

__all__ = ["ODBTrainerMixin", "ODBTrainer", "ODBSeq2SeqTrainer", "STATE_FILE"]

STATE_FILE = "odb_rank{rank}.pt"


class _Window:
    """One accumulation window's loss weights, consumed in micro-step order.

    Travels through the Trainer as ``num_items_in_batch`` (the Trainer passes it
    unchanged from `get_batch_samples` to every `compute_loss` of the window).
    """

    def __init__(self, weights: list[float]):
        self.weights = weights
        self.next = 0

    def take(self) -> float:
        w = self.weights[self.next]
        self.next += 1
        return w


class _EpochStream:
    """The stream's epochs back to back, as one iterable of MicroSteps without ``__len__``."""

    def __init__(self, stream: TrainStream, max_epochs: int):
        self.stream, self.max_epochs = stream, max_epochs

    def __iter__(self):
        while self.stream.progress.epoch < self.max_epochs:
            yield from self.stream.epoch()


class _ODBCallback(TrainerCallback):
    def __init__(self, trainer: "ODBTrainerMixin"):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        t.odb_progress.optimizer_steps = state.global_step
        if t.odb_progress.samples >= t.odb_max_samples:
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        t = self.trainer
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        os.makedirs(folder, exist_ok=True)
        torch.save(t.odb_stream.state_dict(), os.path.join(folder, STATE_FILE.format(rank=t.odb_loader.rank)))
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.trainer.odb_loader is not None:
            self.trainer.odb_loader.close()
        return control


def _resume_state(folder: str, loader) -> dict:
    """This rank's stream state from a checkpoint folder's ``odb_rank<r>.pt`` files: its own file when the
    checkpoint was written by as many ranks, else every file merged (elastic resume; `resharded_state`)."""
    paths = sorted(glob.glob(os.path.join(folder, STATE_FILE.format(rank="*"))))
    if not paths:
        raise ConfigError(f"resuming from {folder}: no {STATE_FILE.format(rank='<r>')} there (not written by an "
                          "ODBTrainer); the loader position cannot be restored")
    states = [torch.load(p, weights_only=False) for p in paths]
    sizes = {s.get("world_size") for s in states}
    if sizes == {loader.world_size} and len(states) == loader.world_size:
        return next(s for s in states if s.get("rank") == loader.rank)
    return resharded_state(states, loader.rank, loader.world_size)


class ODBTrainerMixin:
    """Trainer mixin: the train loader is an `odb.ODBDataLoader` (module doc).

    Extra keyword arguments: ``odb_loader_kwargs`` (a dict passed to
    `odb.ODBDataLoader`, or an `odb.runtime.settings.LoaderSettings`; ``collate_fn`` defaults to ``data_collator``,
    ``seed`` to ``args.seed``, ``num_workers`` to ``args.dataloader_num_workers``)
    and ``max_samples`` (the sample budget; default
    ``num_train_epochs * len(train_dataset)``).  After training,
    ``odb_progress`` holds the samples, micro-steps, optimizer steps and epochs
    run, and ``odb_loader.stats`` the loader's counters.
    """

    # The loss returned by compute_loss is normalized over the whole window (public Trainer switch).
    loss_is_scaled_for_ga = True

    def __init__(self, *args, odb_loader_kwargs=None, max_samples: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.odb_loader_kwargs = dict(odb_loader_kwargs or {}) if not hasattr(odb_loader_kwargs, "buffer_size") \
            else odb_loader_kwargs  # a dict of ODBDataLoader keywords or an odb.runtime.settings.LoaderSettings
        if option(self.odb_loader_kwargs, "mode", "pad") == "join":
            raise ConfigError(
                "ODBTrainer with mode='join': the HF Trainer has no public hook to run its loop inside DDP "
                "Join, so a rank that runs out of batches first would leave its peers blocked in the "
                "gradient all-reduce; use mode='pad' (the default: equal step counts, zero-weight fillers)")
        self.odb_stream: TrainStream | None = None
        self.odb_loader = None
        self._odb_resume_dir: str | None = None
        if max_samples is None:
            if self.train_dataset is None or not hasattr(self.train_dataset, "__len__"):
                raise ConfigError("ODBTrainer needs max_samples when train_dataset has no len(); "
                                  "pass max_samples=<global samples to train on>")
            max_samples = int(self.args.num_train_epochs * len(self.train_dataset))
        if max_samples <= 0:
            raise ConfigError(f"max_samples must be positive, got {max_samples}")
        self.odb_max_samples = int(max_samples)
        if self.args.max_steps <= 0:
            self.args.max_steps = self.odb_max_samples
        self.args.ignore_data_skip = True
        if self.args.warmup_steps >= 1:
            warnings.warn(f"ODBTrainer runs the LR schedule on samples: warmup_steps={self.args.warmup_steps} "
                          "is read as a number of samples; use warmup_steps < 1 for a share of the sample budget")
        self.add_callback(_ODBCallback(self))

    # -- data ---------------------------------------------------------------------------------------------
    def _odb_max_epochs(self) -> int:
        if hasattr(self.train_dataset, "__len__") and len(self.train_dataset) > 0:
            return -(-self.odb_max_samples // len(self.train_dataset))
        return 2 ** 62  # IterableDataset: the sample budget alone ends the run

    def get_train_dataloader(self):
        """The train stream over an `odb.ODBDataLoader` (module doc); restores it when resuming."""
        if self.train_dataset is None:
            raise ConfigError("ODBTrainer: training requires a train_dataset")
        if self.odb_loader is not None:
            self.odb_loader.close()
        self.odb_loader = make_loader(self.train_dataset, self.odb_loader_kwargs, collate_fn=self.data_collator,
                                      seed=self.args.seed, num_workers=self.args.dataloader_num_workers)
        self.odb_stream = TrainStream(self.odb_loader, 1, max_samples=self.odb_max_samples)
        if self._odb_resume_dir is not None:
            self.odb_stream.load_state_dict(_resume_state(self._odb_resume_dir, self.odb_loader))
        return _EpochStream(self.odb_stream, self._odb_max_epochs())

    @property
    def odb_progress(self) -> TrainProgress:
        """Samples, micro-steps, optimizer steps and epochs of the current ``train()`` (resume included)."""
        return self.odb_stream.progress if self.odb_stream is not None else TrainProgress()

    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        """Fetch one accumulation window and compute its loss weights (no collective)."""
        batches = []
        for _ in range(num_batches):
            try:
                batches.append(next(epoch_iterator))
            except StopIteration:
                break
        if not batches:
            return [], None
        infos = [ms.info for ms in batches]
        batches = [ms.batch for ms in batches]
        basis = loader_setting(self.odb_loader, "loss_basis")
        if basis == "label_tokens" and not getattr(self.odb_loader, "shift_labels", False):
            self._odb_check_labels(batches)
        weights = window_weights(infos, basis, self.odb_loader.world_size)
        # The stream ended inside a window (same step on every rank in PAD/QUOTA): complete the
        # window with zero-weight repeats so the Trainer steps the optimizer at the window's end.
        while len(batches) < num_batches:
            batches.append(batches[-1])
            weights.append(0.0)
        return batches, _Window(weights)

    def _odb_check_labels(self, batches: list) -> None:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        model = self.accelerator.unwrap_model(self.model)
        base = getattr(model, "get_base_model", lambda: model)()
        if getattr(getattr(base, "config", None), "is_encoder_decoder", False):
            return
        if type(base).__name__ not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
            return
        for b in batches:
            labels = b.get("labels") if hasattr(b, "get") else None
            if torch.is_tensor(labels) and labels.dim() >= 2 and bool((labels[..., 0] != -100).any()):
                raise ConfigError(
                    "a causal-LM batch has labels[:, 0] != -100: the model shifts labels (position 0 is never "
                    "a target) but the loader counts unshifted label tokens, so the loss would be divided by "
                    "too many tokens; pass shift_labels=True in odb_loader_kwargs (the loader then counts "
                    "labels[1:]), or set labels[0] = -100 in preprocessing (it changes no target)")

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        """Training: the model's mean loss times this micro-batch's window weight; evaluation: unchanged."""
        if not isinstance(num_items_in_batch, _Window):
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        weight = num_items_in_batch.take()
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=None)
        if weight == 0.0:
            # A zero-weight batch may have no label at all (mean = 0/0 = nan); keep a graph through every
            # parameter that reached the output so DDP's all-reduce still runs, with zero gradient.
            logits = outputs["logits"] if isinstance(outputs, dict) else outputs[1]
            loss = logits.sum() * 0.0
        else:
            loss = loss * weight
        return (loss, outputs) if return_outputs else loss

    # -- schedule and resume -------------------------------------------------------------------------------
    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """The ``args.lr_scheduler_type`` schedule over the sample budget, advanced by emitted samples."""
        if self.lr_scheduler is None:
            fn = hf_schedule(self.args.lr_scheduler_type, self.odb_max_samples,
                             self.args.get_warmup_steps(self.odb_max_samples), **(self.args.lr_scheduler_kwargs or {}))
            self.lr_scheduler = sample_scheduler(optimizer or self.optimizer, self.odb_progress, fn)
        return self.lr_scheduler

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """`Trainer.train`, plus restoring the loader and progress from ``resume_from_checkpoint``."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ConfigError(f"resume_from_checkpoint=True but {self.args.output_dir} has no checkpoint")
        self._odb_resume_dir = resume_from_checkpoint or None
        return super().train(resume_from_checkpoint, *args, **kwargs)


class ODBTrainer(ODBTrainerMixin, Trainer):
    """`transformers.Trainer` with an ODB train loader (see `ODBTrainerMixin`)."""


class ODBSeq2SeqTrainer(ODBTrainerMixin, Seq2SeqTrainer):
    """`transformers.Seq2SeqTrainer` with an ODB train loader (see `ODBTrainerMixin`)."""
