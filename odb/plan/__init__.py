"""Planning before training: `plan` predicts what each configuration does on your data and recommends one.

``odb plan LENGTHS --world-size N`` (or ``python -m odb plan``) on the command line (`odb.plan.cli`); `plan`
on a list of lengths, `measure` to take them from your dataset.  The step-time model and the schedule
metrics it reads batches through are `odb.plan.stepmodel` and `odb.plan.metrics`.
"""

from .cli import measure, read_lengths
from .planner import DEFAULT_BUDGETS, DEFAULT_WINDOWS, TARGETS, Candidate, PlanReport, Prediction, plan

__all__ = ["plan", "measure", "read_lengths", "Candidate", "Prediction", "PlanReport", "TARGETS", "DEFAULT_BUDGETS",
           "DEFAULT_WINDOWS"]
