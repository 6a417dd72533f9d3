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

from . import __version__
from .batching.base import CostModel, check_policy
from .core.info import LOSS_BASES
from .core.placement import AUTO, Exchanged, Pooled, placement_of, resolve_placement
from .core.shared import Shared, describe_cost, describe_policy
from .errors import ConfigError
from .protocol.table import DGAP, MODES

__all__ = ["LoaderSettings", "COMPARED", "RANK_LOCAL", "OVERSIZE", "SHARDINGS", "DATALOADER_KEYS", "settings_help"]

OVERSIZE = ("alone", "skip", "error")
SHARDINGS = ("auto", "dealt", "fixed")
# what ``dataloader=`` forwards to the inner DataLoader as is; the loader sets the others itself (batch_size,
# sampler, collate_fn, timeout: its own keys, one sample at a time, its own polling) or refuses them (in_order:
# the window reads each rank's keys in order)
DATALOADER_KEYS = ("prefetch_factor", "persistent_workers", "multiprocessing_context", "worker_init_fn",
                   "pin_memory", "pin_memory_device", "generator")
# settings of earlier versions, and where each went
MOVED = {"pool_size": "placement=odb.Pooled(size)", "exchange": "placement=odb.Exchanged(pool=1, slack=0.0)",
         "exchange_slack": "placement=odb.Exchanged(slack=...)",
         **{k: f"dataloader={{{k!r}: ...}}" for k in DATALOADER_KEYS[:4]}}

# field -> the Shared field it is compared as (every rank must set it alike)
COMPARED = {"token_budget": "cost", "cost": "cost", "policy": "policy", "buffer_size": "window",
            "first_window": "first_window", "mode": "mode", "sharding": "sharding", "loss_basis": "loss_basis",
            "shift_labels": "shift_labels",
            "shuffle": "order", "seed": "order", "placement": ("lanes", "exchange", "exchange_slack")}
# field -> why it may differ per rank
RANK_LOCAL = {
    "sampler": "each rank's own indices (its order is then compared as 'own')",
    "num_workers": "its prefetch is gathered, each rank's need reads every rank's",
    "dataloader": "worker setup; the prefetch it sets is gathered, each rank's need reads every rank's",
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
    """The settings of one `odb.ODBDataLoader`, validated when built (``ConfigError`` names the field).

    Pass them to ``ODBDataLoader(dataset, token_budget, **settings)`` or as ``settings=LoaderSettings(...)``.
    "Compared": every rank must set it alike (the construction check raises ConfigError on every rank
    otherwise); the others may differ per rank.

    :ivar token_budget: the cost budget of one batch on one rank.  With the default ``cost="padded"`` it
        counts padded tokens: rows x the longest sample's tokens <= token_budget.  Start from the largest
        batch that fits your GPU at your longest sample (``docs/getting-started.md``).  Compared.
    :ivar buffer_size: the window W: samples per rank that each round packs (default 1024, the paper's
        recipes').  Larger packs better; each rank holds at most about 3W preprocessed samples (the window,
        the round held until the next collective, the released batches not yet taken).  Compared.
    :ivar first_window: the window of a pass's first round (default 32): round r holds
        ``min(buffer_size, first_window * 2**r)`` samples per rank, so a pass's first batch waits for a few
        small windows, not ``buffer_size`` samples.  None: every round holds ``buffer_size``.  Compared.
    :ivar mode: "pad" (default: every rank the same steps, zero-weight fillers, every sample once), "join"
        (every sample once, ranks end at different steps; the loop runs in ``join_context``) or "quota"
        (equal steps, no fillers; stops when a rank runs dry and reports what it did not emit).  Compared.
    :ivar sharding: "auto" (default: "dealt" for a map-style dataset without ``sampler``, else "fixed"),
        "dealt" (one shuffled order dealt to the ranks while the epoch runs, its end by measured cost) or
        "fixed" (each rank's round-robin shard up front).  Compared.
    :ivar shuffle: shuffle the loader's own order, ``seed + epoch`` (default True).  Compared.
    :ivar seed: seed of that shuffle (default 0).  Compared.
    :ivar sampler: yields this rank's own dataset indices instead of the loader's order (shards may be
        uneven; it must give the same order again after ``set_epoch(e)`` for resume).  Rank-local.
    :ivar num_workers: preprocessing workers of the inner DataLoader (default 0: in the loader's thread).
    :ivar dataloader: other keywords for the inner DataLoader, forwarded as is: ``prefetch_factor``,
        ``persistent_workers``, ``multiprocessing_context``, ``worker_init_fn``, ``pin_memory``,
        ``pin_memory_device``, ``generator`` (the loader sets the rest itself).
    :ivar cost: what a batch costs: "padded" (default), "packed" (its tokens: for a packing collate),
        "quadratic" (tokens plus attention), a callable, a mapping resource -> budget for several
        resources (`odb.batching.make_cost_model`), or a ready `CostModel`.  Compared.
    :ivar policy: the cross-rank alignment policy (None: `odb.batching.default_policy()`).  Compared.
    :ivar oversize: a sample over the budget: "alone" (default: a batch of its own, announced once per
        epoch), "skip" (counted, not trained) or "error".
    :ivar loss_basis: what ``StepInfo.loss_scale`` averages over: "label_tokens" (default), "tokens" or
        "samples".  Compared.
    :ivar shift_labels: count label tokens as a causal LM's loss sees them, among ``labels[1:]`` (None, the
        default, is True; the HF adapters choose False for an encoder-decoder model); False: labels as
        given, for a loss that reads every label.  False with a packing collate is refused.  Compared.
    :ivar length_fn: sample -> int, or a tuple of ints per resource (tokens first); default the length of a
        1-D ``input_ids``.  Runs in the workers (picklable under spawn).  Length-0 samples are skipped, counted.
    :ivar filler_sample: the content of every PAD filler (a processed sample within the budget); default
        the cheapest sample seen within the budget, or one cut to the budget.
    :ivar process_group: the data-parallel group to align (default: the whole world); only its members
        build the loader.
    :ivar timeout_s: how long a rank waits for its slowest peer at a round, and for one preprocessed sample
        (default 1800 s, torch.distributed's).  Set it above the longest pause one rank takes between two
        batches (a checkpoint save); a dead peer or worker is seen within seconds whatever it is.
    :ivar trace_dir: if set, every rank writes a JSONL trace of each pass (``python -m proofs.conformance``).
    :ivar progress: a tqdm bar per pass, counted in every rank's samples; ``progress=(rank == 0)`` for one.
    :ivar placement: where a formed batch runs: "auto" (default: ``odb.Exchanged(pool=1, slack=0.0125)`` on two
        ranks or more in mode "pad" or "quota" with dealt sharding, else None); None: on the rank that formed it;
        ``odb.Pooled(size)``: a host's ranks share one window; ``odb.Exchanged(pool=1, slack=0.0)``: the round's
        batches are re-dealt across the ranks by cost (``docs/guide/scaling.md``).  Compared, as resolved.
    """

    token_budget: Any
    sampler: Any = None
    shuffle: bool = True
    sharding: str = "auto"
    seed: int = 0
    num_workers: int = 0
    dataloader: Mapping | None = None
    buffer_size: int = 1024
    first_window: int | None = 32
    mode: str = "pad"
    cost: Any = "padded"
    policy: Any = None
    oversize: str = "alone"
    loss_basis: str = "label_tokens"
    shift_labels: bool | None = None
    length_fn: Callable | None = None
    filler_sample: Mapping | None = None
    process_group: Any = None
    timeout_s: float = 1800.0
    trace_dir: str | None = None
    placement: Pooled | Exchanged | str | None = AUTO
    progress: bool = False

    def __post_init__(self) -> None:
        def bad(name, want):
            raise ConfigError(f"{name}={getattr(self, name)!r} is not valid: it must be {want}")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)
        if not (is_int(self.buffer_size) and self.buffer_size >= 1):
            bad("buffer_size", "an int >= 1 (samples per rank per round)")
        if self.first_window is not None and not (is_int(self.first_window) and self.first_window >= 1):
            bad("first_window", "None or an int >= 1 (samples per rank in a pass's first round)")
        object.__setattr__(self, "placement", placement_of(self.placement))  # (the JSON form, as a value)
        if not (is_int(self.num_workers) and self.num_workers >= 0):
            bad("num_workers", "an int >= 0")
        if self.dataloader is not None:
            if not isinstance(self.dataloader, Mapping) or set(self.dataloader) - set(DATALOADER_KEYS):
                bad("dataloader", f"None or a mapping of DataLoader keywords among {list(DATALOADER_KEYS)} (the "
                    "loader sets batch_size, sampler, collate_fn, num_workers and timeout itself)")
            pf = self.dataloader.get("prefetch_factor")
            if pf is not None and not (is_int(pf) and pf >= 1):
                bad("dataloader", "a mapping whose prefetch_factor is None or an int >= 1")
        if not is_int(self.seed):
            bad("seed", "an int")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            bad("timeout_s", "a number of seconds > 0")
        for name, valid in (("mode", sorted(MODES)), ("oversize", list(OVERSIZE)), ("sharding", list(SHARDINGS)),
                            ("loss_basis", sorted(LOSS_BASES))):
            if getattr(self, name) not in valid:
                bad(name, f"one of {valid}")
        for name in ("shuffle", "progress"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "True or False")
        if self.policy is not None:
            check_policy(self.policy)
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
        if self.placement != AUTO and self.exchange and (self.mode == "join" or not own or self.sharding == "fixed"):
            what = ", an IterableDataset" if iterable else ", a sampler" if self.sampler is not None else ""
            raise ConfigError("placement=odb.Exchanged(...) needs mode 'pad' or 'quota' (every rank runs the same "
                              "steps) and dealt sharding of a map-style dataset without sampler= (a moved batch's "
                              f"positions are in the global order); got mode={self.mode!r}, "
                              f"sharding={self.sharding!r}{what}")
        if self.sharding == "auto":
            return "dealt" if own else "fixed"
        if self.sharding == "dealt" and not own:
            raise ConfigError("sharding='dealt' deals one shuffled order of a map-style dataset; it cannot be used "
                              "with " + ("an IterableDataset" if iterable else "sampler=") +
                              " (that decides each rank's samples itself)")
        return self.sharding

    def cost_and_policy(self):
        """The cost model and the alignment policy these settings build."""
        from . import batching

        cost = self.cost if isinstance(self.cost, CostModel) and not isinstance(self.cost, (str, Mapping)) \
            else batching.make_cost_model(self.cost, self.token_budget)
        return cost, self.policy if self.policy is not None else batching.default_policy(self.lanes)

    def resolved_shift(self, collate_fn) -> bool:
        """``shift_labels`` for this collate (the field's docstring); ConfigError for False with a packing one."""
        from .batching.collate import counts_shifted

        packs = counts_shifted(collate_fn)
        if self.shift_labels is None:
            return True  # the causal LM's targets; with a packing collate the only right count
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
        return Shared(protocol=f"odb {__version__} table {DGAP.hash[:16]}", window=self.buffer_size * self.lanes,
                      mode=self.mode, sharding=sharding, header_len=header_len, policy=describe_policy(policy),
                      cost=describe_cost(cost), loss_basis=self.loss_basis, shift_labels=shift_labels,
                      order=order, lanes=self.lanes, exchange=self.exchange, exchange_slack=self.slack_bp,
                      first_window=self.table_first_window)

    # -- the placement, as the core and the header read it (`odb.core.placement`) ---------
    def resolved(self, world: int, sharding: str) -> "LoaderSettings":
        """These settings with ``placement="auto"`` resolved for a group of `world` ranks and the resolved
        `sharding` (`odb.core.placement.resolve_placement`); the loader and the simulation run only these."""
        if self.placement != AUTO:
            return self
        return dataclasses.replace(self, placement=resolve_placement(self.placement, world=world, mode=self.mode,
                                                                     sharding=sharding))

    def _placed(self):
        if self.placement == AUTO:  # a value read before the world is known would be a guess
            raise ConfigError("placement='auto' is resolved per group: read lanes, exchange and slack_bp from "
                              "settings.resolved(world, sharding)")
        return self.placement

    @property
    def table_first_window(self) -> int:
        """The table's cfg ``W0``: ``first_window`` times ``lanes`` (a pool's), at most the table's window."""
        w = self.buffer_size * self.lanes
        return w if self.first_window is None else min(w, self.first_window * self.lanes)

    @property
    def lanes(self) -> int:
        """Ranks sharing one window (1 without pooling; "auto" never pools)."""
        p = self.placement
        return 1 if p is None or p == AUTO else p.lanes

    @property
    def exchange(self) -> bool:
        """The round exchange is on."""
        p = self._placed()
        return p is not None and p.exchange

    @property
    def slack_bp(self) -> int:
        """The exchange's slack in basis points, the int every rank compares and the plan reads (0 without)."""
        p = self._placed()
        return 0 if p is None else p.slack_bp

    @classmethod
    def from_kwargs(cls, kwargs: Mapping) -> "LoaderSettings":
        """Build from keyword arguments; an unknown name is a ConfigError listing the valid ones."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(kwargs) - set(names))
        moved = [f"{k} (now {MOVED[k]})" for k in unknown if k in MOVED]
        if moved:
            raise ConfigError(f"ODBDataLoader got settings that moved: {', '.join(moved)}")
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
        return inspect.Signature(head + [
            P(f.name, P.KEYWORD_ONLY, default=P.empty if f.default is dataclasses.MISSING else f.default)
            for f in dataclasses.fields(cls) if f.name != "token_budget"])


def settings_help() -> str:
    """The ``:ivar`` lines of `LoaderSettings`'s docstring: one entry per setting (for ``help()``)."""
    doc = LoaderSettings.__doc__ or ""
    return "Settings (keywords; `LoaderSettings`):\n\n    " + doc[doc.index(":ivar"):].strip()
