"""The torch.distributed runtime of ODB: `ODBDataLoader` executes the DGAP table on every rank.

This is the only package of ``odb`` that imports ``torch.distributed``.
"""

from .._identity import check as _check_identity

_check_identity()  # a clear ImportError if the paper's odb/__init__.py replaced ours

from ..batching.collate import pad_collate  # the one implementation; re-exported for the loader's users
from ..core.info import LoaderStats, StepBatch, StepInfo, pop_step_info
from ..settings import LoaderSettings
from .ledger import merge_states
from .loader import ODBDataLoader

__all__ = ["ODBDataLoader", "LoaderSettings", "merge_states", "StepInfo", "StepBatch", "LoaderStats", "pop_step_info",
           "pad_collate"]
