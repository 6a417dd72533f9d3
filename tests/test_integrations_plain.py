"""The plain PyTorch DDP loop (odb.integrations.TrainStream + DDP no_sync/Join), 2 gloo ranks."""

from __future__ import annotations

import pytest

from _integrations_worker import N, check_run, run_workers


@pytest.mark.slow  # two torchrun ranks (about 15 s on 2 cores)
def test_plain_ddp_two_ranks_global_token_mean_sample_schedule_exactly_once_and_resume(tmp_path):
    check_run(run_workers("plain", tmp_path), n=N, lr0=1e-2)
