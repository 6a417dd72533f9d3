"""Quality figures of a batch schedule ``rows[rank][step]`` (the legend is in `paper_repro.bench`): the
package's `odb.plan.metrics.schedule_metrics`, under the name the benchmarks use."""

from __future__ import annotations

from odb.plan.metrics import schedule_metrics as metrics

__all__ = ["metrics"]
