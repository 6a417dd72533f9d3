"""Trace conformance of the real runtime against the DGAP table (see `check`)."""

from .check import RunReport, assert_conformant, check_dir, check_run

__all__ = ["RunReport", "check_run", "check_dir", "assert_conformant"]
