"""What the loader tells the trainer about each batch, and its running counters.

`StepInfo` rides on every batch as an attribute, never as a key (so ``model(**batch)`` cannot swallow it),
until `pop_step_info` takes it; `LoaderStats` is the loader's ``stats``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import SampleError

__all__ = ["StepInfo", "LoaderStats", "StepBatch", "Receipts", "pop_step_info", "attach_step_info", "STEP_INFO_ATTR",
           "LOSS_BASES"]

STEP_INFO_ATTR = "odb_step_info"  # the attribute of a batch that holds its StepInfo until pop_step_info
_RECEIPT_ATTR = "_odb_receipts"

# loss_basis -> slot of the per-batch count triple (tokens, label tokens, samples)
LOSS_BASES = {"tokens": 0, "label_tokens": 1, "samples": 2}


@dataclass(frozen=True)
class StepInfo:
    """Metadata of one batch (one optimizer micro-step on this rank).

    :param indices: dataset indices of the samples in the batch (for an
        IterableDataset: the sample's position in this rank's stream); empty
        for a filler.
    :param filler: True for a zero-weight PAD filler (built from a real sample;
        its loss must be multiplied by ``loss_scale == 0``).
    :param local_samples: real samples in this batch.
    :param global_samples: real samples in this step's batches of every rank.
    :param local_tokens: tokens in this batch (resource 0 of the sizes).
    :param global_tokens: tokens in this step's batches of every rank.
    :param local_label_tokens: label positions that are not -100 in this batch:
        of each sample's ``labels[1:]`` with the loader's ``shift_labels=True``
        (the default: what a causal LM's loss averages over), else of ``labels``.
    :param global_label_tokens: the same, over this step's batches of every rank.
    :param loss_scale: ``world_size * local_basis / global_basis`` for the
        loader's ``loss_basis``; 0 for a filler and when ``global_basis == 0``.
        Multiply the rank's mean loss by it: DDP's gradient mean over
        ``world_size`` ranks then equals the global mean over ``loss_basis``.
        With DDP ``Join`` the joined ranks contribute zero gradients and DDP
        still divides by ``world_size``, so the same scale stays exact.
    :param step: index of this batch in the epoch on this rank (fillers included).
    :param round: the protocol round that formed it.
    :param epoch: the loader epoch.
    """

    indices: tuple
    filler: bool
    local_samples: int
    global_samples: int
    local_tokens: int
    global_tokens: int
    local_label_tokens: int
    global_label_tokens: int
    loss_scale: float
    step: int
    round: int
    epoch: int


def step_info(*, indices: tuple, filler: bool, local_samples: int, global_samples: int, local_tokens: int,
              global_tokens: int, local_label_tokens: int, global_label_tokens: int, loss_scale: float, step: int,
              round: int, epoch: int) -> StepInfo:
    """``StepInfo(...)`` from its fields, by keyword: without the frozen
    dataclass's ``__init__``, which sets each field through ``object.__setattr__`` (0.75 against 3.9 us, for each
    of a round's ~58 batches at N = 1,024).  The instance is the same: equal, immutable, its fields in its
    ``__dict__``; a test checks the parameters are the dataclass's fields in its order."""
    info = _new(StepInfo)
    _set(info, "__dict__", {
        "indices": indices, "filler": filler, "local_samples": local_samples, "global_samples": global_samples,
        "local_tokens": local_tokens, "global_tokens": global_tokens, "local_label_tokens": local_label_tokens,
        "global_label_tokens": global_label_tokens, "loss_scale": loss_scale, "step": step, "round": round,
        "epoch": epoch})
    return info


_new, _set = object.__new__, object.__setattr__


class Receipts:
    """How many of one pass's batches had their `StepInfo` taken by `pop_step_info` (the pass reads it to
    refuse a loop that never weights its loss)."""

    __slots__ = ("taken",)

    def __init__(self) -> None:
        self.taken = 0


class StepBatch(dict):
    """A collated batch: the ``dict`` that ``collate_fn`` returned, with its `StepInfo` as an attribute.

    ``model(**batch)`` passes only the keys.  A copy (``{k: v.to(dev) for k, v in batch.items()}``) drops the
    info, and `pop_step_info` on the copy then raises; take the info first.
    """

    __slots__ = (STEP_INFO_ATTR, _RECEIPT_ATTR)


def attach_step_info(batch: Any, info: StepInfo, receipts: Receipts) -> Any:
    """`batch` carrying `info` (a plain dict becomes a `StepBatch`; another mapping gets the attribute).
    Raises TypeError when the mapping takes no attributes."""
    if type(batch) is dict:
        batch = StepBatch(batch)
    setattr(batch, STEP_INFO_ATTR, info)
    setattr(batch, _RECEIPT_ATTR, receipts)
    return batch


def pop_step_info(batch: Any) -> StepInfo:
    """Take the `StepInfo` that the loader attached to `batch` (once per batch).

    Weight the batch's loss by ``info.loss_scale`` (`odb.integrations.weighted_loss`).  On more than one
    rank the loader counts the batches whose info was taken: a pass in which none was taken by its 64th
    batch, or by its end, raises `ConfigError` (an unweighted loss trains PAD fillers at full weight).
    Raises `SampleError` if `batch` carries none (it did not come from an `ODBDataLoader`, it is a copy
    of one, or its info was taken already).
    """
    info = getattr(batch, STEP_INFO_ATTR, None)
    if not isinstance(info, StepInfo):
        raise SampleError(
            f"batch (type {type(batch).__name__}) carries no {STEP_INFO_ATTR!r}: pop_step_info takes a batch "
            "yielded by odb.ODBDataLoader, once, before copying it (a copy, e.g. {k: v.to(device) for k, v in "
            "batch.items()}, does not carry it)")
    setattr(batch, STEP_INFO_ATTR, None)
    receipts = getattr(batch, _RECEIPT_ATTR, None)
    if receipts is not None:
        receipts.taken += 1
    return info


@dataclass
class LoaderStats:
    """Counters of one loader since construction (or since `load_state_dict`).

    Nothing is dropped silently: every sample the data source produced is
    either emitted or counted in ``dropped`` / ``empty`` / ``oversize_skipped``
    / ``unemitted``.
    """

    steps: int = 0              # batches handed to the user, fillers included
    fillers: int = 0            # PAD filler batches
    samples: int = 0            # real samples handed to the user
    real_tokens: int = 0        # sum of the samples' token lengths
    padded_tokens: int = 0      # sum over batches of len(batch) * longest sample
    dropped: int = 0            # preprocessing returned None
    empty: int = 0              # length 0 (skipped, counted)
    oversize: int = 0           # over the budget (emitted alone with oversize="alone")
    oversize_skipped: int = 0   # over the budget and skipped (oversize="skip")
    oversize_worst: tuple = ()  # (cost / budget, sizes, dataset index) of the costliest over-budget sample seen
    zero_label_steps: int = 0   # loss_basis="label_tokens": steps with tokens but no label token on any rank
                                # (loss_scale 0 there: nothing to learn from)
    unemitted: int = 0          # QUOTA: samples left when the epoch stopped
    unemitted_indices: list = field(default_factory=list)
    dealt: int = 0              # sharding="dealt": keys this rank was dealt (first deal included)
    reserve_taken: int = 0      # sharding="dealt": keys it took from its own reserve between deals (drops)
    ran_dry: int = 0            # sharding="dealt": passes in which its reserve ran out too (it ended early)
    rounds: int = 0             # header collectives completed
    wait_time_s: float = 0.0    # time the consumer waited on the loader
    collective_s: float = 0.0   # time the engine waited in header collectives (includes peers' lag)
    pass_time_s: float = 0.0    # wall time from each pass's first batch request to its end
    epochs: int = 0             # epochs run to completion
    budget_use_sum: float = 0.0     # over real batches formed: the cost model's utilisation (largest cost/budget)
    budget_batches: int = 0         # real batches formed (what budget_use_sum is summed over)
    step_tokens_mean: float = 0.0   # over steps with tokens: every rank's tokens / world size (gathered)
    step_tokens_max: int = 0        # over those steps: the largest rank's tokens (gathered)
    exchange_sent: int = 0          # the round exchange: batches this rank handed to others
    exchange_received: int = 0      # and received from others
    exchange_bytes: int = 0         # bytes it sent and received for them (pickled samples)
    exchange_s: float = 0.0         # time the engine spent in the exchange's transfers (includes peers' lag)
    exchange_plan_s: float = 0.0    # time this rank spent planning the exchange (a replicated decision)
    same_start: list = field(default_factory=list)  # a stream or a sampler: groups of ranks whose last pass
                                                    # began with the same samples (gathered; `odb.core.rank`)

    def as_dict(self) -> dict:
        return asdict(self)

    # -- the figures (ratios of the counters above; None where there is nothing to divide by) --
    def padding_ratio(self) -> float | None:
        """Padding positions over padded positions of this rank's real batches (``pad_collate``'s layout)."""
        return None if not self.padded_tokens else 1.0 - self.real_tokens / self.padded_tokens

    def budget_use(self) -> float | None:
        """Mean utilisation of this rank's real batches (1.0: every batch exactly at its budget)."""
        return None if not self.budget_batches else self.budget_use_sum / self.budget_batches

    def token_balance(self) -> float | None:
        """Straggler estimate from the gathered counts: sum over steps of the mean rank's tokens over the
        largest rank's (1.0: every rank got the same tokens every step; step time taken as tokens)."""
        return None if not self.step_tokens_max else self.step_tokens_mean / self.step_tokens_max

    def wait_fraction(self) -> float | None:
        """Share of the passes' wall time the consumer spent waiting for a batch."""
        return None if not self.pass_time_s else min(1.0, self.wait_time_s / self.pass_time_s)

    def figures(self) -> dict:
        """The four ratios by name."""
        return {"padding_ratio": self.padding_ratio(), "budget_use": self.budget_use(),
                "token_balance": self.token_balance(), "wait_fraction": self.wait_fraction()}

    def since(self, before: "LoaderStats") -> "LoaderStats":
        """The numeric counters gathered after `before` (a copy taken earlier), as a LoaderStats."""
        out = LoaderStats()
        for k, v in asdict(self).items():
            if isinstance(v, (int, float)):
                setattr(out, k, v - getattr(before, k))
        out.oversize_worst = self.oversize_worst  # a maximum, not a counter: the one seen so far
        return out

    def snapshot(self) -> "LoaderStats":
        """A copy of the numeric counters (for `since`)."""
        return LoaderStats(**{k: v for k, v in asdict(self).items() if isinstance(v, (int, float))})
