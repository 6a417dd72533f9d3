"""Drive the RELEASED package's grouping (online-dynamic-batching 0.1.2) on N gloo ranks.

Standalone on purpose: run it with the Python of a separate venv where the
released package is installed (its import name ``odb`` collides with ours, so
this file imports nothing from this repository).  ``paper_repro.bench
--release-python PATH`` runs it; it is never run by the tests.

What it reproduces.  The released ``collate_loop_odb`` (``odb/collate.py``),
with the DataLoader and its worker processes taken out: every sample of the
rank's shard arrives in order as one index slot (``idx_buffer``) and one
buffered sample (``data_buffer``); when the slots reach ``buffer_size *
counter`` (``counter`` ramps from 0 by 0.05 per call, the package's default
warm-up) the rank calls ``collate_once``, i.e. the package's own
``odb.grouping.grouping_data`` (the real all-gather on a gloo process group),
recycles its overflow, shuffles the groups with the package's seeded RNG and
emits one batch or one IDLE per index slot.  At the end it calls
``collate_once`` as the package does until every rank reports finished.
IDLE slots are skipped by the package's iterator, so a rank's k-th real batch
is its k-th optimizer step; ranks with fewer batches get fillers in the
metrics (in training they would stop early or hang, a defect FACTS.md lists).

Input (argv[1], JSON): ``{"shards": [[len, ...], ...], "budget": B, "buffer_size": W,
"seed": s}``.  Output (argv[2], JSON): ``{"batches": [[[sample, ...], ...], ...],
"calls": n, "wall_s": t}`` with sample indices into each rank's shard, or
``{"error": "..."}`` when the ranks fail or time out.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from datetime import timedelta

TIMEOUT_S = 120


def _rank_main(rank: int, world: int, store_path: str, job: dict, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from odb.grouping import grouping_data  # the RELEASED package (separate venv)
    from odb.utils import is_valid_batch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=timedelta(seconds=TIMEOUT_S))
    group = dist.group.WORLD
    W, B, seed = job["buffer_size"], job["budget"], job["seed"]
    rg = random.Random(seed)
    emitted: list[list[int]] = []
    state = {"round": 0, "calls": 0}
    idx_buffer: list[int] = []
    data_buffer: list[list[dict]] = []

    def collate_once(finished: bool) -> bool:
        state["calls"] += 1
        grouped, overflow, all_finished, skip = grouping_data(
            data_buffer, B, group, is_finished=finished, idx_budget=len(idx_buffer), join_mode=False,
            max_groups=W, grouping_round=state["round"])
        state["round"] += 1
        data_buffer.clear()
        data_buffer.extend([[s] for s in overflow])
        if skip:
            return all_finished
        rg.shuffle(grouped)
        for k in range(len(idx_buffer)):
            if k < len(grouped) and is_valid_batch(grouped[k]):
                emitted.append([int(s["_id"]) for s in grouped[k]])
        idx_buffer.clear()
        return all_finished

    counter = 0.0
    for i, L in enumerate(job["shards"][rank]):
        idx_buffer.append(i)
        data_buffer.append([{"input_ids": [0] * int(L), "_id": i}])
        if len(idx_buffer) >= int(W * counter):
            collate_once(False)
            counter = min(1.0, counter + 0.05)
    done = collate_once(False) if idx_buffer else False
    guard = 0
    while not done:
        done = collate_once(True)
        guard += 1
        if guard > 100000:
            raise RuntimeError("the released loop did not finish")
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"batches": emitted, "calls": state["calls"]}, f)
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    import torch.multiprocessing as mp

    job = json.load(open(argv[1]))
    world = len(job["shards"])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_rank_main, args=(r, world, os.path.join(tmp, "store"), job, tmp))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(TIMEOUT_S)
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            p.kill()
            p.join(5)
        bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
        if bad:
            out = {"error": f"ranks failed or timed out (rank, exit code): {bad}"}
        else:
            rows = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(world)]
            out = {"batches": [r["batches"] for r in rows], "calls": max(r["calls"] for r in rows),
                   "wall_s": time.perf_counter() - t0}
    with open(argv[2], "w") as f:
        json.dump(out, f)
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
