"""The torchrun training worker: every method, side by side, in one process group.

Launch (what `paper_repro.repro` does)::

    python -m torch.distributed.run --standalone --nproc_per_node 2 \
        -m paper_repro.train --spec SPEC.json --out OUT.json

SPEC.json is one `paper_repro.repro.RunSpec` (as a dict): the workload, the net, full fine-tuning or LoRA, the token
budget, the methods to run.  Every method trains a fresh copy of the same net (same init seed) on the same samples,
for the same number of epochs, with the same learning-rate schedule defined on *samples seen* (so a method with
bigger batches takes fewer, larger steps along the same curve), one after another in this process group so that the
ratios are measured under the same machine load.

Repeats (the measurement protocol): after ``spec["warmup_steps"]`` unmeasured steps, ``spec["repeats"]`` rounds run
every method once each, interleaved and rotated (round r starts at method r: A B C, B C A, C A B), so a slow stretch
of the machine lands on different methods and positions.  Every repeat of a method is a fresh net on the same
samples: its batches, steps and losses are the same in every round (recorded, not assumed), only the clock differs.
Process start, imports and data building are paid once per job, outside every measurement; the garbage of the
previous repeat is collected before the next one starts.  A run during which other programs kept more than
``spec["max_load_cores"]`` cores busy (measured, `paper_repro.cpu`) is rerun at once (`rerun`), within a per-job
budget; the least loaded attempt is kept (`keep_attempt`: chosen on the machine's load, never on the run's own
speed) and the others are recorded.

Methods (per rank, `world_size` ranks):
    standard1   fixed batch of 1 per rank (the paper's public examples), DistributedSampler,
                with gradient accumulation (see below)
    standard1_noacc  the same with one optimizer step per micro-batch (no accumulation)
    standardB   fixed "memory-equivalent" batch: budget // cutoff samples per rank, accumulated
    gmt / bmt   odb.baselines GlobalMaxTokens / BucketedMaxTokens, fed a length cache
                that the ranks build first by running the pipeline, sharded (its cost is reported)
    odb_pad     odb.ODBDataLoader(mode="pad")
    odb_join    odb.ODBDataLoader(mode="join") with DDP `Join` on the model side

Gradient accumulation (the quality protocol): Standard runs with an effective batch matched to ODB (`accum_for`).
Loss: each rank computes the mean next-token loss over its label tokens; ODB batches multiply it by
``info.loss_scale`` (global label-token mean after DDP's average); fixed batches use the plain per-rank mean (what
HF/DDP users get).

Output (rank 0 writes OUT.json): per method, one record per repeat (`_merge` gives its fields).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from . import sources, workloads
from .cpu import LoopMeter
from .data import collate_pad
from .spec import RunSpec

__all__ = ["main", "run_method", "accum_for", "accumulation_groups", "round_order", "rerun", "keep_attempt", "METHODS"]

METHODS = ("odb_pad", "odb_join", "gmt", "bmt", "standard1", "standardB", "standard1_noacc")


def _lr_at(samples_seen: int, total: int, peak: float, warmup_frac: float = 0.05) -> float:
    """Warmup then cosine to 10% of peak, as a function of global samples seen."""
    w = max(1, int(warmup_frac * total))
    if samples_seen < w:
        return peak * (samples_seen + 1) / w
    t = min(1.0, (samples_seen - w) / max(1, total - w))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _lr_batch_factor(global_samples: int, world_size: int, spec: dict) -> float:
    """Adam square-root scaling (Malladi et al. 2022): lr * sqrt(global batch / reference),
    reference = world_size samples (batch 1 per rank), so standard1 runs at the base LR.
    ``spec["lr_scaling"] = "none"`` turns it off for every method alike."""
    if spec.get("lr_scaling", "sqrt") == "none" or global_samples <= 0:
        return 1.0
    return math.sqrt(global_samples / world_size)


@torch.no_grad()
def evaluate(net, val_batches, rank: int, world_size: int) -> float:
    """Mean validation loss per label token over the whole validation set (all ranks)."""
    net.eval()
    s = torch.zeros(2, dtype=torch.float64)
    for i, b in enumerate(val_batches):
        if i % world_size == rank:
            loss, n = net(b)
            s += torch.tensor([float(loss), float(n)], dtype=torch.float64)
    dist.all_reduce(s)  # SYNC: every rank must reach this
    net.train()
    return float(s[0] / s[1])


def run_method(method: str, spec: dict, rank: int, world_size: int, accum: int = 1, data=None) -> dict:
    """Train one method for spec["epochs"] epochs, `accum` micro-batches per optimizer step;
    returns this rank's record.  `data` = (train, val datasets, val batches), built once per job."""
    if accum < 1:
        raise ValueError(f"accum must be >= 1 micro-batches per optimizer step, got {accum}")
    if data is None:
        ds_train, ds_val = workloads.build_datasets(spec)
        data = (ds_train, ds_val, workloads.val_batches(ds_val, spec))
    ds_train, _, val_batches = data
    # The source first: it may raise MethodUnavailable, which must happen before any collective.
    source = sources.batch_source(method, ds_train, spec, rank, world_size)
    net = workloads.build_net(spec)
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec["lr"], weight_decay=0.0)
    ddp = DDP(net, find_unused_parameters=False)
    total = spec["epochs"] * len(ds_train)
    rec = {"method": method, "steps": 0, "micro_steps": 0, "accum": accum, "local_samples": 0, "real_tokens": 0,
           "padded_tokens": 0, "wait_s": 0.0, "train_s": 0.0, "val_loss": [], "curve": [],
           "first_batch_s": None, "first_batch_all_s": 0.0, "indices": [],
           "setup_s": source.setup_s, "notes": source.notes, "fillers": 0, "over_budget_batches": 0}
    meter = LoopMeter()
    seen = 0  # global samples seen so far (identical on every rank: from the batch sources' global counts)
    rec["val_loss"].append((0, evaluate(net, val_batches, rank, world_size)))
    for epoch in range(spec["epochs"]):
        dist.barrier()  # SYNC: every rank must reach this
        meter.start()
        t0 = time.perf_counter()
        if hasattr(ds_train, "set_epoch"):
            ds_train.set_epoch(epoch)  # a new augmentation draw every epoch, for every method
        mine: list[int] = []
        first = True
        with source.join_context(ddp):
            # One optimizer step = up to `accum` micro-batches.  Every rank gets the same number of
            # micro-batches per epoch from a fixed-batch source (equal shards), so the groups align;
            # ODB and GMT/BMT run with accum 1.
            for group, wait in accumulation_groups(source.epoch(epoch), accum):
                rec["wait_s"] += wait
                meter.poll()
                if not group:
                    break
                if first:  # iter() to this epoch's first batch: ODB's window fill and first round
                    first, dt = False, time.perf_counter() - t0
                    rec["first_batch_all_s"] += dt
                    if rec["first_batch_s"] is None:
                        rec["first_batch_s"] = dt
                g_samples = sum(meta["global_samples"] for _, meta in group)
                lr = _lr_at(seen, total, spec["lr"]) * _lr_batch_factor(g_samples, world_size, spec)
                for g in opt.param_groups:
                    g["lr"] = lr
                opt.zero_grad(set_to_none=True)
                for i, (batch, meta) in enumerate(group):
                    # no_sync on all but the last micro-batch: one gradient all-reduce per optimizer step
                    ctx = ddp.no_sync() if i < len(group) - 1 else contextlib.nullcontext()
                    with ctx:
                        loss_sum, n = ddp(batch)
                        loss = loss_sum / max(1, n) * meta["scale"] / len(group)
                        loss.backward()
                    rec["micro_steps"] += 1
                    rec["fillers"] += int(meta["filler"])
                    rec["local_samples"] += meta["local_samples"]
                    rec["real_tokens"] += meta["real_tokens"]
                    rec["padded_tokens"] += meta["padded_tokens"]
                    rec["over_budget_batches"] += int(meta["padded_tokens"] > spec["budget"]
                                                      and meta["local_samples"] > 1)
                    mine += meta["indices"]
                    if not meta["filler"]:
                        rec["curve"].append((seen + meta["global_samples"] * (i + 1),
                                             float(loss_sum.detach()) / max(1, n)))
                opt.step()
                seen += g_samples
                rec["steps"] += 1
        rec["train_s"] += time.perf_counter() - t0
        meter.stop()
        rec["indices"].append(mine)
        # Every sample was seen exactly once per epoch by every method here; use the exact count.
        seen = (epoch + 1) * len(ds_train)
        rec["val_loss"].append((seen, evaluate(net, val_batches, rank, world_size)))
    rec["cpu"] = meter.result()
    rec["loader"] = source.loader_stats() if hasattr(source, "loader_stats") else None
    close = getattr(source, "close", None)
    if close is not None:  # deterministic teardown on every rank (not whenever the garbage collector runs)
        close()
    return rec


def accumulation_groups(batches, accum: int):
    """``(group, seconds waited for it)``: `accum` items at a time from `batches`; the last group is shorter, or
    empty when the items ran out on a group's boundary (the wait for the end is a wait too)."""
    it = iter(batches)
    while True:
        group, t0 = [], time.perf_counter()
        for _ in range(accum):
            try:
                group.append(next(it))
            except StopIteration:
                yield group, time.perf_counter() - t0
                return
        yield group, time.perf_counter() - t0


def accum_for(method: str, spec: dict, done: dict, world_size: int) -> int:
    """Micro-batches per optimizer step for `method` (the quality protocol).

    The paper's recipes run Standard as per-device batch 1 *with* an effective batch.  Here that effective batch is
    matched to ODB: ``spec["accum_match"]`` names a method that runs earlier in the same job (``"odb_pad"``); its mean
    global samples per optimizer step S fixes ``accum = max(1, round(S / (world_size * batch)))`` micro-batches per
    optimizer step for every method listed in ``spec["accum_methods"]``.  Accumulated micro-batches run under
    ``DDP.no_sync`` (one gradient all-reduce per optimizer step, as HF/Accelerate do) and each is weighted 1/accum; an
    epoch's last group may be shorter and is weighted by its own length.  So at equal samples seen, ODB and Standard
    have taken about the same number of optimizer steps with the same learning rate (the schedule is on samples;
    sqrt scaling on the global samples of the optimizer step).

    `make repro` runs one job per round and passes what a workload's round-0 job matched to its later jobs
    (``spec["accums"]``), where this is not called.

    1 unless `method` is in spec["accum_methods"]; then matched to the mean global samples per
    optimizer step of spec["accum_match"], which must have run already in this job (every rank
    holds the same merged records, so every rank computes the same value).
    """
    if method not in spec.get("accum_methods", ()):
        return 1
    ref = done.get(spec.get("accum_match", ""))
    if ref and "unavailable" in ref:
        raise sources.MethodUnavailable(f"{method}: its accumulation is matched to {spec['accum_match']!r}, "
                                          f"which is unavailable here ({ref['unavailable']})")
    if not ref:
        raise ValueError(f"{method}: accumulation is matched to {spec.get('accum_match')!r}, which has not run "
                         f"successfully before it in this job (methods in order: {spec['methods']}); "
                         "list the reference method first")
    per_step = ref["samples"] / max(1, ref["steps"])
    return max(1, round(per_step / (world_size * sources.fixed_batch_size(method, spec))))


def _merge(recs: list[dict], num_train: int, epochs: int) -> dict:
    """Combine the ranks' records of one repeat into one method record (rank 0).

    Per method, one record per repeat (what rank 0 writes to OUT.json): wall time of the training loop (evaluation
    excluded; each epoch from ``iter()`` to its last batch), time to the first batch (epoch 0, and summed over
    epochs: ODB's window fill), the one-off setup before training (GMT/BMT's length cache), emitted samples, real and
    padded tokens, steps, loader wait fraction, the CPU split of the loop (`paper_repro.cpu`), the exactly-once check
    (every dataset index emitted once per epoch over all ranks), validation loss at the end of each epoch (equal
    samples seen for every method); round 0 also keeps the per-step (samples seen, train loss) for the loss curves.
    """
    r0 = dict(recs[0])
    out = {k: r0[k] for k in ("method", "val_loss", "notes", "accum", "curve")}
    out["wall_s"] = max(r["train_s"] for r in recs)
    for k in ("local_samples", "real_tokens", "padded_tokens", "fillers", "over_budget_batches"):
        out[k.replace("local_", "")] = sum(r[k] for r in recs)
    out["steps"] = max(r["steps"] for r in recs)
    out["micro_steps"] = max(r["micro_steps"] for r in recs)
    out["steps_per_rank"] = [r["steps"] for r in recs]
    # one-off and per-epoch start costs: the slowest rank decides when training can begin
    out["setup_s"] = max(r["setup_s"] for r in recs)
    out["first_batch_s"] = max(r["first_batch_s"] or 0.0 for r in recs)
    out["first_batch_all_s"] = max(r["first_batch_all_s"] for r in recs)
    out["wait_frac"] = max(r["wait_s"] for r in recs) / max(1e-9, out["wall_s"])
    out["samples_per_s"] = out["samples"] / out["wall_s"]
    out["real_tok_per_s"] = out["real_tokens"] / out["wall_s"]
    out["padded_tok_per_s"] = out["padded_tokens"] / out["wall_s"]
    out["expected_samples"] = num_train * epochs
    out["cpu"] = [r["cpu"] for r in recs]
    busy = recs[0]["cpu"]["machine_busy_s"]  # rank 0's reading covers the whole machine
    out["external_cores"] = (None if busy is None else
                             max(0.0, busy - sum(r["cpu"]["proc_cpu_s"] for r in recs)) / max(1e-9, out["wall_s"]))
    out["loader"] = [r["loader"] for r in recs] if recs[0]["loader"] else None
    # Exactly once: per epoch, the ranks' indices together are every dataset index, once.
    bad = 0
    for e in range(epochs):
        got = sorted(i for r in recs for i in r["indices"][e])
        bad += len(set(range(num_train)) ^ set(got)) + (len(got) - len(set(got)))
    out["exactly_once"], out["index_errors"] = bad == 0, bad
    return out


def round_order(methods: list, r: int) -> list:
    """Round `r`'s method order: the list rotated by r (round 0 keeps the spec's order, so the
    accumulation reference runs first)."""
    k = r % max(1, len(methods))
    return list(methods[k:]) + list(methods[:k])


def rerun(attempts: list[dict], spent_s: float, spec: dict) -> bool:
    """Rerun this method now?  Only if its last attempt was loaded (other programs above
    spec["max_load_cores"]), it has retries left and the job's reruns cost less than the budget.
    Every input is gathered (identical on every rank), so every rank decides alike."""
    ext = attempts[-1]["external_cores"]
    return (ext is not None and ext > spec["max_load_cores"] and len(attempts) <= spec["retries"]
            and spent_s < spec["retry_budget_s"])


def keep_attempt(attempts: list[dict], spec: dict) -> dict:
    """The least loaded attempt, with the others summarized under "attempts" and a "loaded" flag."""
    def load(a):
        return a["external_cores"] if a["external_cores"] is not None else 0.0

    keep = dict(min(attempts, key=load))
    keep["attempts"] = [{k: a[k] for k in ("samples_per_s", "wall_s", "external_cores")}
                        for a in attempts if a is not min(attempts, key=load)]
    keep["loaded"] = load(keep) > spec["max_load_cores"]
    return keep


def warm_up(spec: dict, data, rank: int, world_size: int) -> float:
    """`spec["warmup_steps"]` unmeasured steps of a throwaway net (kernels, allocator, gloo's
    all-reduce path), so round 0's first method does not pay them; returns the seconds."""
    t = time.perf_counter()
    n = spec["warmup_steps"]
    if n <= 0:
        return 0.0
    ds_train = data[0]
    ddp = DDP(workloads.build_net(spec), find_unused_parameters=False)
    opt = torch.optim.AdamW([p for p in ddp.parameters() if p.requires_grad], lr=1e-4)
    for k in range(n):
        idx = [(k * 4 + j) % len(ds_train) for j in range(1 + k % 4)]
        loss_sum, cnt = ddp(collate_pad([ds_train[i] for i in idx]))
        (loss_sum / max(1, cnt)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    del ddp, opt
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, help="RunSpec JSON file")
    ap.add_argument("--out", required=True, help="result JSON file (written by rank 0)")
    args = ap.parse_args(argv)
    with open(args.spec) as f:
        spec = RunSpec.of(json.load(f))  # an unknown key fails here, on every rank, before any work
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=spec.get("timeout_s", 120)))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    methods = spec["methods"]
    results = {"spec": spec, "world_size": world_size, "methods": {m: {"method": m, "repeats": []} for m in methods},
               "rounds": [], "first_round": spec["first_round"], "rerun_s": 0.0}
    try:
        t = time.perf_counter()
        ds_train, ds_val = workloads.build_datasets(spec)
        data = (ds_train, ds_val, workloads.val_batches(ds_val, spec))
        results["data_s"] = time.perf_counter() - t
        results["warmup_s"] = warm_up(spec, data, rank, world_size)
        accums: dict[str, int] = dict(spec["accums"])
        for r in range(spec["first_round"], spec["first_round"] + spec["repeats"]):
            order = [m for m in round_order(methods, r) if "unavailable" not in results["methods"][m]]
            results["rounds"].append(order)
            for pos, m in enumerate(order):
                entry, attempts = results["methods"][m], []
                while True:
                    gc.collect()  # the previous run's garbage, collected outside every measured loop
                    try:
                        if m not in accums:
                            done = {k: (e["repeats"][0] if e["repeats"] else e)
                                    for k, e in results["methods"].items() if e["repeats"] or "unavailable" in e}
                            accums[m] = accum_for(m, spec, done, world_size)
                        rec, err = run_method(m, spec, rank, world_size, accum=accums[m], data=data), None
                    except sources.MethodUnavailable as e:
                        rec, err = None, str(e)
                    recs = [None] * world_size
                    dist.all_gather_object(recs, (rec, err))  # SYNC: every rank must reach this
                    errs = [e for _, e in recs if e]
                    if errs:
                        entry["unavailable"] = errs[0]
                        break
                    attempts.append(_merge([x for x, _ in recs], spec["num_train"], spec["epochs"]))
                    if not rerun(attempts, results["rerun_s"], spec):
                        break
                    results["rerun_s"] += attempts[-1]["wall_s"]
                if attempts:
                    kept = keep_attempt(attempts, spec)
                    kept.update(round=r, position=pos)
                    if r:
                        kept.pop("curve")  # the same steps every round; round 0's curve is kept
                    entry["repeats"].append(kept)
                if rank == 0:
                    print(json.dumps({"progress": [m, r]}), flush=True)
        if rank == 0:
            tmp = args.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(results, f)
            os.replace(tmp, args.out)
    finally:
        # Free what still holds the process group (DDP modules in reference cycles) while the interpreter is
        # alive: a gloo work destroyed in its worker thread during interpreter finalization needs the GIL and
        # aborts the process ("terminate called without an active exception"; seen 2 runs in 20).
        gc.collect()
        try:
            dist.barrier()  # SYNC: both ranks tear down together (a peer gone mid-teardown aborts gloo)
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
