"""Exhaustive explicit-state checking of the DGAP table composed with its environment.

`explore` (BFS with rank symmetry, shortest counterexamples), `FastModel` (the
memoised successor function), `check_confluence`, `counterexample` (step
tables) and `run_scope` / `verdicts` (everything `python -m proofs verify`
reports for one scope).
"""

from .confluence import POLICIES, check_confluence
from .explore import MODE_NAMES, Exploration, data_vectors, explore
from .fast import FastModel
from .trace import counterexample, replay, step_table, waits_for

__all__ = ["explore", "Exploration", "data_vectors", "MODE_NAMES", "FastModel", "check_confluence",
           "POLICIES", "counterexample", "replay", "step_table", "waits_for"]
