"""Pure per-rank protocol code around the table (no torch, no threads, no I/O).

``header``   the round header's named layout (`HeaderLayout`, `Header`; a round's N headers as columns: `Headers`)
``shared``   the settings replicated decisions may read (`Shared`) and the construction check
``replica``  the replicated round decision (`Replicated`): proposal, target, deal, digest check
"""

from .._identity import check as _check_identity

_check_identity()  # a clear ImportError if the paper's odb/__init__.py replaced ours

from .header import REPLICATED, Header, HeaderLayout, Headers
from .replica import Decision, Replicated, proposal_bounds, round_proposal, round_target, table_headers
from .shared import GATHERED, Shared, describe_cost, describe_policy, mismatches

__all__ = ["Header", "HeaderLayout", "Headers", "REPLICATED", "Decision", "Replicated", "proposal_bounds",
           "round_proposal",
           "round_target", "table_headers", "Shared", "GATHERED", "describe_cost", "describe_policy", "mismatches"]
