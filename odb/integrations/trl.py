"""ODB in TRL's `trl.SFTTrainer`: `ODBSFTTrainer`.

Use it in place of ``SFTTrainer`` (or put `ODBSFTTrainerMixin` first in the bases of a subclass of
it; `odb.integrations.hf.ODBTrainerMixin` alone over an SFTTrainer is refused).  Every ``SFTTrainer``
argument works as before (``peft_config``, ``SFTConfig(padding_free=True)``, a ``datasets.Dataset`` or
``IterableDataset``, text or already tokenized), plus the `odb.integrations.hf.ODBTrainerMixin` ones
(``odb_loader_kwargs``, ``max_samples``)::

    trainer = ODBSFTTrainer(model=model, args=SFTConfig(...), train_dataset=ds, processing_class=tok,
                            odb_loader_kwargs={"token_budget": 4096})
    trainer.train()

Everything the HF adapter does applies (`ODBTrainerMixin`): the train loader is an `odb.ODBDataLoader`
over the dataset SFTTrainer prepared (tokenized, labels built, truncated), collated by SFTTrainer's
own ``data_collator``; the loss of each micro-batch is SFTTrainer's mean over its label tokens times
the window weight; progress, the schedule and checkpoints run on samples.  What differs:

* One forward per micro-step.  SFTTrainer computes the loss with a fused LM head that never builds the
  logits, and it recomputes the outputs without gradients when they are asked for
  (``return_outputs=True``).  The HF mixin asks for them on a zero-weight micro-batch (a PAD filler), to
  build a graph-connected zero from the logits; under SFTTrainer that costs a second forward and
  returns logits with no graph (``element 0 of tensors does not require grad``).  SFTTrainer's loss is
  already finite and connected without any label token (it clamps its token count, and its fused
  head keeps the graph connected when no label is valid), so here the loss is ``loss * weight`` for every
  micro-batch, fillers included (``odb_finite_loss_without_labels``), and the outputs are never asked for.
* Label counting: SFTTrainer's loss is the shifted causal-LM loss (each sample's targets are
  ``labels[1:]``, in padded and in padding-free batches alike), so the loader must count
  ``shift_labels=True``: the loader's default; ``False`` (in a dict or a ``LoaderSettings``) is refused, and so
  is a ``loss_basis`` other than ``"label_tokens"``.
* ``padding_free=True`` (or packing with the ``bfd`` strategies): the collator concatenates the
  batch into one row, so a batch costs its tokens, not ``n * longest``: ``cost="packed"`` is the
  default for a dict of ``odb_loader_kwargs`` that sets no ``cost``.

Limits: SFTTrainer's logged ``num_tokens``, ``entropy`` and ``mean_token_accuracy`` include the PAD
fillers' tokens (they are SFTTrainer's metrics of every forward).  ``compute_loss_func`` and
``label_smoothing_factor > 0`` make SFTTrainer itself run a second forward (its deprecated full-logits
paths), and the MoE auxiliary loss is multiplied by the window weight like the token loss; these
are not covered by the tests.  Mode ``"join"`` is refused, as in `odb.integrations.hf`.
"""

from __future__ import annotations

from trl import SFTTrainer

from ..errors import ConfigError
from ._common import option
from .hf import ODBTrainerMixin

__all__ = ["ODBSFTTrainerMixin", "ODBSFTTrainer"]


class ODBSFTTrainerMixin(ODBTrainerMixin):
    """`ODBTrainerMixin` for `trl.SFTTrainer` and its subclasses: put it first in the bases
    (``class MyODBSFT(ODBSFTTrainerMixin, MySFTTrainer)``); module doc."""

    # SFTTrainer's loss over a batch without label tokens is 0 / clamp(0, 1) = 0, connected to every
    # parameter that reached the head: a filler needs no outputs (and asking for them costs a forward).
    odb_finite_loss_without_labels = True

    def __init__(self, *args, odb_loader_kwargs=None, **kwargs):
        super().__init__(*args, odb_loader_kwargs=odb_loader_kwargs, **kwargs)
        if isinstance(self.odb_loader_kwargs, dict):
            self.odb_loader_kwargs.setdefault("shift_labels", True)
            if self.padding_free:
                self.odb_loader_kwargs.setdefault("cost", "packed")
        if option(self.odb_loader_kwargs, "shift_labels", None) is False:
            raise ConfigError(
                "ODBSFTTrainer with shift_labels=False: SFTTrainer's loss is the shifted causal-LM loss, whose "
                "targets are each sample's labels[1:]; the loader would also count labels[0] and divide the loss "
                "by too many tokens; leave shift_labels at its default (True)")
        basis = option(self.odb_loader_kwargs, "loss_basis", "label_tokens")
        if basis != "label_tokens":
            raise ConfigError(
                f"ODBSFTTrainer with loss_basis={basis!r}: SFTTrainer's loss is a mean over label tokens, so the "
                "window weights must count label tokens too; use loss_basis='label_tokens' (the default)")


class ODBSFTTrainer(ODBSFTTrainerMixin, SFTTrainer):
    """`trl.SFTTrainer` with an ODB train loader (module doc; keywords of `ODBTrainerMixin`)."""
