"""`EpochLedger`: which positions of the epoch's order this rank yielded, and its resume state.

A position is the place of a sample in the epoch's order: this rank's own order with fixed shards,
the global order when dealt, the stream position for an IterableDataset.  Samples buffered or
prefetched but not yet yielded are not recorded, so a loader resumed from `state_dict` emits them
again: across the two runs every sample is emitted exactly once.  Dealt: the next pass gathers every
rank's record (all ranks resume together).
"""

from __future__ import annotations

from typing import Callable, Mapping

from ..errors import ConfigError

__all__ = ["EpochLedger", "STATE_VERSION", "ranges"]

STATE_VERSION = 2  # 2: adds 'sharding' (positions are per rank when fixed, global when dealt)


def ranges(positions) -> list[list[int]]:
    """Sorted positions as merged ``[start, stop)`` ranges."""
    out: list[list[int]] = []
    for p in sorted(positions):
        if out and out[-1][1] == p:
            out[-1][1] = p + 1
        else:
            out.append([p, p + 1])
    return out


class EpochLedger:
    """This rank's record of one epoch: ``done`` positions, ``complete`` (the last pass ran to its end),
    ``num_positions`` (the length of the epoch's order; -1 for a stream; None before the first pass)."""

    def __init__(self) -> None:
        self.epoch = 0
        self.done: set = set()
        self.complete = False
        self.num_positions: int | None = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; another epoch forgets what the old one yielded."""
        if epoch != self.epoch:
            self.done, self.complete = set(), False
        self.epoch = epoch

    def start_pass(self, num_positions: int) -> None:
        """A pass begins: a completed epoch starts again from nothing."""
        if self.complete:
            self.done, self.complete = set(), False
        self.num_positions = num_positions

    def record(self, positions, epoch: int) -> None:
        """Positions yielded by a pass over `epoch` (a pass over another epoch records nothing here)."""
        if epoch == self.epoch:
            self.done.update(positions)

    def state_dict(self, *, world_size: int, rank: int, seed: int, sharding: str) -> dict:
        return {"version": STATE_VERSION, "world_size": world_size, "rank": rank, "seed": seed, "sharding": sharding,
                "epoch": self.epoch, f"rank_{rank}": {"done": ranges(self.done), "complete": self.complete,
                                                      "num_positions": self.num_positions}}

    def load_state_dict(self, state: Mapping, *, world_size: int, rank: int, seed: int, sharding: str,
                        positions_of: Callable[[int], int]) -> None:
        """Load a `state_dict` of the same rank, world size, seed and sharding (strict: every field is
        validated and anything else raises ConfigError naming the field and what was found).

        `positions_of(epoch)` gives the length of that epoch's order now (-1 for a stream); the state's
        must match it (the dataset or sampler must be unchanged)."""
        if not isinstance(state, Mapping):
            raise ConfigError(f"state must be a mapping from ODBDataLoader.state_dict, got {type(state).__name__}")
        sd = dict(state)
        version = sd.pop("version", None)
        if version != STATE_VERSION or isinstance(version, bool):
            raise ConfigError(f"state version {version!r} is not supported (this loader reads {STATE_VERSION})")
        for key, mine, why in (("world_size", world_size, "the per-rank shards would change"),
                               ("rank", rank, "this state belongs to another rank"),
                               ("seed", seed, "the sample order would change"),
                               ("sharding", sharding, "positions would mean other samples")):
            if key not in sd:
                raise ConfigError(f"state has no {key!r} key; it was not written by ODBDataLoader.state_dict")
            got = sd.pop(key)
            if got != mine or type(got) is not type(mine):
                raise ConfigError(f"cannot resume: state has {key}={got!r}, this loader has {mine!r} ({why})")
        epoch = sd.pop("epoch", None)
        mine = sd.pop(f"rank_{rank}", None)
        if mine is None:
            raise ConfigError(f"state lacks 'rank_{rank}' (the record of this rank's yielded samples)")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"state has epoch={epoch!r}; it must be an int >= 0")
        if sd:
            raise ConfigError(f"state has unknown keys {sorted(sd)}; refusing to guess what they mean")
        if not isinstance(mine, Mapping):
            raise ConfigError(f"state's rank_{rank} is a {type(mine).__name__}, not a mapping")
        mine = dict(mine)
        missing = {"done", "complete", "num_positions"} - set(mine)
        if missing:
            raise ConfigError(f"state's rank_{rank} lacks {sorted(missing)}")
        done, complete, num = mine.pop("done"), mine.pop("complete"), mine.pop("num_positions")
        if mine:
            raise ConfigError(f"rank state has unknown keys {sorted(mine)}")
        if not isinstance(complete, bool):
            raise ConfigError(f"state has complete={complete!r}; it must be True or False (whether the last pass "
                              "of the epoch ran to its end)")
        if num is not None and (isinstance(num, bool) or not isinstance(num, int) or num < -1):
            raise ConfigError(f"state has num_positions={num!r}; it must be None, -1 or an int >= 0")
        now = positions_of(epoch)
        if num is not None and num != now:
            raise ConfigError(f"cannot resume: this rank's order had {num} positions, now {now} (the dataset "
                              "or sampler changed)")
        self.set_epoch(epoch)
        self.done, self.complete, self.num_positions = _positions(done, now), complete, num

def _positions(done, total: int) -> set:
    """The positions of a state's yielded ranges, validated (see `EpochLedger.load_state_dict`)."""
    if not isinstance(done, (list, tuple)):
        raise ConfigError(f"state's done is a {type(done).__name__}; it must be a list of [start, stop] ranges")
    out: set = set()
    prev = -1
    for k, rg in enumerate(done):
        ok = isinstance(rg, (list, tuple)) and len(rg) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in rg)
        if not ok or not 0 <= rg[0] < rg[1] or rg[0] < prev or (total >= 0 and rg[1] > total):
            where = f"in 0..{total}" if total >= 0 else "non-negative"
            raise ConfigError(f"state's done[{k}] = {rg!r} is not a range [start, stop) of ints with start < stop, "
                              f"{where}, after the previous range (ends at {prev}); the state is damaged or from "
                              "another dataset; resuming from it would skip or repeat samples")
        prev = rg[1]
        out.update(range(rg[0], rg[1]))
    return out
