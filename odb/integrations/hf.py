"""ODB in the Hugging Face `transformers.Trainer` (and its subclasses).

Use `ODBTrainer` in place of `Trainer`, `ODBSeq2SeqTrainer` in place of `Seq2SeqTrainer`, or put `ODBTrainerMixin`
first in the bases of any other Trainer subclass (for TRL's ``SFTTrainer``: `odb.integrations.trl.ODBSFTTrainer`)::

    trainer = ODBTrainer(model=model, args=args, train_dataset=ds, odb_loader_kwargs={"token_budget": 4096})
    trainer.train()

What the mixin changes, all through the Trainer's public override points (`get_train_dataloader`,
`get_batch_samples`, `compute_loss`, `create_scheduler`, `train`, a `TrainerCallback`); no Trainer attribute or
class is patched (`ODBTrainerMixin` gives the rules):

* the TRAIN loader: an `odb.ODBDataLoader` over ``train_dataset``, one continuous stream over epochs;
* the loss: each micro-batch's mean loss times its window weight, so a window's loss is the global per-token mean;
* progress: the LR schedule, the stop (``max_samples``) and the progress bar run on emitted samples;
* an ``IterableDataset``: stops at ``max_samples``, or runs ``num_train_epochs`` whole passes;
* checkpoints: every rank writes and restores ``odb_rank<r>.pt`` in the Trainer's ``checkpoint-<step>`` folder.

Limits: mode ``"join"`` is refused (`ConfigError`): the Trainer has no public hook that wraps its loop in DDP
``Join``; use ``"pad"`` (default) or ``"quota"``.  ``auto_find_batch_size`` and hyperparameter search are not
supported.  Columns are not removed from a ``datasets.Dataset`` (the collate function must build model inputs
itself).  Without a ``data_collator`` of yours the batches are `odb.batching.pad_collate`'s (the Trainer's default
collators cannot batch variable-length labels).  ``per_device_train_batch_size`` must stay at its default (the
token budget sizes each batch).  Label tokens are counted as the model's loss sees them: ``labels[1:]`` of each
sample (a causal LM shifts labels), or as given for an encoder-decoder model; a causal LM with
``shift_labels=False`` must set ``labels[0] = -100`` in every sample, checked per batch (`ConfigError` otherwise).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import sys
import warnings

import torch
from transformers import (
    DataCollatorWithPadding,
    ProgressCallback,
    Seq2SeqTrainer,
    Trainer,
    TrainerCallback,
    default_data_collator,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ..batching.collate import pad_collate
from ..errors import ConfigError
from ..runtime.ledger import merge_states
from ._common import (
    TrainProgress,
    TrainStream,
    hf_schedule,
    loader_setting,
    make_loader,
    option,
    sample_scheduler,
    weighted_loss,
    window_weights,
)

__all__ = ["ODBTrainerMixin", "ODBTrainer", "ODBSeq2SeqTrainer", "STATE_FILE"]

STATE_FILE = "odb_rank{rank}.pt"
# max_steps of a run without a sample budget (an IterableDataset run by epochs): the Trainer needs a
# positive bound; the stream's end stops the run
_UNBOUNDED = 2 ** 62
# schedules that need no horizon (the total number of samples), for a run without a sample budget
_NO_HORIZON = ("constant", "constant_with_warmup")


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
    """The stream's epochs back to back, as one iterable of MicroSteps without ``__len__``.

    ``pass_samples``: the global samples of the first pass seen from its start to its end (None before),
    the length of an epoch of an IterableDataset for the logged epoch.
    """

    def __init__(self, stream: TrainStream, max_epochs: int, resumed: bool):
        self.stream, self.max_epochs, self.resumed = stream, max_epochs, resumed
        self.pass_samples: int | None = None

    def __iter__(self):
        partial = self.resumed  # a restored stream first finishes the epoch it stopped in
        while self.stream.progress.epoch < self.max_epochs:
            start = self.stream.progress.samples
            yield from self.stream.epoch()
            if not partial and self.pass_samples is None:
                self.pass_samples = self.stream.progress.samples - start
            partial = False


class _ODBCallback(TrainerCallback):
    def __init__(self, trainer: "ODBTrainerMixin"):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        t.odb_progress.optimizer_steps = state.global_step
        state.epoch = t.odb_epoch()  # the Trainer's own is step / max_steps-based; max_steps is only a bound
        if t.odb_max_samples is not None and t.odb_progress.samples >= t.odb_max_samples:
            control.should_training_stop = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        state.epoch = self.trainer.odb_epoch()  # read by the final metrics
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


class _SampleProgress(ProgressCallback):
    """The Trainer's progress bar, counted in global samples of ``max_samples`` (of no total without a
    budget): the number of optimizer steps is decided online, so a bar over ``max_steps`` (a bound) would
    stop short.  Evaluation bars and log lines are the parent's."""

    def __init__(self, trainer: "ODBTrainerMixin"):
        super().__init__()
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        from tqdm.auto import tqdm

        self.current_step = self.trainer.odb_progress.samples  # after a resume: the restored count
        if state.is_world_process_zero:
            self.training_bar = tqdm(total=self.trainer.odb_max_samples, initial=self.current_step, unit="samples",
                                     dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kwargs):
        samples = self.trainer.odb_progress.samples
        if state.is_world_process_zero:
            self.training_bar.update(samples - self.current_step)
        self.current_step = samples


def _resume_state(folder: str, loader) -> dict:
    """This rank's stream state from a checkpoint folder's ``odb_rank<r>.pt`` files: its own file when the
    checkpoint was written by as many ranks, else every file merged (elastic resume; `odb.merge_states`)."""
    paths = sorted(glob.glob(os.path.join(folder, STATE_FILE.format(rank="*"))))
    if not paths:
        raise ConfigError(f"resuming from {folder}: no {STATE_FILE.format(rank='<r>')} there (not written by an "
                          "ODBTrainer); the loader position cannot be restored")
    states = [torch.load(p, weights_only=False) for p in paths]
    sizes = {s.get("world_size") for s in states}
    if sizes == {loader.world_size} and len(states) == loader.world_size:
        return next(s for s in states if s.get("rank") == loader.rank)
    return merge_states(states)


class ODBTrainerMixin:
    """Trainer mixin: the train loader is an `odb.ODBDataLoader` (the rules below).

    Extra keyword arguments: ``odb_loader_kwargs`` (a dict passed to
    `odb.ODBDataLoader`, or an `odb.LoaderSettings`; ``collate_fn`` defaults to ``data_collator``
    when you gave one, else `odb.batching.pad_collate`; ``seed`` to ``args.seed``, ``num_workers`` to
    ``args.dataloader_num_workers``, ``shift_labels`` to False for an encoder-decoder model)
    and ``max_samples`` (the sample budget; default
    ``num_train_epochs * len(train_dataset)``; for an IterableDataset, None runs
    ``num_train_epochs`` whole passes: below).  After training,
    ``odb_progress`` holds the samples, micro-steps, optimizer steps and epochs
    run, and ``odb_loader.stats`` the loader's counters.

    * The TRAIN loader is an `odb.ODBDataLoader` over ``train_dataset`` (evaluation and test loaders are the
      Trainer's own).  It is handed to the Trainer as one continuous stream over epochs, without ``__len__``: the
      Trainer's own epoch arithmetic (``len // accumulation``) would truncate or stretch an epoch of variable-size
      batches.  The loader's epoch is set by the stream, once per pass over the data, not by the Trainer.
    * Loss: each accumulation window of ``gradient_accumulation_steps`` batches is fetched at once (the Trainer
      already prefetches it), and each micro-batch's mean loss is multiplied by ``W * l_i / sum_window g_j`` (see
      ``odb.integrations._common``).  The Trainer's own ``num_items_in_batch`` path is not used for training (it
      would need one extra all-gather per step, and would count PAD fillers); ``loss_is_scaled_for_ga = True`` tells
      ``training_step`` the loss is already normalized over the window.  The result equals the global per-token mean
      over every rank and micro-batch of the window (tested numerically against the concatenated global batch).
    * Progress: the LR schedule (``args.lr_scheduler_type``, any LambdaLR schedule) runs on emitted samples:
      ``num_training_steps`` is the sample budget and the warmup is ``args.get_warmup_steps(budget)`` (so
      ``warmup_steps < 1`` is a share of the samples, and ``warmup_steps >= 1`` is read as samples).  The run stops
      after the optimizer step at which ``max_samples`` global samples (default
      ``num_train_epochs * len(train_dataset)``) have been emitted.  If ``args.max_steps <= 0`` it is set to the
      budget, an upper bound on optimizer steps that the Trainer needs for its bookkeeping (set before the Trainer
      checks it, so an ``IterableDataset`` needs no ``max_steps``); a positive ``max_steps`` stays an extra cap.
      The last window of the run is completed with zero-weight repeats of its last batch so the optimizer steps at
      the same micro-step on every rank.  The progress bar counts global samples (of ``max_samples``), and the
      logged ``epoch`` is ``samples / len(train_dataset)`` (for an ``IterableDataset``: the completed passes until
      one pass was seen whole, then ``samples / samples of that pass``): the Trainer's own bar and epoch are
      computed from ``max_steps``, which is only a bound here.
    * An ``IterableDataset`` (a ``datasets.IterableDataset`` after ``split_dataset_by_node``, or any torch one that
      yields this rank's shard): with ``max_samples`` the run stops there; without it, it runs ``num_train_epochs``
      whole passes (an int), and its end is the stream's end, the same step on every rank in PAD mode.  Without
      ``max_samples`` the number of samples is not known in advance, so only a schedule that needs no horizon runs
      (``constant``, or ``constant_with_warmup`` with ``warmup_steps`` samples, ``>= 1``); another is refused
      (`ConfigError`) rather than guessed.  The loader forwards ``set_epoch`` to the dataset, so a shuffled
      ``datasets.IterableDataset`` gets a new order every epoch.
    * Checkpoints: every rank writes ``odb_rank<r>.pt`` (loader state + progress) into the Trainer's
      ``checkpoint-<step>`` folder; ``train(resume_from_checkpoint=...)`` restores it, and ``args.ignore_data_skip``
      is set True because the loader resumes at its exact position (skipping batches on top would lose data).

    Limits: module doc.
    """

    # The loss returned by compute_loss is normalized over the whole window (public Trainer switch).
    loss_is_scaled_for_ga = True
    # Whether the parent's compute_loss returns a finite loss, connected to the graph, for a micro-batch
    # without any label token.  False for the Trainer's (a transformers model's mean is 0/0 = nan there), so
    # a zero-weight micro-batch asks for the outputs (same forward) and backpropagates logits.sum() * 0;
    # True where the parent clamps its token count (TRL's SFTTrainer), which then needs no outputs.
    odb_finite_loss_without_labels = False

    def __init__(self, *args, odb_loader_kwargs=None, max_samples: int | None = None, **kwargs):
        sft = getattr(sys.modules.get("trl.trainer.sft_trainer"), "SFTTrainer", None)
        if sft is not None and isinstance(self, sft) and not self.odb_finite_loss_without_labels:
            raise ConfigError(
                f"{type(self).__name__} puts ODBTrainerMixin over TRL's SFTTrainer: SFTTrainer recomputes the outputs "
                "without gradients when they are asked for, which the mixin does for a PAD filler (the backward "
                "then fails, and every micro-step would cost a second forward); use "
                "odb.integrations.trl.ODBSFTTrainer, or ODBSFTTrainerMixin first in the bases of your subclass")
        if max_samples is not None and (isinstance(max_samples, bool) or int(max_samples) != max_samples
                                        or max_samples <= 0):
            raise ConfigError(f"max_samples must be a positive int (global samples), got {max_samples!r}")
        # An IterableDataset: the Trainer refuses max_steps <= 0 in its constructor; set the bound first
        # (Trainer(model, args, data_collator, train_dataset, ...), positionally or by keyword).
        targs = kwargs.get("args", args[1] if len(args) > 1 else None)
        user_collator = kwargs.get("data_collator", args[2] if len(args) > 2 else None)
        train_dataset = kwargs.get("train_dataset", args[3] if len(args) > 3 else None)
        if targs is not None and train_dataset is not None and not hasattr(train_dataset, "__len__") \
                and targs.max_steps <= 0:
            targs.max_steps = int(max_samples) if max_samples is not None else _UNBOUNDED
        super().__init__(*args, **kwargs)
        self.odb_loader_kwargs = dict(odb_loader_kwargs or {}) if not hasattr(odb_loader_kwargs, "buffer_size") \
            else odb_loader_kwargs  # a dict of ODBDataLoader keywords or an odb.LoaderSettings
        # The Trainer's own default collators stack or pad to the longest of fixed-size batches and leave
        # variable-length labels alone; without a collator of the user's, ODB's pads every key.
        self.odb_collate_fn = pad_collate if user_collator is None and (
            self.data_collator is default_data_collator or isinstance(self.data_collator, DataCollatorWithPadding)) \
            else self.data_collator
        self._odb_check_batch_size()
        if option(self.odb_loader_kwargs, "mode", "pad") == "join":
            raise ConfigError(
                "ODBTrainer with mode='join': the HF Trainer has no public hook to run its loop inside DDP "
                "Join, so a rank that runs out of batches first would leave its peers blocked in the "
                "gradient all-reduce; use mode='pad' (the default: equal step counts, zero-weight fillers)")
        self.odb_stream: TrainStream | None = None
        self._odb_samples0 = 0  # the stream's samples when this train() began (a resume's restored count)
        self._odb_epochs: _EpochStream | None = None
        self.odb_loader = None
        self._odb_resume_dir: str | None = None
        if self.train_dataset is None:
            raise ConfigError("ODBTrainer: training requires a train_dataset")
        self._odb_len = len(self.train_dataset) if hasattr(self.train_dataset, "__len__") else None
        if max_samples is None and self._odb_len is not None:
            max_samples = int(self.args.num_train_epochs * self._odb_len)
            if max_samples <= 0:
                raise ConfigError(f"num_train_epochs * len(train_dataset) = {max_samples}: nothing to train on")
        self.odb_max_samples = int(max_samples) if max_samples is not None else None
        if self.odb_max_samples is None:
            self._odb_check_unbounded()
        if self.args.max_steps <= 0:
            self.args.max_steps = self.odb_max_samples or _UNBOUNDED
        self.args.ignore_data_skip = True
        if self.args.warmup_steps >= 1:
            warnings.warn(f"ODBTrainer runs the LR schedule on samples: warmup_steps={self.args.warmup_steps} "
                          "is read as a number of samples; use warmup_steps < 1 for a share of the sample budget")
        shares = [k for k in ("logging_steps", "save_steps", "eval_steps")
                  if 0 < (getattr(self.args, k, None) or 0) < 1]
        if shares:
            warnings.warn(f"{', '.join(shares)} < 1 is a share of max_steps={self.args.max_steps}, which ODBTrainer "
                          "sets to the sample budget, an upper bound on optimizer steps (their number is decided "
                          "online); the share would be of that bound: give a number of optimizer steps (>= 1)")
        if self.pop_callback(ProgressCallback) is not None:  # present unless disable_tqdm
            self.add_callback(_SampleProgress(self))
        self.add_callback(_ODBCallback(self))

    def _odb_check_batch_size(self) -> None:
        """``per_device_train_batch_size`` has no meaning here (the token budget sizes each batch), and HF
        computes its throughput figures from it: refused unless it is left at its default."""
        field = next(f for f in dataclasses.fields(type(self.args)) if f.name == "per_device_train_batch_size")
        if self.args.per_device_train_batch_size != field.default:
            raise ConfigError(
                f"ODBTrainer with per_device_train_batch_size={self.args.per_device_train_batch_size}: ODB forms "
                "each batch from as many samples as fit token_budget (in odb_loader_kwargs), so a fixed batch size "
                f"would be ignored; leave it at its default ({field.default}), and size batches with token_budget")

    def _odb_check_unbounded(self) -> None:
        """A run without a sample budget (an IterableDataset by epochs): whole passes, a schedule without horizon."""
        epochs = self.args.num_train_epochs
        if int(epochs) != epochs or epochs < 1:
            raise ConfigError(
                f"ODBTrainer with an IterableDataset and num_train_epochs={epochs}: a share of a pass over a stream "
                "of unknown length cannot be found in advance; give a whole number of epochs, or "
                "max_samples=<global samples to train on>")
        name = str(getattr(self.args.lr_scheduler_type, "value", self.args.lr_scheduler_type))
        if name not in _NO_HORIZON or (name == "constant_with_warmup" and 0 < self.args.warmup_steps < 1):
            raise ConfigError(
                f"ODBTrainer with an IterableDataset and no max_samples: lr_scheduler_type={name!r} needs the total "
                "number of samples (its horizon), which a stream does not tell in advance, and guessing it would "
                "give another schedule; pass max_samples=<global samples to train on> (the run then also stops "
                "there), or use lr_scheduler_type='constant' (or 'constant_with_warmup' with warmup_steps >= 1, "
                "read as samples)")

    # -- data ---------------------------------------------------------------------------------------------
    def _odb_max_epochs(self) -> int:
        if self.odb_max_samples is None:
            return int(self.args.num_train_epochs)  # an IterableDataset by epochs: whole passes
        if self._odb_len:
            return -(-self.odb_max_samples // self._odb_len)
        return _UNBOUNDED  # IterableDataset: the sample budget alone ends the run

    def odb_epoch(self) -> float:
        """Epochs run: ``samples / len(train_dataset)``; for an IterableDataset, ``samples / (samples of
        one pass)`` once a whole pass was seen (every pass of a stream is taken to be as long as the first),
        the completed passes before."""
        p = self.odb_progress
        if self._odb_len:
            return p.samples / self._odb_len
        seen = self._odb_epochs.pass_samples if self._odb_epochs is not None else None
        return p.samples / seen if seen else float(p.epoch)

    def get_train_dataloader(self):
        """The train stream over an `odb.ODBDataLoader` (`ODBTrainerMixin`); restores it when resuming."""
        if self.odb_loader is not None:
            self.odb_loader.close()
        self.odb_loader = make_loader(self.train_dataset, self.odb_loader_kwargs, collate_fn=self.odb_collate_fn,
                                      seed=self.args.seed, num_workers=self.args.dataloader_num_workers,
                                      shift_labels=self._odb_shift_default())
        self.odb_stream = TrainStream(self.odb_loader, 1, max_samples=self.odb_max_samples)
        if self._odb_resume_dir is not None:
            self.odb_stream.load_state_dict(_resume_state(self._odb_resume_dir, self.odb_loader))
        self._odb_samples0 = self.odb_stream.progress.samples
        self._odb_epochs = _EpochStream(self.odb_stream, self._odb_max_epochs(), self._odb_resume_dir is not None)
        return self._odb_epochs

    def _odb_shift_default(self) -> bool | None:
        """How the loader counts label tokens unless the user says: as the shifted loss of a causal LM sees
        them (None: the loader's default), or as given for an encoder-decoder model (its loss reads every
        label)."""
        model = self.accelerator.unwrap_model(self.model) if self.model is not None else None
        base = getattr(model, "get_base_model", lambda: model)()
        return False if getattr(getattr(base, "config", None), "is_encoder_decoder", False) else None

    def log(self, logs: dict, *args, **kwargs) -> None:
        """`Trainer.log`, with the training throughput counted in emitted samples: the Trainer's own multiplies
        optimizer steps by ``per_device_train_batch_size``, which ODB does not use."""
        runtime = logs.get("train_runtime")
        if "train_samples_per_second" in logs and runtime and self.odb_stream is not None:
            logs["train_samples_per_second"] = round((self.odb_progress.samples - self._odb_samples0) / runtime, 3)
        super().log(logs, *args, **kwargs)

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
            # The stream ended (the last epoch of a run by epochs, or QUOTA mode ended an epoch short of the
            # budget): the same step on every rank; the Trainer leaves its loop on this flag.
            self.control.should_training_stop = True
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
        if weight != 0.0 or self.odb_finite_loss_without_labels:
            # one forward; the outputs only if the caller asked (a parent may recompute them: TRL does)
            res = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=None)
            loss, outputs = res if return_outputs else (res, None)
            loss = loss * weight
        else:
            # A zero-weight batch may have no label at all (mean = 0/0 = nan); keep a graph through every
            # parameter that reached the output so DDP's all-reduce still runs, with zero gradient.
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=None)
            loss = weighted_loss(outputs, 0.0)
        return (loss, outputs) if return_outputs else loss

    # -- schedule and resume -------------------------------------------------------------------------------
    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """The ``args.lr_scheduler_type`` schedule over the sample budget, advanced by emitted samples."""
        if self.lr_scheduler is None:
            horizon = self.odb_max_samples or _UNBOUNDED  # unbounded: a schedule without horizon (checked)
            fn = hf_schedule(self.args.lr_scheduler_type, horizon, self.args.get_warmup_steps(horizon),
                             **(self.args.lr_scheduler_kwargs or {}))
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
