"""Exhaustive explicit-state checking of the DGAP table composed with its environment.

`explore` (BFS with rank symmetry, shortest counterexamples), `FastModel` (the
memoised successor function), `check_confluence`, `counterexample` (step
tables, waits-for graphs) and `check.check_scope` (everything `python -m proofs
verify` reports for one scope, with `crosscheck`: the graph analyses against networkx).
"""

from .confluence import POLICIES, check_confluence
from .explore import MODE_NAMES, Exploration, data_vectors, explore
from .fast import FastModel
from .trace import counterexample, replay, step_table, waits_for, waits_for_chain, waits_for_graph

__all__ = ["explore", "Exploration", "data_vectors", "MODE_NAMES", "FastModel", "check_confluence",
           "POLICIES", "counterexample", "replay", "step_table", "waits_for", "waits_for_chain", "waits_for_graph"]
