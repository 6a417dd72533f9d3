"""Scopes the engines explore (exhaustive, small) and the z3 configuration.

A scope is (N ranks, D max samples per shard, W window, modes).  Data vectors
are enumerated as multisets (rank symmetry).  Numbers here are stated in the
report next to every verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Scope", "CI_SCOPES", "DEEP_SCOPES"]


@dataclass(frozen=True)
class Scope:
    n_max: int
    d_max: int
    w: int
    modes: tuple[int, ...] = (0, 1, 2)

    def __str__(self) -> str:
        return f"N<={self.n_max}, D<={self.d_max}, W={self.w}"


# Tuned by the explicit engine to fit `make verify` (< 60 s on 2 cores); see proofs/REPORT.md.
CI_SCOPES = (Scope(n_max=6, d_max=2, w=2), Scope(n_max=3, d_max=3, w=2))
# N=7 at D<=2, W=2 is about 2.4M canonical states per mode (pad); N=8 (~10M) does not fit a 2-core,
# shared 24 GiB machine with the dict-based engine in reasonable time, see proofs/REPORT.md.
DEEP_SCOPES = (Scope(n_max=7, d_max=2, w=2), Scope(n_max=4, d_max=3, w=2), Scope(n_max=5, d_max=3, w=1))
