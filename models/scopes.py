"""Scopes the engines explore (exhaustive, small) and the z3 configuration.

A scope is (N ranks, D max samples per shard, W window, modes, Q quits).  Data
vectors are enumerated as multisets (rank symmetry).  ``quits`` is how many
ranks may stop (`models.env.Model(quits=...)`) in one run: the environment's
``quit`` may then fire at any time before a rank is DONE, which multiplies the
state space, so the quit scopes are smaller.  Numbers here are stated in the
report next to every verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Scope", "CI_SCOPES", "DEEP_SCOPES", "DealtScope", "DEALT_SCOPES"]


@dataclass(frozen=True)
class Scope:
    """One exhaustive scope: every N in 1..n_max, every data vector in 0..d_max.

    :param confluence_n_max: the largest N of the confluence runs (None: n_max);
        confluence is checked only when ``quits == 0`` (a quit is an environment
        choice, not a policy choice, so it may change the outcome).
    :param xchg: the table's cfg ``xchg``: 1 runs the round exchange's flush round at the pass's end.
    :param w0: the table's cfg ``W0``, the first round's window (None: ``w``, no ramp).
    :param witnesses: False for a scope too small for some ``sometimes`` witness
        (e.g. D <= 1 < W holds no carry): its witnesses are not checked there;
        `proofs.report` still requires every witness to be found in some scope.
    """

    n_max: int
    d_max: int
    w: int
    modes: tuple[int, ...] = (0, 1, 2)
    quits: int = 0
    confluence_n_max: int | None = None
    witnesses: bool = True
    xchg: int = 0
    w0: int | None = None

    def __str__(self) -> str:
        return (f"N<={self.n_max}, D<={self.d_max}, W={self.w}" + (f", W0={self.w0}" if self.w0 is not None else "")
                + (f", quits<={self.quits}" if self.quits else "") + (", exchange (xchg=1)" if self.xchg else ""))


# Sized by the explicit engine to fit `make verify` (about a minute on 2 cores); figures in proofs/REPORT.md.
#   N<=6 without quits: the headline scope (every interleaving and choice of 6 ranks);
#   N<=8 at D<=1: more ranks, fewer samples (cheap: the rounds are short);
#   quits: aborts at every point of a run, including a quit in the same round as another rank's;
#   D > W: a full window with data left (kills the fetch-guard mutant).
CI_SCOPES = (
    Scope(n_max=6, d_max=2, w=2, confluence_n_max=4),
    Scope(n_max=8, d_max=1, w=2, confluence_n_max=5, witnesses=False),
    Scope(n_max=4, d_max=2, w=2, quits=1),
    Scope(n_max=3, d_max=2, w=2, quits=2),
    Scope(n_max=3, d_max=3, w=2),
    Scope(n_max=5, d_max=2, w=2, confluence_n_max=4, xchg=1),
    Scope(n_max=3, d_max=2, w=2, quits=2, xchg=1, witnesses=False),
    Scope(n_max=4, d_max=3, w=3, w0=1, confluence_n_max=3),
    Scope(n_max=3, d_max=3, w=2, w0=1, quits=1, xchg=1, witnesses=False),
)
# `make verify-deep` (minutes, on top of CI_SCOPES): N<=10 at D<=1, N<=7 at D<=2, quits at N<=8 (D<=1) and
# N<=5 (D<=2).  N=8 at D<=2 (~10M canonical states per mode) does not fit a shared 24 GiB machine.
DEEP_SCOPES = (
    Scope(n_max=10, d_max=1, w=2, confluence_n_max=6, witnesses=False),
    Scope(n_max=8, d_max=1, w=2, quits=1, witnesses=False),
    Scope(n_max=7, d_max=2, w=2, confluence_n_max=4),
    Scope(n_max=5, d_max=2, w=2, quits=1),
)


@dataclass(frozen=True)
class DealtScope:
    """One exhaustive scope of the dealt model (`models.dealt`): every order length in `totals`, every
    value (drop or cost) of every position, every interleaving and every choice the table allows.

    :param aheads: each rank's prefetch (N = len(aheads)); :param policy: the posted intake ladder
    (`models.dealt.POLICIES`); :param values: what a position may turn out to be (0: a drop)."""

    aheads: tuple[int, ...]
    w: int
    totals: tuple[int, ...]
    values: tuple[int, ...] = (0, 1)
    policy: str = "whole"
    modes: tuple[int, ...] = (0, 1, 2)
    w0: int | None = None

    @property
    def n(self) -> int:
        return len(self.aheads)

    def __str__(self) -> str:
        vals = ",".join("drop" if v == 0 else f"cost {v}" for v in self.values)
        p = f"P={self.totals[0]}" if len(self.totals) == 1 else f"P={self.totals[0]}..{self.totals[-1]}"
        w0 = "" if self.w0 is None else f", W0={self.w0}"
        return (f"dealt N={self.n}, {p}, W={self.w}{w0}, aheads={list(self.aheads)}, {self.policy} ladder, "
                f"values {{{vals}}}")


# Sized to fit `make verify` (about 40 s of one core; figures in proofs/REPORT.md).  A reserve take
# needs more positions than the first deal gives (P > N * (W + max ahead + 1)), so each scope's
# orders are just long enough for a second deal:
#   prefetch that differs between ranks (the replicas must still agree), orders up to one long enough
#   for a top-up deal after a reserve take (P = 9: the closed form of Dealer.left subtracts it);
#   measured costs that differ (the end game deals by cost);
#   W = 2 (proposal, use and take choices) with drops;
#   a policy over its posted bound without drops (W = 3: the need's slack of one absorbs W = 2);
#   three ranks at every order length up to 8; four ranks (PAD only, 1M states) at P = 9.
DEALT_SCOPES = (
    DealtScope(aheads=(0, 1), w=1, totals=tuple(range(0, 10))),
    DealtScope(aheads=(0, 0), w=1, totals=tuple(range(0, 7)), values=(0, 1, 2)),
    DealtScope(aheads=(0, 0), w=2, totals=(8,)),
    DealtScope(aheads=(0, 0), w=3, totals=(9, 10, 11), values=(1,), policy="singletons"),
    DealtScope(aheads=(0, 0, 0), w=1, totals=tuple(range(0, 9))),
    DealtScope(aheads=(0, 0, 0, 0), w=1, totals=(9,), modes=(0,)),
    DealtScope(aheads=(0, 1), w=2, w0=1, totals=tuple(range(0, 9))),
)
