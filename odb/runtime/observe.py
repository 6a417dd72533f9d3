"""What a pass tells its user: a summary per completed pass on ``logging.getLogger("odb")``, and an
optional progress bar counted in samples.

The summary is logged at INFO by every rank, for its own batches, with the straggler estimate from
the gathered counts (`odb.core.info.LoaderStats.token_balance`).  The bar counts every rank's samples
(each step's gathered ``global_samples``), so it reads the same on every rank that shows one; its total
is the dataset's length when the loader owns the order (one epoch of every rank), else unknown.  In
JOIN mode a rank's bar stops when its own data ends.
"""

from __future__ import annotations

import logging
import time

from ..core.info import LoaderStats, StepInfo
from ..errors import ConfigError

__all__ = ["PassObserver", "summary_line", "LOG"]

LOG = logging.getLogger("odb.runtime")  # a child of "odb": configure that one


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def summary_line(s: LoaderStats, *, epoch: int, rank: int, world_size: int) -> str:
    """One line for the counters `s` of one pass (a `LoaderStats.since` delta)."""
    f = s.figures()
    bal = "n/a" if f["token_balance"] is None else f"{f['token_balance']:.3f}"
    use = "n/a" if f["budget_use"] is None else f"{f['budget_use']:.3f}"
    worst = f" (the costliest {s.oversize_worst[0]:.2f}x the budget)" if s.oversize and s.oversize_worst else ""
    drops = [f"{n} {k}" for k, n in (("dropped", s.dropped), ("empty", s.empty), ("oversize" + worst, s.oversize),
                                      ("oversize skipped", s.oversize_skipped), ("unemitted", s.unemitted),
                                      ("zero-label steps", s.zero_label_steps)) if n]
    return (f"odb epoch {epoch} rank {rank}/{world_size}: {s.steps} steps ({s.fillers} fillers), {s.samples} "
            f"samples, {s.real_tokens} tokens; padding {_pct(f['padding_ratio'])} of padded tokens, budget use "
            f"{use}, token balance {bal} (mean/max rank per step), waited {_pct(f['wait_fraction'])} of "
            f"{s.pass_time_s:.2f} s, {s.rounds} rounds ({s.collective_s:.2f} s in collectives)"
            + (f"; exchange: {s.exchange_sent} batches sent, {s.exchange_received} received, "
               f"{s.exchange_bytes / 2**20:.1f} MiB" if s.exchange_sent or s.exchange_received else "")
            + (f"; {', '.join(drops)}" if drops else ""))


def make_bar(total: int | None, initial: int, desc: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        raise ConfigError("progress=True shows a tqdm bar, and tqdm is not installed: pip install tqdm, or leave "
                          "progress=False (the per-epoch summary is logged to logging.getLogger('odb'))") from None
    return tqdm(total=total, initial=initial, desc=desc, unit="sample", dynamic_ncols=True)


# The first completed pass whose balance misses this asks `odb plan` what a larger window would buy (once per
# loader, rank 0, and only where the simulation is quick: at most `HINT_SAMPLES` simulated samples).
HINT_BALANCE, HINT_SAMPLES = 0.97, 300_000


class PassObserver:
    """The summary and the bar of one pass of `loader` (module docstring), and the planner's hint."""

    def __init__(self, loader, epoch: int, total: int | None, before: LoaderStats):
        self._before, self._t0 = before, time.perf_counter()
        self.epoch, self._bar = epoch, None
        self.lengths: list[int] = []  # this rank's samples' tokens this pass (the hint's sample of the data)
        if loader.settings.progress:
            self._bar = make_bar(total, loader.ledger.samples, f"odb epoch {epoch}")

    def batch(self, info: StepInfo, sizes=()) -> None:
        self.lengths += sizes
        if self._bar is not None:
            self._bar.update(info.global_samples)

    def end(self, loader, completed: bool) -> None:
        """Count the pass's wall time, close the bar; log the summary if the pass ran to its end."""
        loader.stats.pass_time_s += time.perf_counter() - self._t0
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if completed and LOG.isEnabledFor(logging.INFO):
            delta = loader.stats.since(self._before)
            LOG.info(summary_line(delta, epoch=self.epoch, rank=loader.rank, world_size=loader.world_size))
            balance = delta.token_balance()
            if loader.rank == 0 and not loader.hinted and balance is not None and balance < HINT_BALANCE:
                loader.hinted = True
                LOG.info(plan_hint(loader, self.lengths, balance))


def plan_hint(loader, lengths: list[int], balance: float) -> str:
    """What `odb plan` predicts a larger ``buffer_size`` would buy, from this rank's lengths of the pass."""
    s, n, w = loader.settings, loader.world_size, loader.settings.buffer_size
    cost = s.cost if isinstance(s.cost, str) else None
    if cost not in ("padded", "packed") or not isinstance(s.token_budget, (int, float)) or len(lengths) < 2:
        return (f"odb: token balance {balance:.3f} (below {HINT_BALANCE}); `odb plan` on your data's lengths "
                "predicts what another buffer_size or placement would give (docs/guide/planning.md)")
    # larger windows, never past this rank's epoch (the planner cuts a window there: it would hold nothing more)
    windows = sorted({min(v, len(lengths)) for v in (w, 2 * w, 4 * w)})
    if len(windows) == 1:
        return (f"odb: token balance {balance:.3f} (below {HINT_BALANCE}) at buffer_size={w}, which already holds "
                f"this rank's whole epoch ({len(lengths)} samples): a larger window cannot help; `odb plan` on your "
                "data's lengths predicts what pooling or another budget would give (docs/guide/planning.md)")
    if n * len(lengths) > HINT_SAMPLES:
        return (f"odb: token balance {balance:.3f} (below {HINT_BALANCE}) at buffer_size={w}; run `odb plan` on "
                f"your data's lengths with --world-size {n} to see what buffer_size={2 * w} or pooling would give "
                "(docs/guide/planning.md)")
    from ..plan import plan

    try:
        report = plan(lengths, world_size=n, budgets=[int(s.token_budget)], windows=windows, cost=cost,
                      seed=s.seed, num_samples=len(lengths) * n)
    except Exception as e:  # noqa: BLE001 - a hint: never the training's failure
        return f"odb: token balance {balance:.3f}; the planner's hint failed ({type(e).__name__}: {e})"
    by = {p.candidate.buffer_size: p for p in report.predictions if p.candidate.placement() == s.placement}
    # token balance: the quantity measured above, predicted on this rank's lengths drawn for every rank (so the
    # current window's prediction differs from the measurement by the other ranks' data and the draw)
    parts = [f"buffer_size={v}{' (now)' if v == min(w, len(lengths)) else ''}: token balance "
             f"{by[v].token_balance:.3f}, {by[v].throughput_vs_gmt:.3f}x the offline oracle's throughput, about "
             f"{3 * v} samples in host memory per rank" for v in windows]
    ex = [p for p in report.predictions if p.candidate.buffer_size == w and p.candidate.pool_size == 1
          and p.candidate.exchange and s.placement is None]
    if ex:  # the default's exchange, where this loader runs without it
        parts.append(f"placement='auto' (the default: the round exchange) at buffer_size={w}: token balance "
                     f"{ex[0].token_balance:.3f}, {ex[0].throughput_vs_gmt:.3f}x, {ex[0].moved_share:.0%} of "
                     "the batches sent to another rank")
    return (f"odb: token balance {balance:.3f} measured (below {HINT_BALANCE}); `odb plan` on this rank's "
            f"{len(lengths)} lengths, drawn for all {n} ranks, predicts: " + "; ".join(parts) +
            " (a prediction from one rank's lengths: it differs from the measurement by what the other ranks held; "
            "docs/guide/planning.md)")
