"""The Lightning adapter (odb.integrations.lightning) with the real lightning package, 2 gloo ranks."""

from __future__ import annotations

import pytest

from _integrations_worker import N, check_run, run_workers

pytestmark = pytest.mark.adapters


@pytest.mark.slow  # two torchrun ranks importing lightning (about 25 s on 2 cores)
def test_lightning_ddp_two_ranks_global_token_mean_sample_schedule_exactly_once_and_ckpt_resume(tmp_path):
    import lightning  # noqa: F401  (installed by `make test`; a missing adapter package fails, never skips)
    check_run(run_workers("lightning", tmp_path), n=N, lr0=1e-2)


def test_lightning_datamodule_refuses_join_mode():
    import lightning  # noqa: F401  (installed by `make test`; a missing adapter package fails, never skips)

    from odb.errors import ConfigError
    from odb.integrations.lightning import ODBDataModule

    with pytest.raises(ConfigError, match="join"):
        ODBDataModule([], odb_loader_kwargs={"token_budget": 8, "mode": "join"})
