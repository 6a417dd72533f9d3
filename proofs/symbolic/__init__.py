"""z3 proofs of the DGAP table for every number of ranks (Ivy/mypyvy style).

Public API (used by ``proofs.report`` and the mutant checker):

    prove_all(table=DGAP, modes=(0, 1, 2), timeout_ms=...) -> list[Verdict]
    BOUND_FORMULA    the termination bound proved, as a string
    BOUND_STATEMENT  what exactly the bound verdict establishes

The encoding (`encode`) is generated from the table; the auxiliary invariant and
the ranking measures are in `invariants`; the obligations are in `prove`.
"""

from .encode import Encoder, EncodingError
from .invariants import INVARIANT
from .prove import BOUND_FORMULA, BOUND_STATEMENT, DEFAULT_TIMEOUT_MS, SCOPE, prove_all, prove_mode

__all__ = ["prove_all", "prove_mode", "BOUND_FORMULA", "BOUND_STATEMENT", "DEFAULT_TIMEOUT_MS", "SCOPE",
           "INVARIANT", "Encoder", "EncodingError"]
