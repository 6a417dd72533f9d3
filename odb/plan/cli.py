"""``odb plan``: the planner on the command line, and the ways to give it lengths.

    odb plan LENGTHS --world-size N [--ranks-per-host G] [--budget B ...] [--window W ...] [--cost packed]
             [--column NAME] [--num-samples S] [--json] [--plot PATH] [--probe MODEL [--probe-device D]]

LENGTHS: a ``.npy`` (1-D ints), a ``.txt`` (ints separated by white space), a ``.jsonl`` (``--column``: a
number, or a list whose length counts, per line), a ``.parquet`` file (``--column``; needs pyarrow) or a
folder a `datasets.Dataset` was saved to (``--column``; needs datasets).  From a dataset object in Python,
`measure` reads lengths the way the loader does (``length_fn``), on a random sample, timing preprocessing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable, Sequence

import numpy as np

from ..errors import ConfigError

__all__ = ["read_lengths", "measure", "main"]


def _count(v) -> int:
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if hasattr(v, "__len__"):
        return len(v)
    raise ConfigError(f"a length must be an int or a sequence whose length counts, got {type(v).__name__}")


def read_lengths(path: str, column: str | None = None) -> np.ndarray:
    """Post-preprocessing lengths from a file or a saved dataset (module docstring); ConfigError names the fix."""
    if os.path.isdir(path):
        try:
            from datasets import load_from_disk
        except ImportError:
            raise ConfigError(f"{path} is a folder: reading a saved dataset needs `datasets` (pip install datasets)") \
                from None
        ds = load_from_disk(path)
        column = column or _obvious_column(list(ds.column_names), path)
        return np.asarray([_count(v) for v in ds[column]], dtype=np.int64)
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npy":
        return np.asarray(np.load(path), dtype=np.int64).reshape(-1)
    if ext in (".txt", ".csv", ""):
        with open(path) as f:
            return np.asarray([int(float(t)) for t in f.read().replace(",", " ").split()], dtype=np.int64)
    if ext == ".jsonl":
        if column is None:
            raise ConfigError("a .jsonl file needs --column (the field holding a length or a token list)")
        with open(path) as f:
            return np.asarray([_count(json.loads(line)[column]) for line in f if line.strip()], dtype=np.int64)
    if ext == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError("reading .parquet needs pyarrow (pip install pyarrow)") from None
        if column is None:
            raise ConfigError("a .parquet file needs --column")
        return np.asarray([_count(v) for v in pq.read_table(path, columns=[column])[column].to_pylist()],
                          dtype=np.int64)
    raise ConfigError(f"cannot read lengths from {path!r}: give a .npy, .txt, .jsonl or .parquet file, or a saved "
                      "dataset's folder")


# a saved dataset's column `odb plan` reads without --column: the loader's default length is input_ids'
_LENGTH_COLUMNS = ("input_ids", "length", "lengths", "num_tokens", "n_tokens")


def _obvious_column(names: list, path: str) -> str:
    """The column of a saved dataset that holds the lengths when the user named none: ``input_ids`` (what the
    loader measures by default), else the one column named like a length; ConfigError listing them otherwise."""
    for name in _LENGTH_COLUMNS:
        if name in names:
            return name
    raise ConfigError(f"{path}: which column holds the lengths or token lists? Pass --column, one of {names}")


def measure(dataset, *, num: int = 2000, length_fn: Callable | None = None, seed: int = 0) -> tuple[np.ndarray, float]:
    """Lengths of up to `num` random samples of `dataset` (map-style), measured as the loader measures them
    (``length_fn``, default the 1-D ``input_ids``; tokens first), and the mean seconds of one sample's
    preprocessing (``dataset[i]``).  Samples that preprocess to None are left out."""
    from ..runtime.source import default_length

    idx = np.random.default_rng(seed).permutation(len(dataset))[:num]
    out, t = [], 0.0
    for i in idx:
        t0 = time.perf_counter()
        s = dataset[int(i)]
        t += time.perf_counter() - t0
        if s is None:
            continue
        v = default_length(s) if length_fn is None else length_fn(s)
        out.append(int(v[0] if isinstance(v, (tuple, list)) else v))
    return np.asarray(out, dtype=np.int64), t / max(1, len(idx))


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib (pip install matplotlib); --json and the table need nothing") \
            from None
    return plt


def _plot(report, path: str) -> None:
    plt = _pyplot()
    preds = report.predictions
    fig, ax = plt.subplots(figsize=(7, 4))
    for pool, ex, mk, label in ((1, False, "o", "placement=None"), (1, True, "D", "exchanged (the default)"),
                                (None, False, "s", "pooled"), (None, True, "^", "pooled + exchange")):
        ps = [p for p in preds if p.candidate.exchange == ex and (p.candidate.pool_size == 1) == (pool == 1)]
        if ps:
            ax.scatter([p.straggler_efficiency for p in ps], [p.throughput_vs_gmt for p in ps], marker=mk, label=label)
    for p in preds:  # each point names its budget and window (the marker its placement)
        ax.annotate(f"{p.candidate.token_budget}/{p.candidate.buffer_size}", (p.straggler_efficiency,
                    p.throughput_vs_gmt), fontsize=6, xytext=(3, 3), textcoords="offset points")
    r = report.recommended
    ax.scatter([r.straggler_efficiency], [r.throughput_vs_gmt], s=160, facecolors="none", edgecolors="k",
               label="recommended")
    ax.axvline(0.97, color="grey", lw=0.7)
    ax.axhline(0.97, color="grey", lw=0.7)
    ax.set_title("each point: token_budget/buffer_size", fontsize=8)
    ax.set_xlabel("straggler efficiency (budget cost)")
    ax.set_ylabel("predicted throughput / GMT's")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    from .planner import DEFAULT_BUDGETS, DEFAULT_WINDOWS, plan

    ap = argparse.ArgumentParser(prog="odb plan", description="Predict steps, padding, balance and throughput of "
                                 "ODB configurations on your data's lengths, before training, and recommend one.")
    ap.add_argument("lengths", help="a .npy, .txt, .jsonl or .parquet file of post-preprocessing lengths, or a "
                                    "saved dataset's folder")
    ap.add_argument("--world-size", type=int, required=True, help="ranks (GPUs) that train")
    ap.add_argument("--ranks-per-host", type=int, default=1, help="GPUs per host (pooled candidates when > 1)")
    ap.add_argument("--budget", type=int, action="append", help=f"a token_budget candidate (repeatable; default "
                                                                f"{list(DEFAULT_BUDGETS)})")
    ap.add_argument("--window", type=int, action="append", help=f"a buffer_size candidate (repeatable; default "
                                                                f"{list(DEFAULT_WINDOWS)})")
    ap.add_argument("--cost", default="padded", choices=["padded", "packed"], help="as the loader's cost")
    ap.add_argument("--column", help="the field or column holding lengths (jsonl, parquet, saved dataset)")
    ap.add_argument("--num-samples", type=int, help="the dataset's size, when the lengths are a sample of it (the "
                    "epoch simulated; default: the number of lengths given)")
    ap.add_argument("--samples-per-rank", type=int, help="simulate this many samples a rank instead of the epoch, "
                    "and scale the steps to it")
    ap.add_argument("--seed", type=int, default=0, help="the loader's seed (its shuffled order)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    ap.add_argument("--jobs", type=int, help="processes simulating the candidates (default: one a CPU; 1: this "
                    "process alone); the report is the same with any number")
    ap.add_argument("--plot", help="write a PNG of the candidates (needs matplotlib)")
    ap.add_argument("--probe", metavar="MODEL", help="fit the step-time model to MODEL on this machine's device: a "
                    "saved transformers model's folder, or module:callable returning a torch module (odb.plan.probe)")
    ap.add_argument("--probe-device", help="the device to probe on (default: cuda if available, else cpu)")
    a = ap.parse_args(argv)
    probed, why_budget = None, None
    try:
        if a.plot:
            _pyplot()  # before the computation: a missing matplotlib fails now, not after it
        lengths = read_lengths(a.lengths, a.column)
        budgets = a.budget or list(DEFAULT_BUDGETS)
        extra = {}
        if a.probe:
            from .probe import largest_budget, load_model, probe, probe_shapes

            probed = probe(load_model(a.probe), probe_shapes(lengths, budgets), device=a.probe_device)
            extra["step_model"] = probed.model
            best, why_budget = largest_budget(probed, budgets, int(max(lengths)))
            if best is not None:  # only budgets the device's memory holds at the longest sample
                budgets = [b for b in budgets if b <= best]
        report = plan(lengths, world_size=a.world_size, ranks_per_host=a.ranks_per_host, budgets=budgets,
                      windows=a.window, cost=a.cost, samples_per_rank=a.samples_per_rank, num_samples=a.num_samples,
                      seed=a.seed, progress=None if a.quiet else lambda line: print(line, file=sys.stderr, flush=True),
                      jobs=a.jobs, **extra)
        if probed is not None:
            report.inputs["step_model"] = f"fitted on {probed.device} (largest error {probed.fit_error:.1%})"
            report.inputs["probe"] = probed.as_dict()
            report.why.insert(1, why_budget)
        if a.plot:
            _plot(report, a.plot)
    except (ConfigError, OSError, ValueError) as e:
        print(f"odb plan: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(report.to_json(), indent=1))
        return 0
    print(report.text())
    return 0
