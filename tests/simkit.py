"""`sim_settings`: the `odb.LoaderSettings` a simulation test runs, from the few fields it varies."""

from odb import Exchanged, LoaderSettings, Pooled
from odb.batching import AlignmentPolicy


def sim_settings(cost, window: int, mode: str = "pad", *, policy=None, pool: int = 1, exchange: bool = False,
                 slack_bp: int = 0, oversize: str = "alone", loss_basis: str = "label_tokens") -> LoaderSettings:
    """A ready cost model, the window W per rank, the mode; ``policy`` an instance or a factory (called once:
    the simulation copies it per rank); ``pool``/``exchange``/``slack_bp`` the placement."""
    if policy is not None and not isinstance(policy, AlignmentPolicy):
        policy = policy()
    placement = Exchanged(pool=pool, slack=slack_bp / 10_000) if exchange else Pooled(pool) if pool > 1 else None
    return LoaderSettings(token_budget=None, cost=cost, buffer_size=window, mode=mode, policy=policy,
                          placement=placement, oversize=oversize, loss_basis=loss_basis)
