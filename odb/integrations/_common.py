"""Framework-neutral parts of the adapters: accumulation windows, loss weights,
sample-based progress and the LR schedule on samples, checkpointable state.

Legend: K = micro-steps per optimizer step (gradient accumulation), W = world
size, basis = the loader's ``loss_basis`` (tokens, label_tokens or samples;
label tokens as the loader counts them: ``labels`` as given, or ``labels[1:]``
with ``shift_labels=True``, what a causal LM's shifted loss averages over);
``l_i`` / ``g_i`` = this rank's / every rank's basis count in micro-step i.

The loss contract every adapter implements.  Over one accumulation window of K
micro-steps (the same K step indices on every rank), micro-step i gets::

    loss_weight_i = W * l_i / sum_{j in window} g_j

Multiply the rank's MEAN loss over its micro-batch (mean over the basis) by
``loss_weight_i`` and call backward.  DDP averages gradients over W ranks and
the window sums them, so the optimizer sees the gradient of the global mean over
the basis across all ranks and all K micro-batches:
``sum_i sum_r W * l_ri * mean_ri / (W * sum_j g_j) = sum(per-item loss) / sum(g)``.
For K == 1 this is the loader's own ``info.loss_scale``.  A filler has
``l_i == 0`` so its weight is 0; a window with no basis item at all gets weight
0 everywhere (nothing to learn from; still a well-formed backward on every rank).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

from ..errors import ConfigError

__all__ = ["MicroStep", "window_weights", "micro_steps", "TrainProgress", "TrainStream", "sample_scheduler",
           "join_context", "loader_setting", "gather_rank_states", "own_rank_state", "BASIS_FIELDS", "weighted_loss",
           "make_loader", "option", "grad_sync"]

# loss_basis -> (local field, global field) of odb.StepInfo
BASIS_FIELDS = {
    "tokens": ("local_tokens", "global_tokens"),
    "label_tokens": ("local_label_tokens", "global_label_tokens"),
    "samples": ("local_samples", "global_samples"),
}


def option(options: Any, name: str, default: Any = None) -> Any:
    """A setting of an adapter's ``odb_loader_kwargs``: a dict of `odb.ODBDataLoader` keywords or a
    `odb.LoaderSettings`."""
    if isinstance(options, dict):
        return options.get(name, default)
    return getattr(options, name, default)


def make_loader(dataset, options: Any, **defaults):
    """An `odb.ODBDataLoader` from an adapter's ``odb_loader_kwargs`` (a dict of keywords, to which the
    adapter's `defaults` apply where the dict leaves them out, or a `LoaderSettings`, used as it is;
    ``collate_fn`` is not a setting and comes from `defaults` either way unless the dict sets it)."""
    from ..runtime import ODBDataLoader

    collate = defaults.pop("collate_fn", None)
    if isinstance(options, dict):
        kw = {**defaults, **options}
        return ODBDataLoader(dataset, collate_fn=kw.pop("collate_fn", collate), **kw)
    return ODBDataLoader(dataset, collate_fn=collate, settings=options)


def loader_setting(loader: Any, name: str) -> Any:
    """Read a constructor setting (``mode``, ``loss_basis``, ``world_size``) from an ODBDataLoader."""
    try:
        return getattr(loader, name)
    except AttributeError:
        raise ConfigError(
            f"{type(loader).__name__} has no {name!r}; the ODB adapters take an odb.ODBDataLoader "
            "(or an object exposing mode, loss_basis and world_size)") from None


def _part(output: Any, name: str, k: int):
    if isinstance(output, (tuple, list)):
        return output[k]
    if isinstance(output, dict) or hasattr(output, "keys"):
        return output[name]
    return getattr(output, name)


def weighted_loss(output: Any, weight: float) -> torch.Tensor:
    """The loss to backpropagate for one micro-batch: ``loss * weight``, finite when the weight is 0.

    `output` is the model's output (``.loss`` and ``.logits``, or keys ``"loss"`` and ``"logits"``:
    a transformers ``ModelOutput``) or a ``(loss, logits)`` pair; `weight` is ``MicroStep.loss_weight``
    or ``StepInfo.loss_scale``.  With ``weight == 0`` (a filler, or a batch with no label token on this
    rank: its mean loss is 0/0 = NaN, and NaN * 0 is NaN in the value you log and accumulate) it
    returns ``logits.sum() * 0.0``: zero, finite, and connected
    to every parameter that reached the output, so DDP's all-reduce still runs, with zero gradients.
    """
    if weight == 0:
        return _part(output, "logits", 1).sum() * 0.0
    try:
        loss = _part(output, "loss", 0)
    except (KeyError, AttributeError, IndexError):
        loss = None
    if loss is None:
        raise ConfigError(
            f"weighted_loss: the model's output ({type(output).__name__}) holds no loss: the batch had no 'labels' "
            "(a collate_fn that drops them, or a dataset without them), so the model computed none. Keep 'labels' "
            "in the batch (odb.batching.pad_collate pads them with -100), or compute the loss yourself and pass "
            "(loss, logits)")
    return loss * weight


@dataclass(frozen=True)
class MicroStep:
    """One batch of the training stream, with what the training loop needs.

    :param batch: the collated batch, StepInfo already removed.
    :param info: its `odb.StepInfo`.
    :param loss_weight: multiply the rank's mean loss over the basis by this (see module doc).
    :param sync: True on the last micro-step of its accumulation window: the
        gradients are all-reduced and the optimizer steps after it.  The same
        step indices are sync steps on every rank.
    """

    batch: Any
    info: Any
    loss_weight: float
    sync: bool


def window_weights(infos: list, loss_basis: str, world_size: int) -> list[float]:
    """Loss weights of one accumulation window (module doc); pure."""
    try:
        local_f, global_f = BASIS_FIELDS[loss_basis]
    except KeyError:
        raise ConfigError(f"unknown loss_basis {loss_basis!r}; valid: {sorted(BASIS_FIELDS)}") from None
    total = sum(getattr(i, global_f) for i in infos)
    if total == 0:
        return [0.0 for _ in infos]
    return [world_size * getattr(i, local_f) / total for i in infos]


def micro_steps(loader: Iterable, accumulation_steps: int = 1, *, loss_basis: str | None = None,
                world_size: int | None = None, mode: str | None = None) -> Iterator[MicroStep]:
    """Iterate one epoch of `loader` as `MicroStep` objects, K at a time.

    Prefetches each window of ``accumulation_steps`` batches so every weight
    uses the window's global count (no extra collective: the counts come from
    the loader's own header exchange).  Window boundaries are step indices
    counted from the start of the epoch, so in PAD and QUOTA mode (equal step
    counts on every rank) all ranks sync at the same micro-steps; the last
    window of the epoch may be shorter and is the same on every rank.

    ``loss_basis``, ``world_size`` and ``mode`` default to the loader's own.
    Raises `ConfigError` for ``mode == "join"`` with ``accumulation_steps > 1``:
    ranks end at different steps, a rank ending inside a window would all-reduce
    while its peers are in ``no_sync`` (a collective mismatch), and DDP Join
    drops a joined rank's unsynced gradients.  Use PAD mode for accumulation.
    """
    from ..runtime import pop_step_info

    k = int(accumulation_steps)
    if k < 1:
        raise ConfigError(f"accumulation_steps must be >= 1, got {accumulation_steps!r}")
    basis = loss_basis if loss_basis is not None else loader_setting(loader, "loss_basis")
    world = world_size if world_size is not None else loader_setting(loader, "world_size")
    mode = mode if mode is not None else loader_setting(loader, "mode")
    if mode == "join" and k > 1:
        raise ConfigError(
            f"mode='join' with gradient accumulation ({k} micro-steps per optimizer step): ranks finish at "
            "different steps, so a rank ending inside a window would all-reduce while its peers skip the "
            "sync (collective mismatch) and DDP Join would drop its unsynced gradients; use mode='pad' "
            "(equal step counts, fillers) for gradient accumulation, or accumulation_steps=1")
    it = iter(loader)
    while True:
        window, infos = [], []
        for _ in range(k):
            try:
                b = next(it)
            except StopIteration:
                break
            window.append(b)
            infos.append(pop_step_info(b))  # as it arrives: the loader counts the batches whose info was taken
        if not window:
            return
        weights = window_weights(infos, basis, world)
        last = len(window) - 1
        for j, (b, info, w) in enumerate(zip(window, infos, weights)):
            yield MicroStep(batch=b, info=info, loss_weight=w, sync=(j == last))
        if len(window) < k:
            return


@dataclass
class TrainProgress:
    """Training progress counted in what the loader emitted; identical on every rank.

    ``samples`` (global real samples of finished micro-steps) drives the LR
    schedule and the sample budget; ``optimizer_steps`` and ``epoch`` (passes
    whose last batch was consumed) are kept for logging and resume.
    """

    samples: int = 0
    micro_steps: int = 0
    optimizer_steps: int = 0
    epoch: int = 0

    def advance(self, info: Any) -> None:
        """Count one finished micro-step (call it on every rank, fillers included)."""
        self.samples += int(info.global_samples)
        self.micro_steps += 1

    def state_dict(self) -> dict:
        """The counters, versioned (every rank holds the same)."""
        return {"version": 1, "samples": self.samples, "micro_steps": self.micro_steps,
                "optimizer_steps": self.optimizer_steps, "epoch": self.epoch}

    def load_state_dict(self, sd: dict) -> None:
        """Restore `state_dict`'s counters; ConfigError on another version or unknown keys."""
        sd = dict(sd)
        version = sd.pop("version", None)
        if version != 1:
            raise ConfigError(f"TrainProgress state version {version!r} is not 1; it was written by another "
                              "ODB version; resume with the version that wrote it")
        for name in ("samples", "micro_steps", "optimizer_steps", "epoch"):
            setattr(self, name, int(sd.pop(name)))
        if sd:
            raise ConfigError(f"TrainProgress state has unexpected keys {sorted(sd)}")


def sample_scheduler(optimizer: torch.optim.Optimizer, progress: TrainProgress,
                     lr_lambda: Callable[[int], float]) -> torch.optim.lr_scheduler.LambdaLR:
    """A `LambdaLR` whose multiplier is ``lr_lambda(progress.samples)``.

    The scheduler's own step count is ignored, so calling ``step()`` once per
    optimizer step (or several times, as Accelerate's wrapper does) only
    re-reads the sample count: the schedule advances by emitted samples, not by
    steps, and a window of many short samples moves it further than a window of
    few long ones.  Its state_dict holds no sample count; checkpoint ``progress``
    beside it.
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _step: lr_lambda(progress.samples))


def hf_schedule(name: str, total_samples: int, warmup_samples: int, **kwargs) -> Callable[[int], float]:
    """The multiplier function of a `transformers` schedule, with steps read as samples.

    Built on a throwaway one-parameter optimizer so the caller's optimizer is untouched.
    """
    from transformers import get_scheduler

    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = get_scheduler(name, dummy, num_warmup_steps=warmup_samples, num_training_steps=total_samples,
                          scheduler_specific_kwargs=kwargs or None)
    if not isinstance(sched, torch.optim.lr_scheduler.LambdaLR) or len(sched.lr_lambdas) != 1:
        raise ConfigError(f"lr_scheduler_type {name!r} is not a LambdaLR schedule; ODB can run only "
                          "LambdaLR schedules (linear, cosine, constant_with_warmup, ...) on samples")
    return sched.lr_lambdas[0]


@contextlib.contextmanager
def grad_sync(model: torch.nn.Module, sync: bool):
    """The gradient-sync context of one micro-step's forward and backward: the gradients are reduced
    across ranks only when `sync` (``MicroStep.sync``: the last micro-step of the window).

    * FSDP2 (a module after ``torch.distributed.fsdp.fully_shard``): ``model.set_requires_gradient_sync(sync)``,
      set back to True on exit (the unsharded gradients accumulate until the sync step reduce-scatters them);
    * DDP and FSDP1 (``FullyShardedDataParallel``): ``model.no_sync()`` unless `sync`;
    * anything else (one rank, no wrapper): nothing.

    Every rank must run the same sequence of contexts; the `MicroStep` windows give that in PAD and
    QUOTA mode.
    """
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(bool(sync))
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    elif not sync and callable(getattr(model, "no_sync", None)):
        with model.no_sync():
            yield
    else:
        yield


@contextlib.contextmanager
def join_context(model: torch.nn.Module | None, loader):
    """The context a loop over `loader` runs in: DDP ``Join`` around `model` in JOIN mode, nothing otherwise.

    JOIN mode lets ranks run out of batches at different steps; a DDP model must then shadow the
    collectives of the ranks still training (``torch.distributed.algorithms.Join([model])``).  The loader
    refuses to iterate in JOIN mode on more than one rank outside this context (the rank whose data ends
    first would leave its peers blocked in the gradient all-reduce).  ``model=None``: the loop runs no
    collective of its own (it only reads data).  PAD and QUOTA modes emit equal step counts and need
    nothing (and work with FSDP: see `grad_sync`)."""
    if isinstance(loader, str):
        raise ConfigError("join_context(model, loader) takes the ODBDataLoader itself (it marks the loader as "
                          f"wrapped), not its mode {loader!r}")
    mode = loader_setting(loader, "mode")
    if mode != "join" or loader_setting(loader, "world_size") == 1:
        yield
        return
    from torch.distributed.algorithms import Join

    loader.joined += 1
    try:
        if model is None:
            yield
        else:
            with Join(list(model) if isinstance(model, (list, tuple)) else [model], throw_on_early_termination=False):
                yield
    finally:
        loader.joined -= 1


class TrainStream:
    """An ODBDataLoader's epochs as `MicroStep` windows, with progress and resumable state.

    ``epoch()`` runs one epoch (the loader's epoch follows ``progress.epoch``,
    so a restored stream continues where it stopped, and a finished epoch moves
    on to the next).  A micro-step is *consumed* when it is yielded
    (``consume_on_yield=True``, for loops that train each batch before asking
    for the next) or when `consume` is called (for frameworks that prefetch);
    ``progress.epoch`` counts a pass when its last batch is consumed (the stream
    reads one batch ahead to know which is last), so a run that stops on its
    sample budget at an epoch's last batch counts that epoch.
    `state_dict` describes the consumed position: the loader state snapshotted
    at the start of the window that the consumer has reached.  It can be taken
    at optimizer-step boundaries (window starts), which is where frameworks
    checkpoint; anywhere else it raises `ConfigError`.
    """

    def __init__(self, loader, accumulation_steps: int = 1, *, max_samples: int | None = None,
                 consume_on_yield: bool = True, progress: TrainProgress | None = None):
        self.loader, self.k = loader, int(accumulation_steps)
        if max_samples is not None and loader.mode == "join":
            raise ConfigError(
                "TrainStream(max_samples=...) with mode='join': a rank that finishes its epoch early does not see "
                "the samples its peers emit afterwards, so the ranks would disagree on when the budget is reached "
                "and one would stop while the others wait; in mode 'join' run whole epochs (max_samples=None), "
                "or use mode='pad'")
        self.max_samples = max_samples
        self.consume_on_yield = consume_on_yield
        self.progress = progress if progress is not None else TrainProgress()
        self._pulled = 0        # batches pulled from the loader in the current epoch
        self._consumed = 0      # micro-steps consumed in the current epoch
        self._last: int | None = None  # the current epoch's number of batches, once its last was pulled
        self._snaps: dict[int, dict] = {}  # window start -> loader state before pulling it (the last two)

    @property
    def done(self) -> bool:
        """True once ``max_samples`` global samples were consumed (never without a budget)."""
        return self.max_samples is not None and self.progress.samples >= self.max_samples

    def epoch(self) -> Iterator[MicroStep]:
        """One epoch of micro-steps (see class doc); ``progress.epoch`` advances when its last is consumed."""
        if self.loader.epoch != self.progress.epoch:
            self.loader.set_epoch(self.progress.epoch)
        epoch = self.progress.epoch
        self._pulled = self._consumed = 0
        self._last, self._snaps = None, {}
        for ms in micro_steps(self._pull(), self.k, loss_basis=self.loader.loss_basis,
                              world_size=self.loader.world_size, mode=self.loader.mode):
            if self.consume_on_yield:
                self.consume(ms)
            yield ms
        if self.progress.epoch == epoch and self._last == 0:  # a pass without a batch ends here
            self.progress.epoch += 1
        # the counters stay until the next epoch() begins: a prefetching framework consumes the last
        # micro-steps after this generator has ended

    def _pull(self):
        # One batch ahead, to know which batch is the pass's last; the loader state is snapshotted before
        # the first batch of every window is pulled.  The consumer is at most one window and one batch
        # behind (micro_steps holds a window, this generator one batch more), so the last two snapshots
        # hold the one of every window start it can reach.
        it = iter(self.loader)

        def fetch():
            if self._pulled % self.k == 0:
                self._snaps[self._pulled] = self.loader.state_dict()
                if len(self._snaps) > 2:
                    del self._snaps[min(self._snaps)]
            try:
                b = next(it)
            except StopIteration:
                self._last = self._pulled
                return None
            self._pulled += 1
            return b
        b = fetch()
        while b is not None:
            ahead = fetch()
            yield b
            b = ahead

    def consume(self, ms: MicroStep) -> None:
        """Mark the next micro-step consumed: counts its samples, and an optimizer step if ``ms.sync``
        (the step the caller takes after it, so a checkpoint written after that step counts it)."""
        self._consumed += 1
        self.progress.advance(ms.info)
        if ms.sync:
            self.progress.optimizer_steps += 1
        if self._consumed == self._last:
            self.progress.epoch += 1

    def state_dict(self) -> dict:
        """This rank's state at the consumed position (see class doc): the loader's state under "loader" and
        the progress.  Every rank's, merged with `odb.merge_states`, resumes on any number of ranks."""
        if self._consumed == self._pulled:
            loader_state = self.loader.state_dict()
        elif self._consumed in self._snaps:
            loader_state = self._snaps[self._consumed]
        else:
            raise ConfigError(
                f"ODB state requested in the middle of an accumulation window ({self._consumed} micro-steps "
                f"consumed, {self._pulled} fetched): the loader position is only defined at optimizer-step "
                "boundaries; save checkpoints after an optimizer step")
        return {"version": 1, "rank": self.loader.rank, "world_size": self.loader.world_size,
                "loader": loader_state, "progress": self.progress.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        """Resume from this rank's `state_dict()` (same rank and world size), or from every rank's merged
        with `odb.merge_states` (on any number of ranks).  Strict: a loader state alone (it lacks the
        progress), another rank's or world size's state and unknown keys raise `ConfigError`."""
        from ..runtime.ledger import describe_state

        if not isinstance(sd, Mapping) or "loader" not in sd:
            raise ConfigError(f"TrainStream.load_state_dict got {describe_state(sd)}; it takes this rank's "
                              "TrainStream.state_dict() (the loader's position and the progress), or every rank's "
                              "merged with odb.merge_states(states) to resume on another number of ranks")
        sd = dict(sd)
        version, kind = sd.pop("version", None), sd.pop("kind", "rank")
        if version != 1 or kind not in ("rank", "global"):
            raise ConfigError(f"TrainStream state has version={version!r}, kind={kind!r}; this ODB reads version 1, "
                              "kind 'rank' (TrainStream.state_dict) or 'global' (odb.merge_states)")
        n, r = sd.pop("world_size", None), sd.pop("rank", None)
        if kind == "rank" and n != self.loader.world_size:
            raise ConfigError(f"cannot resume: the state is rank {r!r}'s TrainStream.state_dict() of {n!r} ranks, this "
                              f"run has {self.loader.world_size} ranks; merge every rank's TrainStream state of that "
                              "checkpoint with odb.merge_states(states) and load the merged state on every rank")
        if kind == "rank" and r != self.loader.rank:
            raise ConfigError(f"cannot resume: the state is rank {r!r}'s, this is rank {self.loader.rank}; load each "
                              "rank's own state, or every rank's merged with odb.merge_states(states)")
        if set(sd) != {"loader", "progress"}:
            raise ConfigError(f"TrainStream state has keys {sorted(sd)}; it needs exactly 'loader' and 'progress'")
        self.loader.load_state_dict(sd["loader"])
        self.progress.load_state_dict(sd["progress"])


def gather_rank_states(local: dict) -> dict:
    """Every rank's state in one dict, for checkpointers that only rank 0 writes.

    SYNC: every rank must call this (an ``all_gather_object``) at the same point.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        states: list = [None] * dist.get_world_size()
        dist.all_gather_object(states, local)  # SYNC: every rank must reach this
    else:
        states = [local]
    return {"version": 1, "world_size": len(states), "ranks": states}


def own_rank_state(sd: dict, rank: int, world_size: int) -> dict:
    """The state `TrainStream.load_state_dict` takes on `rank` of `world_size` from a `gather_rank_states`
    entry: this rank's own on the same world size, else every rank's merged (`odb.merge_states`)."""
    from ..runtime.ledger import describe_state, merge_states

    if not isinstance(sd, Mapping) or sd.get("version") != 1 or "ranks" not in sd:
        raise ConfigError(f"the ODB checkpoint entry is {describe_state(sd)}, not a gather_rank_states entry "
                          "(version 1, 'ranks'); it was not written by ODBAccelerate or ODBDataModule")
    if sd.get("world_size") == world_size:
        return sd["ranks"][rank]
    return merge_states(sd)
