"""ODB in a Hugging Face Accelerate training loop.

    accelerator = Accelerator(gradient_accumulation_steps=K)
    model, optimizer = accelerator.prepare(model, optimizer)   # NOT the loader: it shards by itself
    odb_acc = ODBAccelerate(accelerator, ODBDataLoader(ds, token_budget=4096), max_samples=...)
    scheduler = odb_acc.scheduler(optimizer, lambda samples: ...)
    while not odb_acc.done:
        with odb_acc.join(model):
            for ms in odb_acc.micro_steps():
                with odb_acc.sync(model, ms):
                    odb_acc.backward(model(**ms.batch).loss, ms)
                if ms.sync:
                    optimizer.step(); scheduler.step(); optimizer.zero_grad()
                    if odb_acc.done:
                        break

Contract (see ``odb.integrations._common``): ``micro_steps`` yields one epoch
of `MicroStep` windows of K = ``accelerator.gradient_accumulation_steps``;
``backward`` multiplies the model's mean loss by the window weight (times K,
because ``Accelerator.backward`` divides by K), so the optimizer sees the
global per-basis mean of the window over all ranks.  ``sync`` is
``accelerator.no_sync(model)`` on the micro-steps that only accumulate; it is
used instead of ``accelerator.accumulate`` because the windows restart at each
epoch and accumulate's own counter does not know where an ODB epoch ends.
The scheduler runs on samples.  ``register_for_checkpointing`` is called on
construction: ``accelerator.save_state`` / ``load_state`` carry every rank's
loader position and the progress (the state is gathered from all ranks,
because accelerate writes custom objects from the main process only).

``join``: in mode "join", ``accelerator.join_uneven_inputs([model],
even_batches=False)`` on GPU setups; accelerate 1.x makes that a no-op for
CPU (MULTI_CPU) runs, so there the adapter uses torch's ``Join`` directly on
the same prepared DDP model.  PAD and QUOTA modes need neither.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from ._common import (
    MicroStep,
    TrainStream,
    gather_rank_states,
    join_context,
    own_rank_state,
    sample_scheduler,
    weighted_loss,
)

__all__ = ["ODBAccelerate"]


class ODBAccelerate:
    """Wires an `odb.ODBDataLoader` into an `accelerate.Accelerator` loop (module doc).

    :param accelerator: the run's Accelerator (its process group is the loader's default group).
    :param loader: the train ODBDataLoader; do not pass it to ``accelerator.prepare``.
    :param max_samples: sample budget (global samples); ``done`` turns True once reached.
    """

    def __init__(self, accelerator, loader, *, max_samples: int | None = None):
        self.accelerator, self.loader = accelerator, loader
        self.k = int(accelerator.gradient_accumulation_steps)
        self.stream = TrainStream(loader, self.k, max_samples=max_samples)
        accelerator.register_for_checkpointing(self)

    @property
    def progress(self):
        return self.stream.progress

    @property
    def done(self) -> bool:
        return self.stream.done

    def micro_steps(self) -> Iterator[MicroStep]:
        """One epoch of micro-steps (windows of K; ``ms.sync`` on the last of each)."""
        return self.stream.epoch()

    def sync(self, model, ms: MicroStep):
        """``accelerator.no_sync(model)`` unless the optimizer steps after `ms`."""
        return contextlib.nullcontext() if ms.sync else self.accelerator.no_sync(model)

    def backward(self, output, ms: MicroStep) -> None:
        """``accelerator.backward`` of the rank's mean loss times the window weight.

        `output` is the model's output (``.loss`` and ``.logits``; finite also when this rank's
        batch has no label token, see `odb.integrations.weighted_loss`) or the loss tensor itself
        (a mean over zero label tokens is then NaN in the value, though the gradients of a plain
        mean stay 0).
        """
        if isinstance(output, torch.Tensor):
            self.accelerator.backward(output * (ms.loss_weight * self.k))
        else:
            self.accelerator.backward(weighted_loss(output, ms.loss_weight * self.k))

    def join(self, model):
        """The uneven-input context for mode "join" (module doc); a null context otherwise."""
        if self.loader.mode != "join":
            return contextlib.nullcontext()
        if self.accelerator.multi_device:
            return self._joined(self.accelerator.join_uneven_inputs([model], even_batches=False))
        return join_context(model, self.loader)

    @contextlib.contextmanager
    def _joined(self, ctx):
        """`ctx` (accelerate's Join), the loader marked as wrapped (`odb.integrations.join_context`)."""
        self.loader.joined += 1
        try:
            with ctx:
                yield
        finally:
            self.loader.joined -= 1

    def scheduler(self, optimizer, lr_lambda: Callable[[int], float]):
        """A LambdaLR with multiplier ``lr_lambda(samples consumed)``; pass it to ``prepare`` or not."""
        return sample_scheduler(optimizer, self.stream.progress, lr_lambda)

    def state_dict(self) -> dict:
        """Every rank's loader position and progress.  SYNC: save_state runs it on every rank."""
        return gather_rank_states(self.stream.state_dict())

    def load_state_dict(self, sd: dict) -> None:
        self.stream.load_state_dict(own_rank_state(sd, self.loader.rank, self.loader.world_size))
