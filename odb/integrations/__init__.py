"""Adapters that put `odb.ODBDataLoader` into training code.

* ``odb.integrations.hf``: `ODBTrainer`, `ODBSeq2SeqTrainer`, `ODBTrainerMixin` (transformers).
* ``odb.integrations.accelerate``: `ODBAccelerate` (an accelerate loop).
* ``odb.integrations.lightning``: `ODBDataModule`, `pop_loss_weight` (Lightning).
* ``odb.integrations.trl``: `ODBSFTTrainer`, `ODBSFTTrainerMixin` (TRL's SFTTrainer).
* Plain PyTorch DDP or FSDP: `TrainStream` / `micro_steps` below, with `grad_sync` for gradient
  accumulation (see ``examples/plain_ddp.py``, ``examples/fsdp2_loop.py``).

The framework-neutral contract (loss weights per accumulation window, progress
on samples, resumable state) is in ``odb.integrations._common``; this package
imports only torch, each adapter module imports its framework.
"""

from ._common import (
                      MicroStep,
                      TrainProgress,
                      TrainStream,
                      gather_rank_states,
                      grad_sync,
                      join_context,
                      micro_steps,
                      own_rank_state,
                      sample_scheduler,
                      weighted_loss,
                      window_weights,
)

__all__ = ["MicroStep", "TrainProgress", "TrainStream", "micro_steps", "window_weights", "sample_scheduler",
           "join_context", "gather_rank_states", "own_rank_state", "weighted_loss", "grad_sync"]
