"""`LoaderSettings`: every `odb.ODBDataLoader` setting, typed, frozen and validated when it is built.

Each field is either *compared* (every rank must set it alike: it feeds a replicated decision,
`odb.core.shared.Shared`, which `shared` builds and the construction check compares) or *rank-local*
(it may differ per rank; a value a decision needs is gathered, never read locally).  `COMPARED` and
`RANK_LOCAL` list every field with the reason; a test requires each field in exactly one of them, so a
new setting cannot skip the construction check by accident.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .. import __version__
from ..batching.base import CostModel
from ..core.info import LOSS_BASES
from ..core.shared import Shared, describe_cost, describe_policy
from ..errors import ConfigError
from ..protocol.table import DGAP, MODES

__all__ = ["LoaderSettings", "COMPARED", "RANK_LOCAL", "OVERSIZE", "SHARDINGS"]

OVERSIZE = ("alone", "skip", "error")
SHARDINGS = ("auto", "dealt", "fixed")

# field -> the Shared field it is compared as (every rank must set it alike)
COMPARED = {"token_budget": "cost", "cost": "cost", "policy": "policy", "buffer_size": "window", "mode": "mode",
            "sharding": "sharding", "loss_basis": "loss_basis", "shift_labels": "shift_labels",
            "shuffle": "order", "seed": "order", "pool_size": "lanes", "exchange": "exchange",
            "exchange_slack": "exchange_slack"}
# field -> why it may differ per rank
RANK_LOCAL = {
    "sampler": "each rank's own indices (its order is then compared as 'own')",
    "num_workers": "its prefetch is gathered, each rank's need reads every rank's",
    "prefetch_factor": "its prefetch is gathered, each rank's need reads every rank's",
    "persistent_workers": "worker lifetime only",
    "multiprocessing_context": "worker start method only",
    "worker_init_fn": "worker setup only",
    "oversize": "decides which samples reach this rank's window; every effect is counted and gathered",
    "length_fn": "measures this rank's samples; their sizes reach the others only through gathered headers",
    "filler_sample": "the content of this rank's zero-weight fillers",
    "process_group": "which group; its members are compared by creating the group",
    "timeout_s": "how long this rank waits",
    "trace_dir": "where this rank writes its trace",
    "progress": "display only: a bar of the gathered sample counts on the ranks that ask for one",
}


@dataclass(frozen=True, kw_only=True)
class LoaderSettings:
    """The settings of one `odb.ODBDataLoader` (validated when built; ``ConfigError`` names the field)."""

    token_budget: Any
    """The budget of the cost model, per rank and batch (a number; a mapping resource -> budget for a
    multi-resource cost; ignored, and must be None, when ``cost`` is a ready `CostModel`)."""
    sampler: Any = None
    """Yields this rank's own dataset indices (shards may be uneven); must give the same order again after
    ``set_epoch(e)`` for resume.  Default: the loader's own ``seed + epoch`` shuffled order."""
    shuffle: bool = True
    """Shuffle the loader's own order (ignored with a sampler)."""
    sharding: str = "auto"
    """"dealt": one shuffled order of a map-style dataset dealt to the ranks while the epoch runs, the end
    by measured cost (`odb.batching.deal`); "fixed": each rank's shard up front (round robin);
    "auto": "dealt" for a map-style dataset without ``sampler``, else "fixed"."""
    seed: int = 0
    """Seed of the loader's own shuffle."""
    num_workers: int = 0
    """Preprocessing workers of the inner DataLoader (0: in the engine thread)."""
    prefetch_factor: int | None = None
    """Per worker, as in DataLoader (None: its default)."""
    persistent_workers: bool = False
    """Keep workers across epochs, as in DataLoader."""
    multiprocessing_context: Any = None
    """Worker start method ("fork", "spawn", ...), as in DataLoader."""
    worker_init_fn: Callable | None = None
    """As in DataLoader."""
    buffer_size: int = 1024
    """The window W: samples per rank per round, carry included; larger gives better batches and holds
    about 2W preprocessed samples in host memory (the window and the previous round's batches), and the
    first batch of an epoch waits for the first W.  The default is the paper's recipes' window; with
    large per-sample tensors (images) size it to host memory: 2W samples on each of a host's ranks.
    Measured effects: ``docs/decisions/2026-11-29-window-size.md`` and, at 64 to 256 ranks,
    ``docs/decisions/2026-12-01-window-1024.md``; at 64 ranks 2,048 predicts 0.970-0.992x the offline
    oracle's throughput (``docs/decisions/2026-12-02-pooled-windows.md``)."""
    mode: str = "pad"
    """"pad" (equal steps, zero-weight fillers, every sample once), "join" (every sample once; ranks
    finish at different steps; the model side uses DDP ``Join``) or "quota" (equal steps, no fillers;
    stops when a rank runs dry; the rest counted in ``stats.unemitted`` and warned about)."""
    cost: Any = "padded"
    """"padded" | "packed" | "quadratic" | a callable | a mapping resource -> budget (see
    `odb.batching.make_cost_model`), or a ready `CostModel`."""
    policy: Any = None
    """An `odb.batching.AlignmentPolicy` (None: `odb.batching.default_policy()`)."""
    oversize: str = "alone"
    """A sample over budget: "alone" (a batch of its own), "skip" or "error"; counted in ``stats.oversize``."""
    loss_basis: str = "label_tokens"
    """What ``StepInfo.loss_scale`` averages over: "label_tokens", "tokens" or "samples"."""
    shift_labels: bool | None = None
    """Count label tokens as a causal LM's loss sees them, among ``labels[1:]`` of each sample (Hugging
    Face ``*ForCausalLM`` shifts labels by one); False: the labels as given.  None (default): True with
    a packing collate (`odb.batching.collate.packed_collate`, `mrope_collate`, transformers'
    ``DataCollatorWithFlattening``: they mask each sample's first label, so ``labels[1:]`` are exactly
    the targets), else False; False with a packing collate is refused (it would count one target per
    sample too many).  A sample without ``labels`` counts its ``input_ids`` (what the collates build)."""
    length_fn: Callable | None = None
    """sample -> int or tuple of ints (sizes per resource, tokens first); default the length of a 1-D
    ``input_ids``.  Runs in the workers (picklable under spawn).  Length 0 samples are counted and skipped."""
    filler_sample: Mapping | None = None
    """A processed sample within the budget for PAD fillers (default: the cheapest one seen)."""
    process_group: Any = None
    """The data-parallel group to align (default: the whole world); only its members build the loader."""
    timeout_s: float = 1800.0
    """How long a rank waits for its slowest peer at a header collective, and for one preprocessed sample
    with workers.  A slow peer (a consumer pausing to save a checkpoint) is waited for this long; a dead
    peer is seen by the transport within seconds and a dead worker within 0.1 s whatever this is.  Set
    it to at least the longest pause of one rank between two batches (default: torch.distributed's)."""
    trace_dir: str | None = None
    """If set, every rank writes a JSONL trace per pass (`odb.runtime.trace`)."""
    pool_size: int = 1
    """Ranks that share one window of ``pool_size * buffer_size`` samples (`odb.core.pool`): consecutive
    ranks of the loader's group, e.g. the ranks of a host (torchrun's ``--nproc-per-node``).  Only the
    pools align through the round collective, and a step's batches on a pool's ranks are neighbours in
    cost.  Measured, it balances as well as ``pool_size=1`` with a ``pool_size`` times larger
    ``buffer_size`` and no better (``docs/decisions/2026-12-02-pooled-windows.md``), so raise
    ``buffer_size`` first.  The price: every rank preprocesses and holds all of its pool's samples
    (``pool_size`` times the CPU work and the window memory); no sample moves between processes.  Needs ``mode="pad"``, dealt sharding and deterministic preprocessing (a
    pool's ranks must measure each sample alike, checked every round).  1: no pooling."""
    exchange: bool = False
    """The round exchange (`odb.batching.exchange`): after each round's collective every rank computes, from
    the gathered fills of every rank's batches, one plan that re-deals the round's batches across the ranks
    by decreasing fill, so a step's batches are neighbours in cost across the whole group, not only within
    one rank's window; the batches the plan moves are sent point to point on the loader's gloo group
    (pickled samples), one round after they were formed.  Simulated at 64 to 1,024 ranks with
    ``pool_size=8`` it predicts 0.975-1.029x the sorted offline oracle's throughput at 80 points
    (``paper_repro/results/scale_grid_exchange_202612.md``), sending 7-16% of the batches between pools
    (at most about 2 MB per rank per round for text at 1,024 ranks):
    ``docs/decisions/2026-12-05-exchange-design.md``.  The price: one more round of batches held (about 3W
    samples in host memory), those bytes, and a pass longer by one header collective.  Needs ``mode="pad"``
    or ``"quota"`` and dealt sharding.  False: every batch runs on the rank that formed it."""
    exchange_slack: float = 0.0
    """With ``exchange=True``: the share of a round's step time (by the fills) its plan may spend on
    balancing the steps' budget cost too (`odb.batching.exchange`, budget balance), 0 to 0.1, rounded to
    0.0001.  0: the plan aligns step time only, and a step can hold batches alike in time and far apart in
    budget cost.  Simulated with ``pool_size=8`` at 0.0125 at 80 points of 64 to 1,024 ranks
    (``docs/decisions/2026-12-05-exchange-budget-balance.md``): budget-cost straggler efficiency 0.969-0.997
    (0.947-0.997 at 0), predicted throughput 0.994-1.004x that of 0 (median 1.000), and up to 2.9 times the
    batches moved, so the default stays 0."""
    progress: bool = False
    """Show a tqdm bar per pass counted in samples of every rank (the gathered counts; the number of steps
    is not known ahead, the number of samples is); pass ``progress=(rank == 0)`` for one bar."""

    def __post_init__(self) -> None:
        def bad(name, want):
            raise ConfigError(f"{name}={getattr(self, name)!r} is not valid: it must be {want}")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)
        if not (is_int(self.buffer_size) and self.buffer_size >= 1):
            bad("buffer_size", "an int >= 1 (samples per rank per round)")
        if not (is_int(self.pool_size) and self.pool_size >= 1):
            bad("pool_size", "an int >= 1 (ranks sharing one window)")
        if not (is_int(self.num_workers) and self.num_workers >= 0):
            bad("num_workers", "an int >= 0")
        if self.prefetch_factor is not None and not (is_int(self.prefetch_factor) and self.prefetch_factor >= 1):
            bad("prefetch_factor", "None or an int >= 1")
        if not is_int(self.seed):
            bad("seed", "an int")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            bad("timeout_s", "a number of seconds > 0")
        for name, valid in (("mode", sorted(MODES)), ("oversize", list(OVERSIZE)), ("sharding", list(SHARDINGS)),
                            ("loss_basis", sorted(LOSS_BASES))):
            if getattr(self, name) not in valid:
                bad(name, f"one of {valid}")
        for name in ("shuffle", "persistent_workers", "progress", "exchange"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "True or False")
        sl = self.exchange_slack
        if isinstance(sl, bool) or not isinstance(sl, (int, float)) or not 0 <= sl <= 0.1:
            bad("exchange_slack", "a number from 0 to 0.1")
        if sl and not self.exchange:
            raise ConfigError(f"exchange_slack={sl!r} without exchange=True: the slack is the exchange plan's")
        if self.shift_labels is not None and not isinstance(self.shift_labels, bool):
            bad("shift_labels", "None, True or False")
        tb = self.token_budget
        if isinstance(self.cost, CostModel) and not isinstance(self.cost, (str, Mapping)):
            if tb is not None:
                raise ConfigError(f"token_budget={tb!r} with a ready cost model {self.cost!r}: the budget would be "
                                  "ignored; the model holds its budgets; pass token_budget=None")
        elif isinstance(self.cost, Mapping):
            if tb is not None:
                raise ConfigError(f"token_budget={tb!r} with a per-resource cost mapping: the mapping holds the "
                                  "budgets; pass token_budget=None")
        elif isinstance(tb, bool) or not isinstance(tb, (int, float, Mapping)) or (
                isinstance(tb, (int, float)) and not tb > 0):
            bad("token_budget", "a positive number (or a mapping resource -> budget)")

    # -- what the loader derives ------------------------------------------------------
    def resolved_sharding(self, iterable: bool) -> str:
        """"dealt" or "fixed" for a dataset of this kind (ConfigError for an impossible combination)."""
        if iterable and self.sampler is not None:
            raise ConfigError("sampler= cannot be used with an IterableDataset (it yields its own stream); drop the "
                              "sampler and shard inside the dataset")
        own = not iterable and self.sampler is None
        if self.exchange and (self.mode == "join" or not own or self.sharding == "fixed"):
            raise ConfigError("exchange=True needs mode 'pad' or 'quota' (every rank runs the same steps) and dealt "
                              "sharding of a map-style dataset without sampler= (a moved batch's positions are in the "
                              f"global order); got mode={self.mode!r}, sharding={self.sharding!r}" +
                              (", an IterableDataset" if iterable else ", a sampler" if self.sampler is not None else ""))
        if self.sharding == "auto":
            return "dealt" if own else "fixed"
        if self.sharding == "dealt" and not own:
            raise ConfigError("sharding='dealt' deals one shuffled order of a map-style dataset; it cannot be used "
                              "with " + ("an IterableDataset" if iterable else "sampler=") +
                              " (that decides each rank's samples itself)")
        return self.sharding

    def cost_and_policy(self):
        """The cost model and the alignment policy these settings build."""
        from .. import batching

        cost = self.cost if isinstance(self.cost, CostModel) and not isinstance(self.cost, (str, Mapping)) \
            else batching.make_cost_model(self.cost, self.token_budget)
        return cost, self.policy if self.policy is not None else batching.default_policy(self.pool_size)

    def resolved_shift(self, collate_fn) -> bool:
        """``shift_labels`` for this collate (the field's docstring); ConfigError for False with a packing one."""
        from ..batching.collate import counts_shifted

        packs = counts_shifted(collate_fn)
        if self.shift_labels is None:
            return packs
        if packs and not self.shift_labels:
            raise ConfigError("shift_labels=False with a packing collate: it masks each sample's first label, so the "
                              "loss targets are each sample's labels[1:] and counting labels as given would count one "
                              "per sample too many; leave shift_labels at its default (None) or pass True")
        return self.shift_labels

    def shared(self, *, sharding: str, header_len: int, cost, policy, num_positions: int | None,
               shift_labels: bool) -> Shared:
        """The compared settings (`COMPARED`) as `odb.core.shared.Shared`; ``num_positions`` is the length
        of the loader's own order (None: each rank brings its own samples)."""
        order = "own" if num_positions is None else \
            f"shuffle={self.shuffle} seed={self.seed} positions={num_positions}"
        return Shared(protocol=f"odb {__version__} table {DGAP.hash[:16]}", window=self.buffer_size * self.pool_size,
                      mode=self.mode, sharding=sharding, header_len=header_len, policy=describe_policy(policy),
                      cost=describe_cost(cost), loss_basis=self.loss_basis, shift_labels=shift_labels,
                      order=order, lanes=self.pool_size, exchange=self.exchange, exchange_slack=self.slack_bp)

    @property
    def slack_bp(self) -> int:
        """``exchange_slack`` in basis points, the int every rank compares and the plan reads."""
        return int(round(self.exchange_slack * 10_000))

    @classmethod
    def from_kwargs(cls, kwargs: Mapping) -> "LoaderSettings":
        """Build from keyword arguments; an unknown name is a ConfigError listing the valid ones."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise ConfigError(f"ODBDataLoader got unknown settings {unknown}; valid: {names}")
        return cls(**kwargs)

    @classmethod
    def loader_signature(cls) -> inspect.Signature:
        """`odb.ODBDataLoader.__init__`'s signature: its positional parameters, then one keyword-only
        parameter per field (what ``help()`` and IDEs show)."""
        P = inspect.Parameter
        head = [P("self", P.POSITIONAL_OR_KEYWORD), P("dataset", P.POSITIONAL_OR_KEYWORD),
                P("token_budget", P.POSITIONAL_OR_KEYWORD, default=None),
                P("collate_fn", P.POSITIONAL_OR_KEYWORD, default=None), P("settings", P.KEYWORD_ONLY, default=None)]
        return inspect.Signature(head + [P(f.name, P.KEYWORD_ONLY, default=P.empty if f.default is dataclasses.MISSING
                                           else f.default) for f in dataclasses.fields(cls) if f.name != "token_budget"])
