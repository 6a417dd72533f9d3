"""Seeded table mutants (`catalogue`) and the check that every one is killed (`check`)."""

from .catalogue import MUTANTS, Mutant, by_name
from .check import KILL, MUTANT_SCOPES, MutantResult, check_all, check_mutant

__all__ = ["MUTANTS", "Mutant", "by_name", "KILL", "MUTANT_SCOPES", "MutantResult", "check_all", "check_mutant"]
