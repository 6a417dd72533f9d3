"""Trace conformance of the real runtime against the DGAP table (see `check`), and its happens-before graph (`hb`)."""

from .check import RunReport, assert_conformant, check_dir, check_run
from .hb import HappensBefore, happens_before

__all__ = ["RunReport", "check_run", "check_dir", "assert_conformant", "HappensBefore", "happens_before"]
