"""The loader's own gloo group and its loader-level collectives (construction check, pass start).

Each is a collective every member of the group reaches at the same point: creating the group (every
rank constructs its loaders in the same order), the construction check (once per loader), the
start-of-pass gather of dealt sharding (once per pass).  A gloo error (a timeout, a peer gone) becomes
`odb.RankFailure` naming what did not complete.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import torch

from ..core.shared import PARAMETERS, Shared, mismatches
from ..errors import ConfigError, RankFailure

__all__ = ["LoaderGroup"]


class LoaderGroup:
    """This rank's place in the loader's group: ``rank``, ``world_size`` and the gloo ``group`` (None
    at world size 1 or without an initialized process group)."""

    def __init__(self, process_group, timeout_s: float):
        import torch.distributed as dist

        self.timeout_s, self.group = timeout_s, None
        if not (dist.is_available() and dist.is_initialized()):
            if process_group is not None:
                raise ConfigError("process_group was given but torch.distributed is not initialized")
            self.rank, self.world_size = 0, 1
            return
        base = process_group if process_group is not None else dist.group.WORLD
        self.rank, self.world_size = dist.get_rank(base), dist.get_world_size(base)
        if self.world_size == 1:
            return
        timeout = timedelta(seconds=timeout_s)
        try:
            if process_group is None:
                # SYNC: every rank of the default group must construct its loaders in the same order
                self.group = dist.new_group(backend="gloo", timeout=timeout)
            else:
                ranks = dist.get_process_group_ranks(process_group)
                # SYNC: every member of process_group must construct its loaders in the same order
                self.group = dist.new_group(ranks=ranks, backend="gloo", timeout=timeout,
                                            use_local_synchronization=True)
        except RuntimeError as e:  # the store barrier of new_group timed out: a rank did not construct one
            raise RankFailure(f"rank {self.rank}: creating the ODBDataLoader's gloo group did not complete within "
                              f"timeout_s={timeout_s}: a rank died or did not construct its loader (every rank "
                              f"must construct its loaders in the same order). torch said: {str(e)[:300]}") from None

    def _gather(self, what: str, absent: str, call: Callable[[], Any]) -> None:
        try:
            call()
        except RuntimeError as e:
            raise RankFailure(f"rank {self.rank}: {what} did not complete within timeout_s={self.timeout_s}: a "
                              f"peer rank died or {absent}. gloo said: {str(e)[:300]}") from None

    def agree(self, shared: Shared, ahead: int) -> tuple[int, ...]:
        """The construction check: one fixed-shape all-gather of `Shared` (every field compared) and of
        each rank's prefetch (gathered, not compared: the deals read every rank's).  A mismatch is a
        ConfigError on every rank naming each setting and every rank's value; returns the prefetches."""
        if self.group is None:
            return (int(ahead),)
        send = torch.tensor(shared.vector() + [int(ahead)], dtype=torch.int64)
        every = [torch.empty_like(send) for _ in range(self.world_size)]
        # SYNC: every rank reaches this once per loader, right after creating its group
        self._gather("the construction check of ODBDataLoader", "did not construct its loader",
                     lambda: torch.distributed.all_gather(every, send, group=self.group))
        rows = [t.tolist() for t in every]
        bad = mismatches(rows)
        if bad:  # every rank gathered the same rows, so every rank takes this branch and gathers the text
            texts: list = [None] * self.world_size
            # SYNC: every rank reaches this when the construction check found a mismatch
            self._gather("the construction check's report", "did not construct its loader",
                         lambda: torch.distributed.all_gather_object(texts, shared.describe(), group=self.group))
            col = {name: j for j, name in enumerate(Shared.names())}
            what = "; ".join(f"{name} ({PARAMETERS[name]}): " +
                             ", ".join(f"rank {r} {t[col[name]]}" for r, t in enumerate(texts)) for name in bad)
            raise ConfigError(f"rank {self.rank}: the ranks built this ODBDataLoader differently ({what}); every "
                              "rank must pass the same settings (and a dataset of the same length): each rank "
                              "would decide the rounds differently, repeating and losing samples")
        return tuple(row[-1] for row in rows)

    def gather_done(self, mine: list) -> list:
        """Dealt sharding, at every pass start: every rank's yielded ranges."""
        if self.group is None:
            return [mine]
        every: list = [None] * self.world_size
        # SYNC: every rank reaches this once per pass, before its engine starts (same config on every rank)
        self._gather("the start-of-pass gather of dealt sharding", "did not start this pass",
                     lambda: torch.distributed.all_gather_object(every, mine, group=self.group))
        return every

    def destroy(self) -> None:
        import torch.distributed as dist

        if self.group is not None:
            try:
                if dist.is_initialized():
                    dist.destroy_process_group(self.group)
            except Exception:  # the default group may be gone already (interpreter exit)
                pass
            self.group = None
