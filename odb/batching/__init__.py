"""Cost models, grouping and cross-rank alignment policies (pure; no torch, no torch.distributed)."""

from .base import AlignmentPolicy, CostModel, Sizes, check_partition

__all__ = ["AlignmentPolicy", "CostModel", "Sizes", "check_partition"]
