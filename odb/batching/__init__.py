"""Cost models, grouping and cross-rank alignment policies (pure; no torch, no torch.distributed).

``make_cost_model(spec, budget)`` builds a `CostModel`; ``default_policy()``
returns the `AlignmentPolicy` the runtime uses unless told otherwise.  The
torch collate helpers (`pad_collate`, `packed_collate`, `mrope_collate`, `visual_stub`,
`check_packing`) live in ``odb.batching.collate`` and are imported lazily, so this
package imports without torch.
"""

from .._identity import check as _check_identity

_check_identity()  # a clear ImportError if the paper's odb/__init__.py replaced ours

from .base import AlignmentPolicy, CostModel, Sizes, check_partition
from .cost import BudgetCost, CallableCost, Resource, make_cost_model
from .grouping import Group, pack
from .policy import BalancedPolicy, attention_coefficient, default_policy

__all__ = ["AlignmentPolicy", "CostModel", "Sizes", "check_partition", "make_cost_model", "default_policy",
           "BalancedPolicy", "attention_coefficient", "BudgetCost", "CallableCost", "Resource", "Group", "pack",
           "pad_collate", "packed_collate", "mrope_collate", "visual_stub", "check_packing"]

_COLLATE = {"pad_collate", "packed_collate", "mrope_collate", "visual_stub", "check_packing"}


def __getattr__(name: str):
    if name in _COLLATE:
        from . import collate

        return getattr(collate, name)
    raise AttributeError(f"module 'odb.batching' has no attribute {name!r}")
