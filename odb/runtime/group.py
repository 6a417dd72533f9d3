"""The loader's own gloo group and its loader-level collectives (construction check, pass start).

Each is a collective every member of the group reaches at the same point: creating the group (every
rank constructs its loaders in the same order), the construction check (once per loader), the
start-of-pass gather of dealt sharding (once per pass).  A gloo error (a timeout, a peer gone) becomes
`odb.RankFailure` naming what did not complete.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any, Callable

import torch

from ..core.fingerprint import content_digest
from ..core.shared import PARAMETERS, Shared, mismatches
from ..errors import ConfigError, RankFailure

__all__ = ["LoaderGroup", "group_size", "dataset_probe", "probe_stable", "PROBES", "collective_failure"]


def collective_failure(what: str, elapsed: float, timeout_s: float, why_timeout: str, e: BaseException) -> str:
    """The message of a collective that raised after `elapsed` seconds: a timeout says so with `why_timeout`
    (what a peer did not do); an error well before the timeout says it was not one (a refused or closed
    connection: a peer's process died or never started), and both quote torch."""
    said = f"{type(e).__name__}: {str(e)[:300]}"
    if elapsed < 0.9 * timeout_s:
        return (f"{what} failed after {elapsed:.1f} s, before timeout_s={timeout_s} (not a timeout: a peer's process "
                f"died, closed its connection, or could not be reached). torch said: {said}")
    return f"{what} did not complete within timeout_s={timeout_s}: {why_timeout}. torch said: {said}"

# The construction check's probe of a map-style dataset in the loader's own order: the samples at these
# positions (the first and the middle index) on every rank, each read twice.  Cost: 2 PROBES samples
# preprocessed per rank at construction, in the constructing thread; where the ranks differ, CONFIRM_READS more
# of each differing position before refusing (random preprocessing can repeat twice by chance: a coin-flip
# augmentation looks stable on two reads of both ranks about one construction in twenty).
PROBES = 2
PROBE_POSITIONS = ("first", "middle")
CONFIRM_READS = 8


def _probe_indices(n: int) -> tuple[int, ...]:
    return (0, n // 2)[:PROBES] if n else ()


def _digest_at(dataset, i: int) -> int:
    """The digest of ``dataset[i]``; 0 if it raises or returns None (the pass reports those with the index)."""
    try:
        sample = dataset[i]
    except Exception:  # noqa: BLE001 - not compared here
        return 0
    return 0 if sample is None else content_digest([sample])


def dataset_probe(dataset, n: int) -> tuple[int, ...]:
    """`odb.core.fingerprint.content_digest` of ``dataset[0]`` and ``dataset[n // 2]`` (n: its length), each
    read twice: 0 where the two reads differ (random preprocessing: nothing to compare), a read raises or
    returns None."""
    out = []
    for i in _probe_indices(n):
        a = _digest_at(dataset, i)
        out.append(a if a and a == _digest_at(dataset, i) else 0)
    return tuple(out) + (0,) * (PROBES - len(out))


def probe_stable(dataset, n: int, probe: tuple[int, ...], ks: list[int], reads: int = CONFIRM_READS) -> bool:
    """`reads` more reads of each probed position ``k in ks`` give `probe`'s digest every time."""
    idx = _probe_indices(n)
    return all(_digest_at(dataset, idx[k]) == probe[k] for k in ks for _ in range(reads))


def group_size(process_group) -> int:
    """The number of ranks a loader on `process_group` (None: the whole world) aligns; 1 without an initialized
    torch.distributed (`LoaderGroup` then refuses a launcher's WORLD_SIZE > 1 on every rank)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(process_group if process_group is not None else dist.group.WORLD)


class LoaderGroup:
    """This rank's place in the loader's group: ``rank``, ``world_size`` and the gloo ``group`` (None
    at world size 1 or without an initialized process group)."""

    def __init__(self, process_group, timeout_s: float):
        import torch.distributed as dist

        self.timeout_s, self.group = timeout_s, None
        if not (dist.is_available() and dist.is_initialized()):
            if process_group is not None:
                raise ConfigError("process_group was given but torch.distributed is not initialized")
            # A launcher's environment is read here only to refuse a misuse: alone under torchrun, every
            # rank would train every sample (issue 49).
            launched = os.environ.get("WORLD_SIZE", "1")
            if launched.isdigit() and int(launched) > 1:
                raise ConfigError(
                    f"ODBDataLoader built before torch.distributed.init_process_group, under a launcher with "
                    f"WORLD_SIZE={launched}: this process would count as the only rank and every rank would "
                    "train every sample. Call torch.distributed.init_process_group() first, then build the "
                    "loader (to run this process alone on purpose, start it without the launcher's WORLD_SIZE)")
            self.rank, self.world_size = 0, 1
            return
        base = process_group if process_group is not None else dist.group.WORLD
        self.rank, self.world_size = dist.get_rank(base), dist.get_world_size(base)
        if self.world_size == 1:
            return
        timeout = timedelta(seconds=timeout_s)
        t0 = time.monotonic()
        try:
            if process_group is None:
                # SYNC: every rank of the default group must construct its loaders in the same order
                self.group = dist.new_group(backend="gloo", timeout=timeout)
            else:
                ranks = dist.get_process_group_ranks(process_group)
                # SYNC: every member of process_group must construct its loaders in the same order
                self.group = dist.new_group(ranks=ranks, backend="gloo", timeout=timeout,
                                            use_local_synchronization=True)
        except RuntimeError as e:  # the store barrier of new_group timed out, or a connection was refused
            raise RankFailure(collective_failure(
                f"rank {self.rank}: creating the ODBDataLoader's gloo group", time.monotonic() - t0, timeout_s,
                "a rank died or did not construct its loader (every rank must construct its loaders in the same "
                "order)", e)) from None

    def _gather(self, what: str, absent: str, call: Callable[[], Any]) -> None:
        t0 = time.monotonic()
        try:
            call()
        except RuntimeError as e:
            raise RankFailure(collective_failure(f"rank {self.rank}: {what}", time.monotonic() - t0, self.timeout_s,
                                                 f"a peer rank died or {absent}", e)) from None

    def agree(self, shared: Shared | None, ahead: int, failure: BaseException | None = None,
              probe: tuple[int, ...] = (), reprobe: Callable[[list], bool] | None = None) -> tuple[int, ...]:
        """The construction check: one fixed-shape all-gather of `Shared` (every field compared), of each
        rank's `dataset_probe` and of its prefetch (gathered, not compared: the deals read every rank's).  A
        mismatch is a ConfigError on every rank naming each setting and every rank's value; so are probes
        that differ at a position every rank read alike twice and, asked (`reprobe(positions)`, a collective
        then), alike `CONFIRM_READS` times more (each rank was given another dataset).  A rank
        whose own construction failed (`failure`, `shared` None) posts that instead, and every rank raises at
        once: it re-raises its error, the others a ConfigError quoting it.  Returns the prefetches."""
        if self.group is None:
            if failure is not None:
                raise failure
            return (int(ahead),)
        width = len(Shared.names())
        probe = tuple(probe) + (0,) * (PROBES - len(probe))
        send = torch.tensor([int(failure is not None)] + ([0] * width if shared is None else shared.vector())
                            + list(probe[:PROBES]) + [int(ahead)], dtype=torch.int64)
        every = [torch.empty_like(send) for _ in range(self.world_size)]
        # SYNC: every rank reaches this once per loader, right after creating its group
        self._gather("the construction check of ODBDataLoader", "did not construct its loader",
                     lambda: torch.distributed.all_gather(every, send, group=self.group))
        rows = [t.tolist() for t in every]
        failed = [r for r, row in enumerate(rows) if row[0]]
        bad = [] if failed else mismatches([row[1:1 + width] for row in rows])
        if failed or bad:  # every rank gathered the same rows, so every rank takes this branch and gathers the text
            texts: list = [None] * self.world_size
            mine = f"{type(failure).__name__}: {failure}" if failure is not None else shared.describe()
            # SYNC: every rank reaches this when the construction check found a failure or a mismatch
            self._gather("the construction check's report", "did not construct its loader",
                         lambda: torch.distributed.all_gather_object(texts, mine, group=self.group))
            if failure is not None:
                raise failure
            if failed:
                raise ConfigError(f"rank {self.rank}: rank(s) {failed} could not build this ODBDataLoader, so no rank "
                                  "runs it (it would wait for them): " +
                                  "; ".join(f"rank {r}: {str(texts[r])[:600]}" for r in failed))
            col = {name: j for j, name in enumerate(Shared.names())}
            what = "; ".join(f"{name} ({PARAMETERS[name]}): " +
                             ", ".join(f"rank {r} {t[col[name]]}" for r, t in enumerate(texts)) for name in bad)
            raise ConfigError(f"rank {self.rank}: the ranks built this ODBDataLoader differently ({what}); every "
                              "rank must pass the same settings and the same whole dataset (the loader shards it): "
                              "each rank would decide the rounds differently, repeating and losing samples")
        self._check_probes([row[1 + width:1 + width + PROBES] for row in rows], reprobe)
        return tuple(row[-1] for row in rows)

    def _check_probes(self, probes: list, reprobe: Callable[[list], bool] | None) -> None:
        """ConfigError on every rank (the rows and the flags are gathered, so every rank takes each branch) if
        the ranks read different samples at a probed position that every rank read alike, twice and then
        `CONFIRM_READS` times more (`reprobe`: True if this rank's reads of those positions all agreed)."""
        ks = [k for k, col in enumerate(zip(*probes)) if all(col) and len(set(col)) > 1]
        if not ks:
            return
        flags = [torch.tensor([int(reprobe(ks)) if reprobe is not None else 1], dtype=torch.int64)
                 for _ in range(self.world_size)]
        mine = flags[self.rank].clone()
        # SYNC: every rank reaches this when the gathered probes differ (the same rows on every rank)
        self._gather("the construction check's second probe", "did not construct its loader",
                     lambda: torch.distributed.all_gather(flags, mine, group=self.group))
        if not all(int(f) for f in flags):
            return  # random preprocessing at those positions: the probe cannot tell, so it does not refuse
        k = ks[0]
        col = [row[k] for row in probes]
        raise ConfigError(
            f"rank {self.rank}: the ranks hold different samples at the same position of the dataset (the "
            f"{PROBE_POSITIONS[k]} position: content digests {', '.join(f'rank {r} {v:x}' for r, v in enumerate(col))}"
            "): each rank was given its own dataset of the same length (e.g. its own shard, full[rank::N]), and the "
            "loader would deal positions of it as if every rank held them all, so most samples would never train. "
            "Give every rank the whole dataset (the loader shards it), or pass sampler= to choose each rank's "
            "samples yourself")

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
