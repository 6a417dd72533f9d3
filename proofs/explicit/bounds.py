"""The closed-form round bound of each mode, shared by the explicit checks and the networkx cross-check.

``d_i`` is rank i's number of samples in the scope; the bound is the number of collective rounds a run
may take (the symbolic engine's ranking bound, evaluated): an explored run past it fails.
"""

from __future__ import annotations

from odb.protocol.table import JOIN, PAD, QUOTA

__all__ = ["ROUNDS_CLOSED_FORM", "rounds_bound"]

ROUNDS_CLOSED_FORM = {
    PAD: ("max_i d_i + 1", lambda d: max(d) + 1),
    JOIN: ("max_i d_i + 1", lambda d: max(d) + 1),
    QUOTA: ("min_i d_i + 1", lambda d: min(d) + 1),
}


def rounds_bound(mode: int, xchg: int = 0):
    """The closed form of `mode` plus the round exchange's flush round (cfg ``xchg``)."""
    fn = ROUNDS_CLOSED_FORM[mode][1]
    return (lambda d: fn(d) + 1) if xchg else fn
