"""Synthetic post-pipeline length distributions for the batching benchmark.

The paper reports only each dataset's coefficient of variation (CV) of the
post-pipeline length (FACTS.md section 1).  Everything else here is an
ASSUMPTION, chosen to be plausible for Qwen-VL-style pipelines with the
authors' cutoff of 16384 tokens:

    name        CV (paper)  shape (assumed)                       mean (assumed)
    llava       0.29        lognormal, clipped to [32, 16384]     1000 tokens (text + ~700 image tokens)
    ultrachat   0.48        lognormal, clipped to [32, 16384]     1300 tokens (multi-turn text)
    mmmix       0.80        lognormal, clipped to [32, 16384]     1200 tokens (mixed production data)
    sharegpt4o  1.00        lognormal, clipped to [32, 16384]     1500 tokens (long image/text dialogues)
    release     (~1.30)     the released package's own long-tail test mix: 72% uniform
                            in [64, 384), 22% in [384, 1400), 6% in [1400, 4096)

The lognormal's sigma is calibrated by bisection so that the *clipped* sample
has the paper's CV (within 0.01); the achieved mean and CV are reported by
`describe`.  Samples are single-resource sizes tuples ``(tokens,)``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["DISTRIBUTIONS", "sample_lengths", "describe"]

LO, CUTOFF = 32, 16384

# name -> (target CV, assumed mean); "release" is a fixed mixture.
DISTRIBUTIONS: dict[str, tuple[float | None, float | None]] = {
    "llava": (0.29, 1000.0),
    "ultrachat": (0.48, 1300.0),
    "mmmix": (0.80, 1200.0),
    "sharegpt4o": (1.00, 1500.0),
    "release": (None, None),
}


def _lognormal(z: np.ndarray, mean: float, cv: float) -> np.ndarray:
    def draw(sigma: float) -> np.ndarray:
        mu = math.log(mean) - sigma * sigma / 2
        return np.clip(np.exp(mu + sigma * z), LO, CUTOFF)

    lo, hi = 1e-3, 3.0
    for _ in range(50):
        mid = (lo + hi) / 2
        x = draw(mid)
        if x.std() / x.mean() < cv:
            lo = mid
        else:
            hi = mid
    return np.rint(draw((lo + hi) / 2))


def sample_lengths(name: str, num: int, seed: int = 0) -> list[tuple[int]]:
    """`num` lengths from distribution `name` (deterministic in `seed`), as ``(tokens,)`` tuples."""
    if name not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {name!r}; valid: {sorted(DISTRIBUTIONS)}")
    rng = np.random.default_rng(seed)
    if name == "release":
        u = rng.random(num)
        lo = np.where(u < 0.72, 64, np.where(u < 0.94, 384, 1400))
        hi = np.where(u < 0.72, 384, np.where(u < 0.94, 1400, 4096))
        x = rng.integers(lo, hi)
    else:
        cv, mean = DISTRIBUTIONS[name]
        x = _lognormal(rng.standard_normal(num), mean, cv)
    return [(int(v),) for v in x]


def describe(lengths: list[tuple[int]]) -> dict:
    """Mean, CV, min, max and p99 of the token lengths."""
    x = np.array([s[0] for s in lengths], dtype=float)
    return {"mean": float(x.mean()), "cv": float(x.std() / x.mean()), "min": int(x.min()),
            "max": int(x.max()), "p99": float(np.percentile(x, 99))}
