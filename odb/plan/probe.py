"""``odb plan --probe MODEL``: the step-time model fitted to the user's model on the user's device.

`probe` runs forward, backward and an optimizer step of the model at a few batch shapes (rows x length, random
token ids: nothing is downloaded), times each (the median of a few repeats after a warm-up) and, on CUDA, reads
its peak memory; `fit` turns the timings into a `odb.plan.stepmodel.StepModel` of the same form as the stated
one (``compute = c_fixed + (a T + b L2) (T + K) / T`` for T tokens and L2 the attention's sum of squared
lengths, K the knee below which a batch leaves the device idle), by least squares at each knee of a small grid,
the best kept.  On CUDA, `largest_budget` reads the fitted memory (``m0 + m1 T + m2 L2``, least squares) and gives
the largest candidate budget whose worst batch (one row at the longest length, or rows x the longest) fits the
device's memory with `MARGIN` to spare.  On CPU only time is measured, and the report says so.

MODEL: a folder a ``transformers`` causal LM was saved to (loaded with ``local_files_only``), or
``module:callable`` (the module found from the current directory first) returning a ``torch.nn.Module`` whose
``forward(input_ids=...)`` returns a loss, a tensor, or an object with ``.logits`` or ``.loss``.
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from ..errors import ConfigError
from .stepmodel import StepModel

__all__ = ["ProbeResult", "probe", "probe_shapes", "fit", "load_model", "largest_budget", "MARGIN"]

MARGIN = 0.10  # of the device's memory, left free (fragmentation, the optimizer's first step, other buffers)
KNEES = (0.0, 64.0, 256.0, 1024.0, 4096.0)


@dataclass
class ProbeResult:
    """What the probe measured: per shape ``(rows, length)`` the seconds of one step and (CUDA) the peak bytes;
    the fitted step-time model; the device and its memory."""

    device: str
    shapes: list
    seconds: list
    peak_bytes: list | None
    model: StepModel
    total_bytes: int | None
    fit_error: float  # the fit's largest relative error over the shapes

    def as_dict(self) -> dict:
        return {"device": self.device, "shapes": [list(s) for s in self.shapes], "seconds": self.seconds,
                "peak_bytes": self.peak_bytes, "total_bytes": self.total_bytes, "fit_error": self.fit_error,
                "step_model": {k: getattr(self.model, k) for k in ("c_fixed", "flop_per_token", "flop_per_l2",
                                                                    "knee_tokens", "peak", "mfu")}}


def load_model(spec: str):
    """The model a ``--probe`` names (module docstring); ConfigError names what is wrong."""
    if os.path.isdir(spec):
        try:
            from transformers import AutoModelForCausalLM
        except ImportError:
            raise ConfigError(f"{spec} is a folder: loading it needs transformers (pip install transformers)") from None
        return AutoModelForCausalLM.from_pretrained(spec, local_files_only=True)
    mod, _, name = spec.partition(":")
    if not name:
        raise ConfigError(f"--probe {spec!r}: give a saved model's folder or module:callable")
    if os.getcwd() not in sys.path:  # the console script's path starts at its own folder: find the user's module
        sys.path.insert(0, os.getcwd())  # in the current directory, as ``python -m`` would
    try:
        factory = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"--probe {spec!r}: {type(e).__name__}: {e}") from None
    return factory()


def _loss(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out.float().mean()
    if getattr(out, "loss", None) is not None:
        return out.loss
    if getattr(out, "logits", None) is not None:
        return out.logits.float().mean()
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0].float().mean()
    raise ConfigError(f"the probed model's forward returned {type(out).__name__}: return a loss, a tensor, or an "
                      "object with .loss or .logits")


def probe(model, shapes: Sequence[tuple[int, int]], *, device: str | None = None, vocab: int | None = None,
          repeats: int = 3, step: Callable | None = None) -> ProbeResult:
    """Time forward + backward + an optimizer step of `model` at each ``(rows, length)`` of `shapes` (random
    token ids below `vocab`, default the model's ``config.vocab_size`` or 1000) on `device` (default CUDA if
    available); `step`, if given, replaces the timed call (``step(rows, length) -> None``, for tests)."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    if not shapes or any(r < 1 or n < 1 for r, n in shapes):
        raise ConfigError(f"probe shapes must be (rows >= 1, length >= 1) pairs, got {list(shapes)}")
    if step is None:
        model = model.to(device).train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
        vocab = vocab or int(getattr(getattr(model, "config", None), "vocab_size", 0) or 1000)
        gen = torch.Generator().manual_seed(0)

        def step(rows: int, length: int) -> None:
            ids = torch.randint(0, vocab, (rows, length), generator=gen).to(device)
            _loss(model(input_ids=ids)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    seconds, peaks = [], [] if cuda else None
    for rows, length in shapes:
        step(rows, length)  # warm-up: kernels chosen, optimizer state allocated
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            step(rows, length)
            if cuda:
                torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        seconds.append(statistics.median(ts))
        if cuda:
            peaks.append(int(torch.cuda.max_memory_allocated()))
    fitted, err = fit(shapes, seconds)
    total = int(torch.cuda.get_device_properties(torch.device(device)).total_memory) if cuda else None
    return ProbeResult(device, [tuple(s) for s in shapes], seconds, peaks, fitted, total, err)


def probe_shapes(lengths: Sequence[int], budgets: Sequence[int]) -> list[tuple[int, int]]:
    """Shapes spanning what the loader will form: lengths at the data's median, 90th percentile and longest
    (each within the smallest budget), as one row and as many rows as the smallest budget holds."""
    ls = np.asarray(lengths)
    b = int(min(budgets))
    picks = sorted({max(1, min(int(np.percentile(ls, q)), b)) for q in (50, 90, 100)})
    out = []
    for n in picks:
        out += sorted({(1, n), (max(1, b // n), n)})
    while len(out) < 3:  # one length only: a third shape, half the rows
        out.append((max(1, out[-1][0] // 2), out[-1][1]) if out[-1][0] > 1 else (1, max(1, out[-1][1] // 2)))
    return out


def _features(shapes) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray([r * n for r, n in shapes], dtype=float)  # padded tokens: every row at the batch's length
    l2 = np.asarray([r * n * n for r, n in shapes], dtype=float)
    return t, l2


def fit(shapes: Sequence[tuple[int, int]], seconds: Sequence[float], base: StepModel = StepModel()) \
        -> tuple[StepModel, float]:
    """The `StepModel` (module docstring's form; `base`'s other constants kept) that best fits `seconds` at
    `shapes` (padded batches), and its largest relative error.  Needs 3 shapes or more."""
    if len(shapes) < 3 or len(seconds) != len(shapes):
        raise ConfigError("fitting the step-time model needs the seconds of 3 shapes or more")
    t, l2 = _features(shapes)
    y = np.asarray(seconds, dtype=float)
    best = None
    for k in KNEES:
        x = np.stack([np.ones_like(t), t + k, l2 * (t + k) / t], axis=1)  # c, a, b; all >= 0
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        coef = np.maximum(coef, 0.0)
        err = float(np.max(np.abs(x @ coef - y) / y))
        if best is None or err < best[0]:
            best = (err, k, coef)
    err, k, (c, a, b) = best
    # the model's form with peak = mfu = 1: compute = c_fixed + (a T + b L2) (T + K) / T
    return replace(base, c_fixed=float(c), flop_per_token=float(a), flop_per_l2=float(b), knee_tokens=float(k),
                   peak=1.0, mfu=1.0), err


def largest_budget(res: ProbeResult, budgets: Sequence[int], max_length: int, margin: float = MARGIN) \
        -> tuple[int | None, str]:
    """The largest of `budgets` whose worst padded batch (one row of `max_length` when the budget is below it,
    else ``budget // max_length`` rows of it) fits in ``(1 - margin)`` of the device's memory by the fitted
    memory model, and why; (None, why) when none fits; on CPU (no peaks) (None, that only time was measured)."""
    if not res.peak_bytes or not res.total_bytes:
        return None, (f"probed on {res.device}: step time only (no device memory measured); pick the largest budget "
                      "your GPU fits at your longest sample")
    t, l2 = _features(res.shapes)
    x = np.stack([np.ones_like(t), t, l2], axis=1)
    coef, *_ = np.linalg.lstsq(x, np.asarray(res.peak_bytes, dtype=float), rcond=None)
    cap = (1 - margin) * res.total_bytes
    fits = []
    for b in sorted(budgets):
        rows = max(1, b // max_length)
        need = float(coef @ np.array([1.0, rows * max_length, rows * max_length * max_length]))
        if need <= cap:
            fits.append((b, need))
    if not fits:
        return None, (f"no candidate budget fits {res.device}'s memory with {margin:.0%} to spare at length "
                      f"{max_length}")
    b, need = fits[-1]
    return b, (f"token_budget={b}: the largest candidate whose worst batch ({max(1, b // max_length)} x {max_length} "
               f"tokens) the fitted memory puts at {need / 2**30:.1f} GiB of {res.total_bytes / 2**30:.1f} GiB, "
               f"{margin:.0%} left free")
