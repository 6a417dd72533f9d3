"""Multi-process test helper: run a function on N gloo ranks and collect each rank's outcome.

`run_ranks(fn, world_size, tmp_path, ...)` starts N processes (fork by default,
spawn on request) that each init a gloo process group through a ``file://``
store, call ``fn(rank, world_size, *args)`` and write the result (or the
exception's type and message) to a pickle file.  Children are joined with a
timeout and only they are killed if they overstay.  Outcomes:
``Outcome(status="ok"|"error"|"died"|"hung", value, error_type, error)``.

The scenario worker `scenario` drives an `ODBDataLoader` from a plain dict spec,
so tests describe runs as data (shard sizes, W, mode, faults).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import random
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

from torch.utils.data import IterableDataset, get_worker_info

__all__ = ["Outcome", "run_ranks", "scenario", "make_lengths"]


@dataclass
class Outcome:
    status: str
    value: Any = None
    error_type: str | None = None
    error: str | None = None
    seconds: float = 0.0


def _child(fn, rank, world_size, args, store, out, env, pg_timeout_s):
    os.environ.update(env)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.monotonic()
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=pg_timeout_s))
        value = fn(rank, world_size, *args)
        res = Outcome("ok", value, seconds=time.monotonic() - t0)
    except BaseException as e:  # noqa: BLE001 - reported to the test
        res = Outcome("error", None, type(e).__name__, f"{e}\n{traceback.format_exc()}",
                      seconds=time.monotonic() - t0)
    with open(out + ".tmp", "wb") as f:
        pickle.dump(res, f)
    os.replace(out + ".tmp", out)
    try:
        import gc

        import torch.distributed as dist

        gc.collect()  # free what holds the group now: a gloo work freed during finalization aborts the process
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def run_ranks(fn: Callable, world_size: int, tmp_path, *, args: tuple = (), timeout_s: float = 60.0,
              start_method: str = "fork", env: dict | None = None, pg_timeout_s: float = 30.0) -> list[Outcome]:
    """Run `fn` on `world_size` gloo ranks; return one Outcome per rank (in rank order)."""
    ctx = mp.get_context(start_method)
    tmp = str(tmp_path)
    os.makedirs(tmp, exist_ok=True)
    store = os.path.join(tmp, f"store_{time.monotonic_ns()}")
    outs = [os.path.join(tmp, f"out_{os.path.basename(store)}_{r}.pkl") for r in range(world_size)]
    env = {"OMP_NUM_THREADS": "1", **(env or {})}
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, args, store, outs[r], env, pg_timeout_s),
                         daemon=False) for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    results = []
    for r, p in enumerate(procs):
        hung = p.is_alive()
        if hung:
            p.kill()  # only our own child, by its handle
            p.join(5)
        if os.path.exists(outs[r]):
            with open(outs[r], "rb") as f:
                results.append(pickle.load(f))
        else:
            results.append(Outcome("hung" if hung else "died", error=f"exitcode {p.exitcode}"))
    return results


def make_lengths(n: int, seed: int, lo: int = 1, hi: int = 60) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(n)]


class ListSampler:
    """Yields a fixed list of indices (this rank's own, possibly uneven, shard)."""

    def __init__(self, indices):
        self.indices = list(indices)
        self.epoch = 0

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)

    def set_epoch(self, e):
        self.epoch = e


class Samples:
    """Map-style dataset: sample i has ``len(lengths[i])`` tokens and an ``id``; faults by index."""

    def __init__(self, lengths, drop=(), raise_at=(), no_len=(), die_at=None):
        self.lengths, self.drop, self.raise_at, self.no_len = lengths, set(drop), set(raise_at), set(no_len)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        if i in self.raise_at:
            raise RuntimeError(f"injected failure at {i}")
        if i in self.drop:
            return None
        if i in self.no_len:
            return {"id": [i]}
        n = self.lengths[i]
        return {"input_ids": [1] * n, "labels": [-100] + [1] * (n - 1), "id": [i]}


class Stream(IterableDataset):
    """This rank's own stream of samples (ids are global dataset ids); splits itself across workers."""

    def __init__(self, lengths, ids):
        self.lengths, self.ids = lengths, list(ids)

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        for k, i in enumerate(self.ids):
            if k % nw == wid:
                n = self.lengths[i]
                yield {"input_ids": [1] * n, "labels": [1] * n, "id": [i]}


def id_collate(samples):
    from odb.runtime import pad_collate

    return pad_collate(samples)


def bad_collate(samples):
    if any(s["id"][0] == 7 for s in samples):
        raise ValueError("injected collate failure")
    return id_collate(samples)


def list_collate(samples):
    return [s["id"][0] for s in samples]


def scenario(rank: int, world_size: int, spec: dict) -> dict:
    """Drive one loader per `spec` and report what this rank saw.

    spec keys: lengths (list), shards (per-rank index lists; default: loader's own
    shard), budget, W, mode, iterable, workers, drop, raise_at, no_len, collate
    ("id" | "bad" | "list"), break_at (step), break_rank (default: every rank), die_at (step) with
    die_rank, stall_at (a step or a list of steps) with stall_rank ("all": every rank, a pause every rank takes)
    and stall_s (the consumer sleeps), epochs, trace_dir,
    oversize, timeout_s, state (a state_dict per rank to load, or one merged state for every rank),
    save_at (step: return a state_dict taken after that step and stop; a rank whose data ends first
    returns its final state), sharding ("auto" | "fixed" | "dealt"), exchange (bool), pool (pool_size),
    placement ("auto": the loader's default, over exchange and pool), filler_sample, first_window (default the
    loader's).
    """
    import odb
    from odb.integrations import join_context

    lengths = spec["lengths"]
    shards = spec.get("shards")
    kw = dict(buffer_size=spec.get("W", 8), mode=spec.get("mode", "pad"), trace_dir=spec.get("trace_dir"),
              num_workers=spec.get("workers", 0), oversize=spec.get("oversize", "alone"),
              timeout_s=spec.get("timeout_s", 20), seed=spec.get("seed", 0),
              dataloader={"multiprocessing_context": spec.get("mp_context")}, sharding=spec.get("sharding", "auto"),
              placement=odb.Exchanged(pool=spec.get("pool", 1)) if spec.get("exchange") else
              odb.Pooled(spec["pool"]) if spec.get("pool", 1) > 1 else None,
              first_window=spec.get("first_window", odb.LoaderSettings.first_window))
    if spec.get("placement") == "auto":  # the loader's default
        del kw["placement"]
    if spec.get("filler_sample") is not None:
        kw["filler_sample"] = spec["filler_sample"]
    collate = {"id": id_collate, "bad": bad_collate, "list": list_collate}[spec.get("collate", "id")]
    if spec.get("iterable"):
        ds = Stream(lengths, shards[rank])
    else:
        ds = Samples(lengths, spec.get("drop", ()), spec.get("raise_at", ()), spec.get("no_len", ()))
        if shards is not None:
            kw["sampler"] = ListSampler(shards[rank])
    steps, out = [], {}
    loader = odb.ODBDataLoader(ds, spec.get("budget", 128), collate, **kw)
    if spec.get("state") is not None:  # one state per rank, or one merged state for every rank (elastic)
        st = spec["state"]
        loader.load_state_dict(st if isinstance(st, dict) else st[rank])
    for epoch in range(spec.get("epochs", 1)):
        if epoch:
            loader.set_epoch(epoch)
        with join_context(None, loader):  # JOIN: no model collective here; the loader requires the context
            _scenario_pass(rank, spec, loader, epoch, steps, out)
    if spec.get("save_at") is not None and "state" not in out:  # JOIN: this rank's data ended before the save
        out["state"] = loader.state_dict()
    out.update(steps=steps, stats=loader.stats.as_dict())
    loader.close()
    return out


def _scenario_pass(rank: int, spec: dict, loader, epoch: int, steps: list, out: dict) -> None:
    import odb

    for k, batch in enumerate(loader):
        info = odb.pop_step_info(batch)
        ids = batch["id"][:, 0].tolist() if not info.filler else []
        steps.append({"indices": list(info.indices), "ids": ids, "filler": info.filler,
                      "scale": info.loss_scale, "gs": info.global_samples, "ls": info.local_samples,
                      "gt": info.global_tokens, "lt": info.local_tokens, "gl": info.global_label_tokens,
                      "ll": info.local_label_tokens, "epoch": epoch})
        if spec.get("die_at") == k and rank == spec.get("die_rank", 0):
            os._exit(3)
        stall_at, stall_rank = spec.get("stall_at"), spec.get("stall_rank", 0)
        if (k in stall_at if isinstance(stall_at, (list, tuple)) else stall_at == k) and \
                stall_rank in ("all", rank):
            time.sleep(spec["stall_s"])
        if spec.get("save_at") == k:
            out["state"] = loader.state_dict()
            return
        if spec.get("break_at") == k and spec.get("break_rank", rank) == rank:
            return


def build_and_run(rank: int, world_size: int, kwargs_per_rank: list) -> int:
    """Construct an ODBDataLoader with this rank's kwargs (a map-style dataset of 60 samples) and
    run one epoch; returns the batches seen."""
    import odb

    loader = odb.ODBDataLoader(Samples(make_lengths(60, seed=1, lo=2, hi=40)), 128, id_collate, timeout_s=5,
                               **kwargs_per_rank[rank])
    n = sum(1 for b in loader if odb.pop_step_info(b))
    loader.close()
    return n
