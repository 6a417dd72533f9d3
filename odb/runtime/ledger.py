"""`EpochLedger`: which positions of the epoch's order this rank yielded; resume, also on another world size.

A position is the place of a sample in the epoch's order: this rank's own shard of the loader's order
with fixed shards, the global order when dealt, the stream position for an IterableDataset.  Samples
buffered or prefetched but not yet yielded are not recorded, so a loader resumed from a state emits
them again: across the runs every sample is emitted exactly once.

Two kinds of state (``"kind"``):

    rank     `EpochLedger.state_dict` of one rank: loads into the same rank of the same world size
    global   `merge_states` of every rank's state at one checkpoint: the epoch's yielded positions in
             the loader's global order, for a loader on ANY number of ranks (elastic resume)

Re-sharding needs the loader's own order (no ``sampler``, map-style): fixed shards are the round-robin
slices of one ``seed + epoch`` permutation (rank r of N holds its positions ``r, r + N, ...``), dealt
positions are global already.  A ``sampler`` or an IterableDataset decides each rank's samples itself,
so ODB cannot re-shard them: merging their states is refused.

A state that wraps a loader state under ``"loader"`` (`odb.integrations.TrainStream.state_dict`: plus
``"rank"`` and fields every rank holds alike, the training progress) merges the same way: the loader
states merged, the other fields kept once (`merge_states`).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from ..errors import ConfigError

__all__ = ["EpochLedger", "STATE_VERSION", "ranges", "merge_states", "describe_state"]

# 4: 'shuffle', and each rank's 'base' (the positions a merged state gave it); 3: 'kind', 'order', 'mode' and the
# consumed steps and samples (elastic resume).  2 and 3 still load.
STATE_VERSION = 4


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
    ``num_positions`` (the length of the epoch's order; -1 for a stream; None before the first pass),
    ``steps`` and ``samples`` (batches, and every rank's samples in them, consumed this epoch), ``base`` (of
    ``done``, what a merged state gave every rank alike with dealt sharding: a later merge counts it once)."""

    def __init__(self) -> None:
        self.epoch = 0
        self.done: set = set()
        self.complete = False
        self.num_positions: int | None = None
        self.steps = self.samples = 0
        self.base: set = set()
        self.loaded = False  # a state was loaded since the last pass began: the next pass continues it

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; another epoch forgets what the old one yielded."""
        if epoch != self.epoch:
            self.done, self.complete, self.steps, self.samples, self.base = set(), False, 0, 0, set()
        self.epoch = epoch

    def start_pass(self, num_positions: int) -> None:
        """A pass begins: from the loaded position after a load, else the epoch starts again from nothing."""
        if self.complete or not self.loaded:
            self.done, self.complete, self.steps, self.samples, self.base = set(), False, 0, 0, set()
        self.loaded = False
        self.num_positions = num_positions

    def record(self, positions, epoch: int, global_samples: int) -> None:
        """One consumed batch of a pass over `epoch` (its positions; none for a filler); a pass over
        another epoch records nothing here."""
        if epoch == self.epoch:
            self.done.update(positions)
            self.steps += 1
            self.samples += int(global_samples)

    def state_dict(self, *, world_size: int, rank: int, seed: int, shuffle: bool, sharding: str, order: str,
                   mode: str) -> dict:
        return {"version": STATE_VERSION, "kind": "rank", "world_size": world_size, "rank": rank, "seed": seed,
                "shuffle": shuffle, "sharding": sharding, "order": order, "mode": mode, "epoch": self.epoch,
                f"rank_{rank}": {"done": ranges(self.done), "complete": self.complete,
                                 "num_positions": self.num_positions, "steps": self.steps, "samples": self.samples,
                                 "base": ranges(self.base)}}

    def load_state_dict(self, state: Mapping, *, world_size: int, rank: int, seed: int, shuffle: bool, sharding: str,
                        order: str, positions_of: Callable[[int], int], global_positions: int | None) -> None:
        """Load a state (strict: every field is validated and anything else raises ConfigError naming
        the field and what was found).

        A ``"rank"`` state must be this rank's of the same world size; a ``"global"`` one
        (`merge_states`) loads on any world size.  `positions_of(epoch)` gives the length of this
        rank's order of that epoch now (-1 for a stream); `global_positions` the loader's global
        order's length (None without the loader's own order)."""
        sd = _check_common(state, seed=seed, shuffle=shuffle, sharding=sharding)
        if sd.pop("kind", "rank") == "global":
            return self._load_global(sd, world_size=world_size, rank=rank, sharding=sharding, order=order,
                                     global_positions=global_positions)
        for key, mine, why in (("world_size", world_size, "the per-rank shards would change; merge every rank's "
                                "state with odb.merge_states to resume on another world size"),
                               ("rank", rank, "this state belongs to another rank")):
            _expect(sd, key, mine, why)
        for key in ("order", "mode"):  # version 3; informational when loading on the same rank
            sd.pop(key, None)
        epoch = _epoch(sd.pop("epoch", None))
        mine = sd.pop(f"rank_{rank}", None)
        if mine is None:
            raise ConfigError(f"state lacks 'rank_{rank}' (the record of this rank's yielded samples)")
        if sd:
            raise ConfigError(f"state has unknown keys {sorted(sd)}; refusing to guess what they mean")
        rec = _rank_record(mine, rank)
        now = positions_of(epoch)
        if rec["num_positions"] is not None and rec["num_positions"] != now:
            raise ConfigError(f"cannot resume: this rank's order had {rec['num_positions']} positions, now {now} "
                              "(the dataset or sampler changed)")
        self.set_epoch(epoch)
        self.done, self.complete = _positions(rec["done"], now), rec["complete"]
        self.num_positions, self.steps, self.samples = rec["num_positions"], rec["steps"], rec["samples"]
        self.base = _positions(rec["base"], now)
        self.loaded = True

    def _load_global(self, sd: dict, *, world_size: int, rank: int, sharding: str, order: str,
                     global_positions: int | None) -> None:
        if order != "own" or global_positions is None:
            raise ConfigError(f"cannot resume from a merged state: this loader's samples come from its {order} "
                              "(a sampler or an IterableDataset decides each rank's samples; ODB cannot re-shard them)")
        if "num_positions" not in sd:
            raise ConfigError(f"merged state lacks 'num_positions' (it holds {sorted(sd)}): it was not made by "
                              "odb.merge_states, or was cut; merge every rank's state of one checkpoint again")
        total = sd.pop("num_positions")
        if total != global_positions:
            raise ConfigError(f"cannot resume: the merged state's order had {total!r} positions, this dataset has "
                              f"{global_positions} (the dataset changed)")
        epoch = _epoch(sd.pop("epoch", None))
        done = _positions(sd.pop("done", None), total)
        complete = sd.pop("complete", None)
        if not isinstance(complete, bool):
            raise ConfigError(f"merged state has complete={complete!r}; it must be True or False")
        samples = sd.pop("samples", 0)  # every rank's samples consumed before the checkpoint (the progress bar's start)
        for key in ("world_size", "order", "mode", "steps"):  # what the merge checked and recorded
            sd.pop(key, None)
        if sd:
            raise ConfigError(f"merged state has unknown keys {sorted(sd)}; refusing to guess what they mean")
        self.set_epoch(epoch)
        if sharding == "dealt":  # global positions, the whole order's: every rank holds them all, as its base
            mine = set(done)
        else:  # this rank's round-robin slice of the same permutation: global q -> local (q - rank) / N
            mine = {(q - rank) // world_size for q in done if q % world_size == rank}
        self.done, self.complete, self.steps, self.samples = mine, complete, 0, int(samples)
        self.base = set(mine) if sharding == "dealt" else set()
        self.num_positions = total if sharding == "dealt" else len(range(rank, total, world_size))
        self.loaded = True


def describe_state(state) -> str:
    """What `state` is, in words, for the refusals of the functions that load or merge states."""
    if not isinstance(state, Mapping):
        return f"a {type(state).__name__}, not a state"
    kind, rank, n = state.get("kind", "rank"), state.get("rank"), state.get("world_size")
    if "ranks" in state:
        return f"a gather_rank_states entry (the states of {n!r} ranks, as ODBAccelerate and ODBDataModule save them)"
    if "loader" in state:
        return "a merged TrainStream state" if kind == "global" else \
            f"rank {rank!r}'s TrainStream.state_dict() of {n!r} ranks"
    if "sharding" in state:
        return "a merged ODBDataLoader state" if kind == "global" else \
            f"rank {rank!r}'s ODBDataLoader.state_dict() of {n!r} ranks"
    return f"a mapping with keys {sorted(map(str, state))}, not an ODB state"


def merge_states(states: Sequence[Mapping] | Mapping) -> dict:
    """One ``"global"`` state from every rank's state at one checkpoint (rank order or not), which loads
    on any number of ranks (the module docstring).

    `states`: every rank's `ODBDataLoader.state_dict()` (gives a merged loader state, for
    ``ODBDataLoader.load_state_dict``), or every rank's `TrainStream.state_dict()` (a merged stream
    state, for ``TrainStream.load_state_dict``; so also an ``ODBTrainer``'s ``odb_rank<r>.pt`` files),
    or one `gather_rank_states` entry (ODBAccelerate's and ODBDataModule's: its ranks' stream states).

    Refused with ConfigError, never merged: states of mixed kinds or already merged, a missing or
    repeated rank, states of different world sizes, seeds, shardings, epochs, modes or orders, or
    whose training progress differs, a sampler's or a stream's states (not re-shardable), a position
    yielded by two ranks, and states from different checkpoints (PAD and QUOTA: every rank consumed
    the same steps and samples; JOIN: every rank that had not ended did)."""
    if isinstance(states, Mapping):
        if "ranks" not in states:
            raise ConfigError(f"merge_states takes every rank's state of one checkpoint in a list; got one state, "
                              f"{describe_state(states)}: pass [state of rank 0, state of rank 1, ...]")
        if not isinstance(states["ranks"], (list, tuple)) or states.get("world_size") != len(states["ranks"]):
            raise ConfigError(f"the gather_rank_states entry has world_size={states.get('world_size')!r} and "
                              f"{type(states['ranks']).__name__} 'ranks'; it is damaged")
        states = states["ranks"]
    states = list(states)
    if not states:
        raise ConfigError("merge_states needs every rank's state; got none")
    wrapped = [isinstance(st, Mapping) and "loader" in st for st in states]
    if any(wrapped):
        if not all(wrapped):
            what = "; ".join(f"state {k}: {describe_state(st)}" for k, st in enumerate(states))
            raise ConfigError(f"merge_states got states of different kinds ({what}); pass every rank's state of one "
                              "kind, all TrainStream.state_dict() or all ODBDataLoader.state_dict()")
        return _merge_wrapped(states)
    return _merge_loader_states(states)


def _merge_loader_states(states: list) -> dict:
    """`merge_states` of every rank's `ODBDataLoader.state_dict()`."""
    for k, st in enumerate(states):
        if (not isinstance(st, Mapping) or st.get("kind", "rank") != "rank"
                or st.get("version") not in (3, STATE_VERSION)):
            raise ConfigError(f"state {k} is {describe_state(st)} (version "
                              f"{st.get('version') if isinstance(st, Mapping) else None!r}); merge_states takes every "
                              f"rank's own ODBDataLoader.state_dict() (version 3 or {STATE_VERSION}) or "
                              "TrainStream.state_dict(); a merged state loads on any number of ranks as it is")
    recs: dict[int, Mapping] = {}
    for st in states:
        r = st.get("rank")
        if r in recs:
            raise ConfigError(f"two states for rank {r}; pass each rank's state once (from one checkpoint)")
        recs[r] = st
    first = recs[min(recs, key=lambda r: (not isinstance(r, int), r))]
    n = first.get("world_size")
    missing = sorted(set(range(n if isinstance(n, int) else 0)) - set(recs))
    if set(recs) != set(range(n if isinstance(n, int) else 0)):
        raise ConfigError(f"merge_states got the states of ranks {sorted(recs, key=str)}, but they were written "
                          f"by {n} ranks: {'ranks ' + str(missing) + ' missing' if missing else 'unknown ranks'}; "
                          "every rank's state of the same checkpoint is needed")
    for key in ("world_size", "seed", "shuffle", "sharding", "epoch", "mode", "order"):
        vals = {repr(st.get(key)) for st in recs.values()}
        if len(vals) > 1:
            raise ConfigError(f"the states disagree on {key!r} ({sorted(vals)}); they are not from one run's "
                              "checkpoint")
    order, sharding, mode = first["order"], first["sharding"], first["mode"]
    if order != "own":
        raise ConfigError(f"cannot merge states of a loader whose samples come from its {order}: a sampler or an "
                          "IterableDataset decides each rank's samples, so ODB cannot re-shard them; resume on the "
                          f"same {n} ranks, each with its own state")
    rows = [_rank_record(recs[r].get(f"rank_{r}"), r) for r in range(n)]
    _same_checkpoint(rows, mode)
    if sharding == "dealt":
        totals = {row["num_positions"] for row in rows if row["num_positions"] is not None}
        total = totals.pop() if len(totals) == 1 else None
    else:
        total = sum(row["num_positions"] for row in rows) if all(row["num_positions"] is not None for row in rows) \
            else None
    if total is None or (sharding == "fixed" and any(row["num_positions"] != len(range(r, total, n))
                                                     for r, row in enumerate(rows))):
        raise ConfigError(f"the states' orders do not fit one order (positions per rank "
                          f"{[row['num_positions'] for row in rows]}); they are not from one run, or were taken "
                          "before the first pass")
    bases = [_positions(row["base"], row["num_positions"]) for row in rows]
    if any(b != bases[0] for b in bases):  # a merged state gives every rank the same base (dealt)
        raise ConfigError("the states' ranks resumed from different merged states: they are not from one run")
    seen: dict[int, int] = dict.fromkeys(bases[0], -1)  # counted once, not as each rank's
    for r, row in enumerate(rows):
        for q in _positions(row["done"], row["num_positions"]) - bases[0]:
            g = q if sharding == "dealt" else r + q * n
            if g in seen:
                raise ConfigError(f"position {g} of the order was yielded by ranks {seen[g]} and {r}: the states are "
                                  "not from one checkpoint, or were changed")
            seen[g] = r
    shuffle = {"shuffle": first["shuffle"]} if "shuffle" in first else {}  # version-3 states did not record it
    return {"version": STATE_VERSION, "kind": "global", "world_size": n, "seed": first["seed"], **shuffle,
            "sharding": sharding,
            "order": order, "mode": mode, "epoch": first["epoch"], "num_positions": total, "done": ranges(seen),
            "complete": all(row["complete"] for row in rows), "steps": [row["steps"] for row in rows],
            "samples": max(row["samples"] for row in rows)}


def _merge_wrapped(states: list) -> dict:
    """`merge_states` of states that wrap a loader state under "loader": the loader states merged, "rank"
    dropped, every other field (the progress) kept once and refused if the ranks differ in it."""
    for k, st in enumerate(states):
        if st.get("kind", "rank") != "rank":
            raise ConfigError(f"state {k} is {describe_state(st)}: it loads on any number of ranks as it is; "
                              "merge_states takes every rank's own TrainStream.state_dict()")
    shared = [{key: v for key, v in st.items() if key not in ("loader", "rank")} for st in states]
    for key in sorted(set().union(*shared)):
        vals = [sh.get(key) for sh in shared]
        if any(v != vals[0] for v in vals):
            raise ConfigError(f"the states disagree on the training progress or another field that every rank holds "
                              f"alike ({key!r}: {vals}); they are not from one checkpoint: save every rank's state "
                              "after the same optimizer step")
    return {**shared[0], "kind": "global", "loader": _merge_loader_states([st["loader"] for st in states])}


def _same_checkpoint(rows: list[dict], mode: str) -> None:
    """Refuse states taken at different points (module docstring of `merge_states`)."""
    live = [(r, row) for r, row in enumerate(rows) if not (mode == "join" and row["complete"])]
    if not live:
        return
    steps = {row["steps"] for _, row in live}
    samples = {row["samples"] for _, row in live}
    if len(steps) > 1 or len(samples) > 1:
        what = ", ".join(f"rank {r}: {row['steps']} steps, {row['samples']} samples" for r, row in live)
        raise ConfigError(f"the states are from different checkpoints ({what}): every rank must be saved after the "
                          "same optimizer step")
    ended_late = [r for r, row in enumerate(rows) if mode == "join" and row["complete"]
                  and row["steps"] > live[0][1]["steps"]]
    if ended_late:
        raise ConfigError(f"ranks {ended_late} finished after more steps than the others have taken: the states are "
                          "from different checkpoints")


def _check_common(state, *, seed: int, shuffle: bool, sharding: str) -> dict:
    if not isinstance(state, Mapping):
        raise ConfigError(f"state must be a mapping from ODBDataLoader.state_dict, got {type(state).__name__}")
    if "loader" in state or "ranks" in state:
        raise ConfigError(f"ODBDataLoader.load_state_dict got {describe_state(state)}, which holds the training "
                          "progress too: load it with TrainStream.load_state_dict (after odb.merge_states for a "
                          "gather_rank_states entry), or the adapter's own load_state_dict")
    sd = dict(state)
    version = sd.pop("version", None)
    if version not in (2, 3, STATE_VERSION) or isinstance(version, bool):
        raise ConfigError(f"state version {version!r} is not supported (this loader reads 2 to {STATE_VERSION})")
    checks = [("seed", seed, "the sample order would change"),
              ("sharding", sharding, "positions would mean other samples")]
    if "shuffle" in sd:  # every state this version writes records it; older ones did not
        checks.append(("shuffle", shuffle, "the sample order would change: positions would mean other samples"))
    for key, mine, why in checks:
        _expect(sd, key, mine, why)
    return sd


def _expect(sd: dict, key: str, mine, why: str) -> None:
    """Pop `key` from the state `sd`; refuse a missing key, or a value (or type) other than this loader's."""
    if key not in sd:
        raise ConfigError(f"state has no {key!r} key; it was not written by ODBDataLoader.state_dict")
    got = sd.pop(key)
    if got != mine or type(got) is not type(mine):
        raise ConfigError(f"cannot resume: state has {key}={got!r}, this loader has {mine!r} ({why})")


def _epoch(epoch) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ConfigError(f"state has epoch={epoch!r}; it must be an int >= 0")
    return epoch


def _rank_record(mine, rank: int) -> dict:
    """A rank's entry, validated (version 2 entries have no steps or samples: 0)."""
    if not isinstance(mine, Mapping):
        raise ConfigError(f"state's rank_{rank} is a {type(mine).__name__}, not a mapping")
    rec = dict(mine)
    missing = {"done", "complete", "num_positions"} - set(rec)
    if missing:
        raise ConfigError(f"state's rank_{rank} lacks {sorted(missing)}")
    out = {k: rec.pop(k) for k in ("done", "complete", "num_positions")}
    out["steps"], out["samples"] = rec.pop("steps", 0), rec.pop("samples", 0)
    out["base"] = rec.pop("base", [])  # version 4
    if rec:
        raise ConfigError(f"rank state has unknown keys {sorted(rec)}")
    if not isinstance(out["complete"], bool):
        raise ConfigError(f"state has complete={out['complete']!r}; it must be True or False (whether the last pass "
                          "of the epoch ran to its end)")
    num = out["num_positions"]
    if num is not None and (isinstance(num, bool) or not isinstance(num, int) or num < -1):
        raise ConfigError(f"state has num_positions={num!r}; it must be None, -1 or an int >= 0")
    for key in ("steps", "samples"):
        v = out[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"state has {key}={v!r}; it must be an int >= 0")
    return out


def _positions(done, total) -> set:
    """The positions of a state's yielded ranges, validated: pairs ``[a, b)`` of ints, increasing,
    disjoint, inside the order (``total``; -1 or None: no upper bound)."""
    total = -1 if total is None else total
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
