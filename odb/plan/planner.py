"""`odb plan`: what each configuration will do on your data, before training, and which one to run.

Legend
    N, G      world size, ranks per host (a pool's size when pooling)
    W         ``buffer_size``, samples a rank packs per round
    budget    ``token_budget`` in the cost model's units (padded tokens by default)
    targets   straggler efficiency >= 0.97 (budget cost), steps <= 1.05x and predicted throughput >= 0.97x the
              offline oracle GMT's (an exact length cache, a global sort): `TARGETS`

How: the lengths (post-preprocessing, a sample of your data or all of it) are dealt in the loader's own
shuffled order to N simulated ranks, each running the loader's rank core (`odb.core.sim.simulate`, the code
the loader runs), for every candidate (budget, window, placement).  Its batches give the steps, the padding
and the straggler efficiency (`odb.plan.metrics`); the stated step-time model (`odb.plan.stepmodel`: a 2B
decoder on NVIDIA H20) turns them, GMT's and Standard batch 1's into predicted throughput, ODB's round
collectives charged.  Given the lengths of the whole dataset and the loader's seed, the simulated batches
are the loader's own, batch for batch (a test pins this on gloo ranks); given a sample, the figures are
estimates whose error the documentation states.

1. candidates: each budget x each window x the placements this N allows (pooled windows and the round
   exchange need G ranks per host, N a multiple of G, and at least 2 pools);
2. every candidate simulated on the same dealt order of the user's epoch: ``num_samples`` samples (default: the
   lengths given, in the loader's own shuffle: its exact run); a sample of the data is scaled to that size by
   drawing with replacement, and the report says so.  A window larger than a rank's epoch is cut to it (one
   round then holds the whole epoch), and an epoch of fewer than `SMALL_EPOCH_STEPS` steps a rank is named:
   its balance and step targets describe a handful of steps;
3. the recommendation: of the candidates that meet every target, the one that costs least (the smallest
   budget whose throughput is within 5% of the best budget's, then the smallest window, then no pooling,
   then no exchange); if none meets them, the one with the best predicted throughput, its misses named.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..core.placement import DEFAULT_EXCHANGE, Exchanged, Pooled
from ..errors import ConfigError
from ..settings import LoaderSettings
from .metrics import schedule_metrics, token_balance
from .stepmodel import H20_2B, StepModel, odb_round_latency, predict

__all__ = ["Candidate", "Prediction", "PlanReport", "plan", "TARGETS", "DEFAULT_WINDOWS", "DEFAULT_BUDGETS",
           "SMALL_EPOCH_STEPS", "COLUMNS"]

TARGETS = {"straggler_efficiency": 0.97, "steps_vs_gmt": 1.05, "throughput_vs_gmt": 0.97}
SMALL_EPOCH_STEPS = 20  # GMT's steps a rank an epoch below which the report says the targets mean little
# what the table's columns are, in one line (the planning guide says more)
COLUMNS = ("steps: optimizer steps per rank per epoch; padding: padded share of the batches' tokens; straggler: "
           "mean/max rank batch cost per step (1 = balanced); vs GMT, vs Std-1: predicted throughput over the offline "
           "oracle GMT's and over a fixed batch of 1; moved: batches the exchange sends to another rank")
DEFAULT_WINDOWS = (256, 1024, 2048, 4096)
DEFAULT_BUDGETS = (4096, 8192, 16384)  # the paper's recipes use 8192 to 16384 padded tokens
SLACK = DEFAULT_EXCHANGE.slack  # the exchange's budget balance where it is a candidate: the default's


@dataclass(frozen=True)
class Candidate:
    """One configuration: the `odb.ODBDataLoader` settings it stands for (`settings`)."""

    token_budget: int
    buffer_size: int
    pool_size: int = 1
    exchange: bool = False

    def placement(self) -> "Pooled | Exchanged | None":
        """The ``placement=`` setting this candidate stands for."""
        if self.exchange:
            return Exchanged(pool=self.pool_size, slack=SLACK)
        return Pooled(self.pool_size) if self.pool_size > 1 else None

    def settings(self) -> dict:
        """Keyword arguments for `odb.ODBDataLoader`: the budget, the window and the placement, always given
        (None, or its JSON form, which ``placement=`` takes as it is), since the default "auto" depends on
        the world size."""
        p = self.placement()
        return {"token_budget": self.token_budget, "buffer_size": self.buffer_size,
                "placement": None if p is None else p.as_dict()}

    def loader_settings(self, cost) -> LoaderSettings:
        """The `odb.LoaderSettings` of this candidate with a ready cost model (what the simulation runs)."""
        return LoaderSettings(token_budget=None, cost=cost, buffer_size=self.buffer_size, placement=self.placement())

    def label(self) -> str:
        p = self.placement()
        return f"token_budget={self.token_budget}, buffer_size={self.buffer_size}, placement={p!r}"

    def call(self) -> str:
        """The loader's construction with every setting of this candidate, the placement always named."""
        p = self.placement()
        return (f"ODBDataLoader(dataset, token_budget={self.token_budget}, buffer_size={self.buffer_size}, "
                f"placement={'None' if p is None else f'odb.{p!r}'})")


@dataclass
class Prediction:
    """What one candidate does on the simulated epoch (per rank, per epoch of the planned dataset size)."""

    candidate: Candidate
    steps: float                     # optimizer steps per rank per epoch (PAD: every rank alike)
    padding: float                   # padded share of the batches' tokens (pad collate)
    straggler_efficiency: float      # mean over steps of mean / max rank batch cost, in budget cost
    token_balance: float             # the loader's own straggler estimate: sum of mean / sum of max rank tokens
    budget_use: float                # how full the batches are, of the budget
    steps_vs_gmt: float
    throughput_vs_gmt: float         # predicted samples/s over GMT's, through the step-time model
    throughput_vs_standard: float    # and over Standard batch 1's (per device, matched nothing)
    first_batch_s: float | None      # the preprocessing a rank does before its first batch (None: time not given)
    window_bytes: float | None       # host memory per rank: about 3 windows of samples (None: size unknown)
    moved_share: float = 0.0         # the exchange: batches sent to another rank's pool, of all real batches
    misses: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["candidate"] = self.candidate.settings()
        return out


@dataclass
class PlanReport:
    """The predictions, the recommended one and why (one line per choice), and the inputs."""

    predictions: list[Prediction]
    recommended: Prediction
    why: list[str]
    inputs: dict
    seconds: float

    def to_json(self) -> dict:
        """What ``odb plan --json`` prints: ``recommended`` holds ``settings`` (keywords for `odb.ODBDataLoader`)
        and ``predicted`` (``steps`` per rank per epoch, ``straggler_efficiency`` in budget cost, ``padding``)."""
        r = self.recommended
        return {"recommended": {"settings": r.candidate.settings(), "why": self.why, "predicted": {
                    k: v for k, v in r.as_dict().items() if k != "candidate"}},
                "candidates": [p.as_dict() for p in self.predictions], "inputs": self.inputs,
                "targets": TARGETS, "seconds": self.seconds}

    def __str__(self) -> str:
        return self.text()

    def text(self) -> str:
        """What ``odb plan`` prints: the inputs in a line, the table, its columns, the recommendation (every
        setting, the placement included) and why."""
        i = self.inputs
        how = {"exact": "the loader's own order of every length given",
               "subset": f"the first {i['simulated_samples']} of the loader's order of the {i['lengths']} given",
               "drawn": f"drawn with replacement from the {i['lengths']} given"}[i["order"]]
        out = [f"{i['lengths']} lengths (mean {i['mean_length']:.0f}, CV {i['cv']:.2f}, max {i['max_length']}); "
               f"{i['world_size']} ranks; an epoch of {i['simulated_samples']} samples ({i['samples_per_rank']} a "
               f"rank) simulated, {how}; step-time model {i['step_model']}; {self.seconds:.1f} s"]
        if i.get("windows_cut"):
            out.append(f"(buffer_size {', '.join(map(str, i['windows_cut']))} cut to {i['samples_per_rank']}, a "
                       "rank's epoch: a larger window holds nothing more)")
        out += ["", self.table(), "", COLUMNS, "", "Recommended: " + self.recommended.candidate.call()]
        out += [f"  - {line}" for line in self.why]
        return "\n".join(out)

    def table(self) -> str:
        """The predictions as text, one line per candidate, the recommended one marked."""
        w = max(len(p.candidate.label()) for p in self.predictions)
        head = (f"{'':2}{'settings':{w}} {'steps':>8} {'padding':>8} {'straggler':>9} {'vs GMT':>7} {'vs Std-1':>8} "
                f"{'moved':>6}")
        lines = [head]
        for p in self.predictions:
            mark = "->" if p is self.recommended else "  "
            lines.append(f"{mark}{p.candidate.label():{w}} {p.steps:8.1f} {p.padding:8.3f} "
                         f"{p.straggler_efficiency:9.3f} "
                         f"{p.throughput_vs_gmt:6.3f}x {p.throughput_vs_standard:7.2f}x {p.moved_share:6.1%}")
        return "\n".join(lines)


def _candidates(world_size: int, ranks_per_host: int, budgets, windows) -> list[Candidate]:
    g = ranks_per_host
    pooled = g > 1 and world_size % g == 0 and world_size >= 2 * g
    out = []
    for b in budgets:
        for w in windows:
            out.append(Candidate(int(b), int(w)))
            if world_size >= 2:  # the default placement there ("auto": `DEFAULT_EXCHANGE`)
                out.append(Candidate(int(b), int(w), 1, exchange=True))
            if pooled:
                out += [Candidate(int(b), int(w), g), Candidate(int(b), int(w), g, exchange=True)]
    return out


def _dealt(lengths: np.ndarray, total: int, seed: int) -> tuple[np.ndarray, str]:
    """`total` lengths in the loader's dealt order, and how they were taken: all given ones in its shuffle
    (``seed``, epoch 0) when that many were given ("exact"), the first `total` of that order when more were
    given ("subset"), else drawn with replacement, seeded ("drawn")."""
    from ..runtime.source import shard_order

    if total <= len(lengths):
        order = lengths[np.asarray(shard_order(len(lengths), 0, 1, True, seed, 0))]
        return (order, "exact") if total == len(lengths) else (order[:total], "subset")
    return np.random.default_rng(seed).choice(lengths, size=total, replace=True), "drawn"


def _measured(lengths):
    """`odb.plan.measure`'s ``(lengths, seconds)`` pair, or None."""
    if isinstance(lengths, tuple) and len(lengths) == 2 and isinstance(lengths[1], float) and \
            hasattr(lengths[0], "__len__"):
        return lengths
    return None


def plan(lengths: Sequence[int], *, world_size: int, ranks_per_host: int = 1, budgets: Sequence[int] | None = None,
         windows: Sequence[int] | None = None, cost: str = "padded", samples_per_rank: int | None = None,
         num_samples: int | None = None, seed: int = 0, preprocess_s: float | None = None, num_workers: int = 0,
         sample_bytes: float | None = None, step_model: StepModel = H20_2B,
         progress: Callable[[str], None] | None = None, jobs: int | None = 1) -> PlanReport:
    """Predict every candidate configuration on these post-preprocessing `lengths` and recommend one.

    :param lengths: tokens per sample after preprocessing (all of the data, or a sample of it with
        ``num_samples``); or what `odb.plan.measure` returns, ``(lengths, seconds)``, whose seconds become
        ``preprocess_s``.
    :param world_size: N ranks; ``ranks_per_host`` G makes pooled windows and the exchange candidates.
    :param budgets: candidate ``token_budget`` values (default `DEFAULT_BUDGETS`); ``windows``: candidate
        ``buffer_size`` values (default `DEFAULT_WINDOWS`).
    :param cost: ``"padded"`` (the loader's default) or ``"packed"`` (a padding-free collate).
    :param num_samples: the dataset's size, the epoch simulated (default: the number of lengths given).
    :param samples_per_rank: simulate this many samples a rank instead, and scale the steps to ``num_samples``.
    :param preprocess_s: seconds to preprocess one sample, for the first batch's wait (with ``num_workers``).
    :param sample_bytes: host bytes of one preprocessed sample, for the window's memory.
    :param progress: called with a line as each candidate is done (the command line prints it on stderr).
    :param jobs: processes simulating the candidates (each candidate's run is the same in any of them, so the
        report is too); None: one a CPU this process may use.  The command line's default is None.
    Raises `ConfigError` for lengths that are empty, not positive, a world size below 1, an epoch of fewer
    samples than ranks, or jobs below 1.
    """
    from ..baselines.offline import global_max_tokens, standard
    from ..batching import make_cost_model

    t0 = time.perf_counter()
    measured = _measured(lengths)
    if measured is not None:
        lengths, secs = measured
        preprocess_s = secs if preprocess_s is None else preprocess_s
    lens = np.asarray([int(x) for x in lengths], dtype=np.int64)
    if lens.size == 0 or lens.min() < 1:
        raise ConfigError("odb plan needs at least one length, every one >= 1 token (post-preprocessing lengths)")
    if world_size < 1 or ranks_per_host < 1:
        raise ConfigError(f"world_size and ranks_per_host must be >= 1, got {world_size} and {ranks_per_host}")
    if jobs is not None and int(jobs) < 1:
        raise ConfigError(f"jobs must be >= 1 (processes simulating the candidates), got {jobs}")
    if jobs != 1 and _in_a_workers_import():
        raise ConfigError(f"odb plan: plan(jobs={jobs}) was called while a worker process imported the calling "
                          f"script. {_GUARD}")
    if cost not in ("padded", "packed"):
        raise ConfigError(f"cost must be 'padded' or 'packed', got {cost!r}")
    budgets = sorted(set(budgets or DEFAULT_BUDGETS))
    num_samples = int(num_samples or len(lens))
    total = num_samples if samples_per_rank is None else int(samples_per_rank) * world_size
    if total < world_size:
        raise ConfigError(f"an epoch of {total} samples on {world_size} ranks: fewer samples than ranks")
    per_rank = total // world_size
    asked = sorted(set(windows or DEFAULT_WINDOWS))
    cut = [w for w in asked if w > per_rank]  # a window past a rank's epoch holds nothing more: cut to it
    windows = sorted({w for w in asked if w <= per_rank} | ({per_rank} if cut else set()))
    dealt, order = _dealt(lens, total, seed)
    scale = num_samples / total
    collate = "pad" if cost == "padded" else "packed"
    run = _Epoch(dealt, world_size, cost, collate, step_model, preprocess_s, num_workers, sample_bytes, scale=scale)
    sizes, filler = run.sizes, run.filler
    gmt_steps, todo, ref = [], [], {}
    for b in budgets:
        cm = make_cost_model(cost, b)
        gmt = _predicted(global_max_tokens(sizes, cm, world_size), sizes, world_size, filler, collate, step_model)
        std = _predicted(standard(len(sizes), world_size, 1), sizes, world_size, filler, collate, step_model)
        gmt_steps.append(gmt["steps"] * scale)
        ref[b] = (gmt, std)
        todo += _candidates(world_size, ranks_per_host, [b], windows)
    jobs = _jobs(jobs, len(todo), total)
    predictions: list[Prediction] = [None] * len(todo)  # type: ignore[list-item]

    def done(k: int, p: Prediction, seconds: float) -> None:
        predictions[k] = p
        if progress is not None:
            progress(f"odb plan: {sum(q is not None for q in predictions)}/{len(todo)} {p.candidate.label()}: "
                     f"{seconds:.1f} s")
    if jobs == 1:
        for k, c in enumerate(todo):
            done(k, *run.predict(c, *ref[c.token_budget]))
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool
        from multiprocessing import get_context

        # spawn: a fresh interpreter each (a fork would copy a parent's threads' state, torch's included)
        try:
            with tempfile.TemporaryDirectory(prefix="odb-plan-") as tmp, \
                    ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=_Epoch.install,
                                        initargs=(run, _saved(tmp, run.dealt))) as pool:
                futures = {pool.submit(_predict_installed, c, *ref[c.token_budget]): k for k, c in enumerate(todo)}
                for f in as_completed(futures):
                    done(futures[f], *f.result())
        except (BrokenProcessPool, BrokenPipeError) as e:  # a worker died starting: most often the script below
            raise ConfigError(f"odb plan: a worker process of plan(jobs={jobs}) ended before it answered "
                              f"({type(e).__name__}). {_GUARD}") from e
    rec, why = _recommend(predictions, budgets, per_rank)
    if min(gmt_steps) < SMALL_EPOCH_STEPS:
        why.append(f"a small epoch: {per_rank} samples a rank, {min(gmt_steps):.0f} steps of the offline oracle's at "
                   "the smallest budget; the straggler and step targets describe a handful of steps here, and the "
                   "first and last rounds weigh as much as the rest")
    inputs = {"lengths": len(lens), "mean_length": float(lens.mean()), "cv": float(lens.std() / lens.mean()),
              "max_length": int(lens.max()), "world_size": world_size, "ranks_per_host": ranks_per_host,
              "cost": cost, "simulated_samples": total, "samples_per_rank": per_rank, "order": order,
              "windows_cut": cut, "num_samples": num_samples, "seed": seed,
              "step_model": "H20_2B" if step_model == H20_2B else repr(step_model)}
    return PlanReport(predictions, rec, why, inputs, time.perf_counter() - t0)


_GUARD = ("Each worker process of plan(jobs=None or > 1) imports the script that calls it: put the script's work "
          "under `if __name__ == \"__main__\":`, or pass jobs=1 (one process)")


def _in_a_workers_import() -> bool:
    """Called from the top level of a script that a spawned worker is importing (as ``__mp_main__``, Python's name
    for it there): a script without the ``__main__`` guard, which would plan again in every worker."""
    return any(f.f_globals.get("__name__") == "__mp_main__" and f.f_code.co_name == "<module>"
               for f, _ in traceback.walk_stack(None))


# Below this many simulated samples (summed over the candidates, about 1 s of simulation) ``jobs=None`` keeps to this
# process: a worker's start (a fresh interpreter importing odb) costs about what it would save.
POOL_FROM_SAMPLES = 100_000


def _jobs(jobs: int | None, candidates: int, samples: int) -> int:
    """Processes to simulate the candidates in: ``jobs``; None: this process's CPUs where the work is worth a pool
    (`POOL_FROM_SAMPLES`), else 1; never more than the candidates."""
    if jobs is None:
        if samples * candidates < POOL_FROM_SAMPLES:
            return 1
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(int(jobs), candidates))


class _Epoch:
    """The simulated epoch every candidate runs on, and what turns a candidate's run into its `Prediction`
    (the same in this process or in a worker of the pool, where `install` keeps it)."""

    installed: "_Epoch | None" = None

    def __init__(self, dealt: np.ndarray, world_size, cost, collate, step_model, preprocess_s, num_workers,
                 sample_bytes, *, scale: float):
        self.world_size, self.cost, self.collate, self.scale = world_size, cost, collate, scale
        self.step_model, self.preprocess_s = step_model, preprocess_s
        self.num_workers, self.sample_bytes = num_workers, sample_bytes
        self.filler = int(np.median(dealt))
        self._read(dealt)

    def _read(self, dealt: np.ndarray) -> None:
        self.dealt = dealt
        self.sizes = [(int(x),) for x in dealt]
        self.measures = [((int(x),), int(x) - 1) for x in dealt]

    def __getstate__(self) -> dict:
        """What a worker is handed with its start: the settings; the lengths go by file (`install`).  A start's
        message stays small: CPython writes it whole before the new process reads it, so a large one would
        block the pool for good if that process ended early."""
        return {k: v for k, v in self.__dict__.items() if k not in ("dealt", "sizes", "measures")}

    @staticmethod
    def install(epoch: "_Epoch", path: str) -> None:
        epoch._read(np.load(path))
        _Epoch.installed = epoch

    def predict(self, c: Candidate, gmt: dict, std: dict) -> tuple[Prediction, float]:
        """(candidate `c`'s prediction, seconds it took)."""
        from ..batching import default_policy, make_cost_model
        from ..core.header import header_layout
        from ..core.sim import simulate

        t0 = time.perf_counter()
        cm, sizes, world_size = make_cost_model(self.cost, c.token_budget), self.sizes, self.world_size
        with _collector_paused():
            sim = simulate([[] for _ in range(world_size)], c.loader_settings(cm), deal=self.measures)
        pl = c.placement()
        header = header_layout(default_policy(c.pool_size).summary_len, c.buffer_size, c.pool_size,
                               c.exchange, 0 if pl is None else pl.slack_bp).length
        round_s = odb_round_latency(self.step_model, world_size, c.buffer_size, header)[0]
        m = schedule_metrics(sim.batches, sizes, cm)
        run = predict(_plan(sim.batches, sizes, world_size, self.filler), world_size, self.step_model,
                      num_rounds=sim.rounds, round_s=round_s, collate=self.collate)
        real = sum(b is not None for row in sim.batches for b in row)
        w_samples = c.buffer_size * c.pool_size
        p = Prediction(
            candidate=c, steps=m["steps"] * self.scale, padding=m["padding"], straggler_efficiency=m["straggler_eff"],
            token_balance=token_balance(sim.batches, sizes), budget_use=m["budget_use"],
            steps_vs_gmt=m["steps"] / max(1, gmt["steps"]),
            throughput_vs_gmt=run["samples_per_s"] / gmt["samples_per_s"],
            throughput_vs_standard=run["samples_per_s"] / std["samples_per_s"],
            first_batch_s=None if self.preprocess_s is None else
            max((w for w in sim.first_wait if w is not None), default=0) * self.preprocess_s / max(1, self.num_workers),
            window_bytes=None if self.sample_bytes is None else 3 * w_samples * self.sample_bytes,
            moved_share=sim.moved / max(1, real))
        p.misses = [k for k, ok in (("straggler_efficiency", p.straggler_efficiency >= TARGETS["straggler_efficiency"]),
                                    ("steps_vs_gmt", p.steps_vs_gmt <= TARGETS["steps_vs_gmt"]),
                                    ("throughput_vs_gmt", p.throughput_vs_gmt >= TARGETS["throughput_vs_gmt"]))
                    if not ok]
        return p, time.perf_counter() - t0


def _predict_installed(c: Candidate, gmt: dict, std: dict) -> tuple[Prediction, float]:
    """A pool worker's task: `_Epoch.predict` on the epoch its initializer installed."""
    return _Epoch.installed.predict(c, gmt, std)


def _saved(folder: str, dealt: np.ndarray) -> str:
    path = os.path.join(folder, "lengths.npy")
    np.save(path, dealt)
    return path


@contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while a simulation runs: the simulation allocates millions of
    short-lived objects, and each full collection walks every one alive (a fifth of a 100,000-sample epoch's
    time); the collector is back on, as it was, once the run is done and the next collection frees its cycles."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _plan(rows, sizes, world: int, filler: int) -> list:
    """``rows[rank][step]`` (positions, None = a filler) -> the step model's plan of lengths."""
    steps = max(len(r) for r in rows)
    return [[("filler", filler) if (s < len(rows[r]) and rows[r][s] is None) else
             [sizes[i][0] for i in (rows[r][s] if s < len(rows[r]) else [])] for r in range(world)]
            for s in range(steps)]


def _predicted(rows, sizes, world: int, filler: int, collate: str, model: StepModel) -> dict:
    out = predict(_plan(rows, sizes, world, filler), world, model, collate=collate)
    return {"steps": max(len(r) for r in rows), "samples_per_s": out["samples_per_s"]}


def _recommend(preds: list[Prediction], budgets: list[int], per_rank: int) -> tuple[Prediction, list[str]]:
    # Standard batch 1 is the same run whatever the budget: the one scale all budgets are read on
    best_by_budget = {b: max(p.throughput_vs_standard for p in preds if p.candidate.token_budget == b)
                      for b in budgets}
    top = max(best_by_budget.values())
    budget = min(b for b in budgets if best_by_budget[b] >= 0.95 * top)
    fit = "it must fit your GPU: with cost='padded' no batch holds more than rows x longest <= budget tokens"
    if best_by_budget[budget] == top:
        why = [f"token_budget={budget}: the best predicted throughput ({top:.2f}x Standard batch 1)" +
               ("" if budget == budgets[0] else ", and no smaller budget is within 5% of it") + f"; {fit}"]
    else:
        why = [f"token_budget={budget}: the smallest budget within 5% of the best predicted throughput "
               f"({best_by_budget[budget]:.2f}x Standard batch 1 against {top:.2f}x); {fit}"]
    mine = [p for p in preds if p.candidate.token_budget == budget]
    meets = [p for p in mine if not p.misses]

    def price(p: Prediction):
        c = p.candidate
        return (c.buffer_size * c.pool_size, c.pool_size, c.exchange)
    if meets:
        rec = min(meets, key=price)
        c = rec.candidate
        why.append(f"buffer_size={c.buffer_size}: the smallest window that meets every target here (straggler "
                   f"{rec.straggler_efficiency:.3f}, {rec.throughput_vs_gmt:.3f}x GMT's throughput, "
                   f"{rec.steps_vs_gmt:.3f}x its steps)")
    else:
        rec = max(mine, key=lambda p: (p.throughput_vs_gmt, -price(p)[0]))
        c = rec.candidate
        helps = ("the window holds a rank's whole epoch already: pooling with the exchange (--ranks-per-host) is "
                 "what could help" if c.buffer_size >= per_rank else
                 "a larger window, or pooling with the exchange, is what would help")
        why.append(f"buffer_size={c.buffer_size}: no candidate meets every target; this one predicts the best "
                   f"throughput ({rec.throughput_vs_gmt:.3f}x GMT's) and misses {', '.join(rec.misses)} (straggler "
                   f"{rec.straggler_efficiency:.3f}); {helps}")
    if c.pool_size > 1:
        why.append(f"placement={c.placement()!r}" +
                   (": no placement without pooling meets the targets here" if meets else
                    ": the best predicted throughput of the placements") +
                   "; the price: each rank preprocesses its pool's samples" +
                   (f", and {rec.moved_share:.0%} of the batches move between ranks" if c.exchange else ""))
    elif c.exchange:
        why.append(f"placement={c.placement()!r} (the default on 2 ranks or more): the window alone does not meet "
                   f"the targets here; the price: {rec.moved_share:.0%} of the batches move between ranks, one "
                   "round more of batches in host memory")
    elif any(p.candidate.exchange or p.candidate.pool_size > 1 for p in mine):
        why.append("placement=None: the window alone meets the targets, no batch moves between ranks" if meets
                   else "placement=None: no other placement predicts better here")
    return rec, why
