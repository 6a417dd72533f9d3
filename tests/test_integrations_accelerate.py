"""The Accelerate adapter (odb.integrations.accelerate) with the real accelerate package, 2 gloo ranks."""

from __future__ import annotations

import pytest

from _integrations_worker import N, check_run, run_workers


@pytest.mark.slow  # two torchrun ranks importing accelerate (about 20 s on 2 cores)
@pytest.mark.adapters
def test_accelerate_two_ranks_global_token_mean_sample_schedule_exactly_once_and_save_load_state(tmp_path):
    import accelerate  # noqa: F401  (installed by `make test`; a missing adapter package fails, never skips)
    check_run(run_workers("accelerate", tmp_path), n=N, lr0=1e-2)
