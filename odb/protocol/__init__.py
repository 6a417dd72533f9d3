"""The DGAP protocol as data: the table, its expression language and its one interpreter.

Imports neither torch nor z3.
"""

from .expr import Scope, evaluate, render
from .machine import Step, aggregate, collective_inputs, fire, initial_local, step, successors
from .table import DGAP, DONE, EMIT, FILL, JOIN, MODES, PAD, PHASES, QUOTA, WAIT, Table

__all__ = ["DGAP", "Table", "Step", "Scope", "evaluate", "render", "step", "fire", "successors",
           "initial_local", "aggregate", "collective_inputs", "PHASES", "FILL", "WAIT", "EMIT", "DONE",
           "MODES", "PAD", "JOIN", "QUOTA"]
