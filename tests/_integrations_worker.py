"""Worker scripts for tests/test_integrations_*.py, run under torch.distributed.run (2 gloo ranks) or alone.

``python tests/_integrations_worker.py <framework> <out_dir>`` writes ``<out_dir>/rank<r>.json`` with
what the test checks: the first optimizer step's gradients next to a reference computed on the
concatenated global window, the LR seen at every optimizer step with the samples consumed before
it, and the dataset indices of every micro-step (for exactly-once, with and without a resume).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _tiny import TinyDataset, tiny_llama  # noqa: E402

N, BUDGET, GA, LR = 36, 48, 2, 1e-2


def rank_world():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    # Lightning initializes its process group inside fit() and destroys it after: read the launcher's env
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def reference_grads(indices: list[int], seed: int = 0) -> dict:
    """Gradient of sum(token CE over all targets of `indices`) / (number of targets), one sample at a time."""
    model = tiny_llama(seed)
    ds = TinyDataset(N)
    total = sum(int((ds[i]["labels"][1:] != -100).sum()) for i in indices)
    for i in indices:
        s = ds[i]
        logits = model(input_ids=s["input_ids"][None]).logits[0, :-1]
        tgt = s["labels"][1:]
        loss = torch.nn.functional.cross_entropy(logits, tgt, ignore_index=-100, reduction="sum") / total
        loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def token_mean_grads(model, samples) -> dict:
    """Gradient, for `model`'s trainable parameters, of sum(token CE over every target of `samples`) /
    (number of targets), one unpadded sample at a time; a sample is ``(input_ids, labels)`` (lists or
    1-D tensors) and its targets are ``labels[1:]`` (the causal shift), -100 excluded."""
    model.zero_grad(set_to_none=True)
    samples = [(torch.as_tensor(i), torch.as_tensor(t)) for i, t in samples]
    total = sum(int((t[1:] != -100).sum()) for _, t in samples)
    for ids, tgt in samples:
        logits = model(input_ids=ids[None]).logits[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, tgt[1:], ignore_index=-100, reduction="sum") / total
        loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def compare(grads: dict, ref: dict) -> float:
    """Largest relative error over parameters."""
    worst = 0.0
    for n, g in grads.items():
        r = ref[n]
        worst = max(worst, float((g - r).norm() / (r.norm() + 1e-12)))
    return worst


def all_indices_gather(local: list[int]) -> list[int]:
    r, w = rank_world()
    if w == 1:
        return list(local)
    out: list = [None] * w
    dist.all_gather_object(out, list(local))
    return [i for part in out for i in part]


# ---------------------------------------------------------------------------------------------- HF
def run_hf(out_dir: str, exchange: bool = False) -> dict:
    from transformers import TrainerCallback, TrainingArguments

    import odb
    from odb.integrations.hf import ODBTrainer
    from odb.runtime import pad_collate

    rank, world = rank_world()
    rec = {"first_window": [], "lr": [], "indices": [], "resume_indices": []}

    class Recording(ODBTrainer):
        def get_batch_samples(self, epoch_iterator, num_batches, device):
            batches, window = super().get_batch_samples(epoch_iterator, num_batches, device)
            self._rec_window = list(self._rec_pending)
            self._rec_pending = []
            return batches, window

    class Rec(TrainerCallback):
        def __init__(self, trainer_ref, key):
            self.t, self.key = trainer_ref, key

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            t = self.t[0]
            if state.global_step == 0 and self.key == "indices":
                rec["grads"] = {n: p.grad.detach().clone() for n, p in t.accelerator.unwrap_model(t.model)
                                .named_parameters()}
                rec["first_window"] = list(t._rec_window)
            # LR used by this step, and the samples consumed before this window
            if self.key == "indices":
                rec["lr"].append((t._rec_samples, t.optimizer.param_groups[0]["lr"]))
                t._rec_samples = t.odb_progress.samples

        def on_step_end(self, args, state, control, **kw):
            if self.key == "part1" and state.global_step == 3:
                control.should_save = True
                control.should_training_stop = True
            return control

    def make(out, key, **extra):
        args = TrainingArguments(output_dir=out, num_train_epochs=2,
                                 learning_rate=LR, gradient_accumulation_steps=GA, use_cpu=True, report_to=[],
                                 save_strategy="no", logging_strategy="no", disable_tqdm=True,
                                 lr_scheduler_type="linear", warmup_steps=0.0, optim="sgd", max_grad_norm=0.0,
                                 seed=0, ddp_backend="gloo" if world > 1 else None, **extra)
        ref = [None]
        t = Recording(model=tiny_llama(0), args=args, train_dataset=TinyDataset(N), data_collator=pad_collate,
                      odb_loader_kwargs={"token_budget": BUDGET, "buffer_size": 6, "timeout_s": 60,
                                         **({"sharding": "dealt", "placement": odb.Exchanged()} if exchange else {})},
                      callbacks=[Rec(ref, key)])
        ref[0] = t
        t._rec_pending, t._rec_window, t._rec_samples = [], [], 0
        stream_epoch = type(t).get_train_dataloader

        def wrapped(self_):
            s = stream_epoch(self_)

            class Tap:
                def __iter__(tap):
                    for ms in s:
                        self_._rec_pending.extend(ms.info.indices)
                        rec[key if key != "part2" else "resume_indices"].append(
                            [ms.info.epoch if hasattr(ms.info, "epoch") else 0, list(ms.info.indices)])
                        yield ms
            return Tap()
        t.get_train_dataloader = wrapped.__get__(t)
        return t

    out1 = os.path.join(out_dir, "full")
    t = make(out1, "indices")
    t.train()
    rec["moved"] = t.odb_loader.stats.exchange_received + t.odb_loader.stats.exchange_sent
    rec["progress"] = t.odb_progress.state_dict()
    rec["max_samples"] = t.odb_max_samples
    rec["first_window_global"] = all_indices_gather(rec["first_window"])
    if rank == 0:
        rec["ref_err"] = compare(rec["grads"], reference_grads(rec["first_window_global"]))
    del rec["grads"]
    # checkpoint at optimizer step 3, then resume in a fresh trainer
    out2 = os.path.join(out_dir, "ckpt")
    rec["part1"] = []
    t1 = make(out2, "part1", save_steps=1000)
    t1.train()
    t2 = make(out2, "part2")
    t2.train(resume_from_checkpoint=True)
    rec["resume_progress"] = t2.odb_progress.state_dict()
    return rec


# ------------------------------------------------------------------------- plain DDP / accelerate
def loop(rec, key, epoch_iter, model, unwrapped, optimizer, scheduler, backward, sync_ctx, join_ctx, progress,
         done, stop_after=None, on_stop=None):
    """The training loop shared by the plain and accelerate workers; records what the tests check."""
    pending = []
    while not done():
        with join_ctx():
            for ms in epoch_iter():
                rec[key].append([ms.info.epoch, list(ms.info.indices)])
                pending.extend(ms.info.indices)
                with sync_ctx(ms):
                    backward(model(**ms.batch).loss, ms)
                if ms.sync:
                    if key == "indices" and "grads" not in rec:
                        rec["grads"] = {n: p.grad.detach().clone() for n, p in unwrapped.named_parameters()}
                        rec["first_window"] = list(pending)
                    if key == "indices":
                        rec["lr"].append((rec.setdefault("_before", 0), optimizer.param_groups[0]["lr"]))
                        rec["_before"] = progress.samples
                    pending = []
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
                    if stop_after is not None and progress.optimizer_steps == stop_after:
                        on_stop()
                        return
                    if done():
                        break


def finish(rec, progress, budget):
    rec["progress"] = progress.state_dict()
    rec["max_samples"] = budget
    if "first_window_global" not in rec:
        rec["first_window_global"] = all_indices_gather(rec["first_window"])
    rank, _ = rank_world()
    if rank == 0:
        rec["ref_err"] = compare(rec["grads"], reference_grads(rec["first_window_global"]))
    del rec["grads"]


def run_plain(out_dir: str) -> dict:
    import contextlib

    from torch.nn.parallel import DistributedDataParallel as DDP

    from odb import ODBDataLoader
    from odb.integrations import TrainStream, join_context, sample_scheduler

    rank, world = rank_world()
    rec = {"lr": [], "indices": [], "part1": [], "resume_indices": []}
    budget = 2 * N

    def build():
        net = tiny_llama(0)
        model = DDP(net) if world > 1 else net
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        loader = ODBDataLoader(TinyDataset(N), token_budget=BUDGET, buffer_size=6, timeout_s=60)
        stream = TrainStream(loader, GA, max_samples=budget)
        sched = sample_scheduler(opt, stream.progress, lambda s: max(0.0, 1 - s / budget))
        return net, model, opt, loader, stream, sched

    def run(key, net, model, opt, loader, stream, sched, stop_after=None, on_stop=None):
        epoch_iter = stream.epoch
        def sync_ctx(ms):
            return contextlib.nullcontext() if ms.sync or world == 1 else model.no_sync()
        loop(rec, key, epoch_iter, model, net, opt, sched, lambda loss, ms: (loss * ms.loss_weight).backward(),
             sync_ctx, lambda: join_context(model, loader), stream.progress, lambda: stream.done,
             stop_after, on_stop)

    parts = build()
    run("indices", *parts)
    finish(rec, parts[4].progress, budget)
    parts[3].close()
    ckpt = os.path.join(out_dir, f"plain_rank{rank}.pt")
    p1 = build()
    run("part1", *p1, stop_after=3, on_stop=lambda: torch.save(
        {"model": p1[0].state_dict(), "opt": p1[2].state_dict(), "sched": p1[5].state_dict(),
         "odb": p1[4].state_dict()}, ckpt))
    p1[3].close()
    p2 = build()
    sd = torch.load(ckpt, weights_only=False)
    p2[0].load_state_dict(sd["model"])
    p2[2].load_state_dict(sd["opt"])
    p2[5].load_state_dict(sd["sched"])
    p2[4].load_state_dict(sd["odb"])
    run("resume_indices", *p2)
    rec["resume_progress"] = p2[4].progress.state_dict()
    p2[3].close()
    return rec


def run_accelerate(out_dir: str) -> dict:
    from accelerate import Accelerator

    from odb import ODBDataLoader
    from odb.integrations.accelerate import ODBAccelerate

    rec = {"lr": [], "indices": [], "part1": [], "resume_indices": []}
    budget = 2 * N

    def build():
        acc = Accelerator(cpu=True, gradient_accumulation_steps=GA)
        net = tiny_llama(0)
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        model, opt = acc.prepare(net, opt)
        loader = ODBDataLoader(TinyDataset(N), token_budget=BUDGET, buffer_size=6, timeout_s=60)
        oa = ODBAccelerate(acc, loader, max_samples=budget)
        sched = acc.prepare(oa.scheduler(opt, lambda s: max(0.0, 1 - s / budget)))
        return acc, net, model, opt, loader, oa, sched

    def run(key, acc, net, model, opt, loader, oa, sched, stop_after=None, on_stop=None):
        loop(rec, key, oa.micro_steps, model, acc.unwrap_model(model), opt, sched, oa.backward,
             lambda ms: oa.sync(model, ms), lambda: oa.join(model), oa.progress, lambda: oa.done,
             stop_after, on_stop)

    parts = build()
    run("indices", *parts)
    finish(rec, parts[5].progress, budget)
    parts[4].close()
    ckpt = os.path.join(out_dir, "acc_state")
    p1 = build()
    run("part1", *p1, stop_after=3, on_stop=lambda: p1[0].save_state(ckpt))
    p1[4].close()
    p2 = build()
    p2[0].load_state(ckpt)
    run("resume_indices", *p2)
    rec["resume_progress"] = p2[5].progress.state_dict()
    p2[4].close()
    return rec


def run_lightning(out_dir: str) -> dict:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from odb.integrations.lightning import ODBDataModule, pop_loss_weight

    rank, world = rank_world()
    rec = {"lr": [], "indices": [], "part1": [], "resume_indices": []}
    budget = 2 * N

    class Module(pl.LightningModule):
        def __init__(self, dm, key):
            super().__init__()
            self.net, self.dm, self.key, self.pending, self.before = tiny_llama(0), dm, key, [], 0

        def training_step(self, batch, batch_idx):
            weight, info = pop_loss_weight(batch)
            rec[self.key].append([info.epoch, list(info.indices)])
            self.pending.extend(info.indices)
            return self.net(**batch).loss * weight

        def on_before_optimizer_step(self, optimizer):
            if self.key == "indices":
                if "grads" not in rec:
                    rec["grads"] = {n: p.grad.detach().clone() for n, p in self.net.named_parameters()}
                    rec["first_window"] = list(self.pending)
                    rec["first_window_global"] = all_indices_gather(rec["first_window"])  # inside fit: PG alive
                rec["lr"].append((self.before, optimizer.param_groups[0]["lr"]))
                self.before = self.dm.progress.samples
            self.pending = []

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.net.parameters(), lr=LR)
            sched = self.dm.scheduler(opt, lambda s: max(0.0, 1 - s / budget))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def fit(key, ckpt_dir=None, max_steps=-1, ckpt_path=None):
        dm = ODBDataModule(TinyDataset(N), odb_loader_kwargs={"token_budget": BUDGET, "buffer_size": 6,
                                                              "timeout_s": 60}, max_samples=budget)
        cbs = [ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=3, save_top_k=-1)] if ckpt_dir else []
        trainer = pl.Trainer(accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto",
                             accumulate_grad_batches=GA, max_epochs=10, max_steps=max_steps, logger=False,
                             enable_checkpointing=bool(ckpt_dir), callbacks=cbs, enable_progress_bar=False,
                             enable_model_summary=False, gradient_clip_val=None)
        trainer.fit(Module(dm, key), datamodule=dm, ckpt_path=ckpt_path)
        return dm

    dm = fit("indices")
    finish(rec, dm.progress, budget)
    ckpt_dir = os.path.join(out_dir, "pl_ckpt")
    fit("part1", ckpt_dir=ckpt_dir, max_steps=3)
    names = sorted(os.listdir(ckpt_dir))
    dm2 = fit("resume_indices", ckpt_path=os.path.join(ckpt_dir, names[-1]))
    rec["resume_progress"] = dm2.progress.state_dict()
    return rec


# ------------------------------------------------------------------------------ used by the tests
ROOT = os.path.dirname(HERE)


def run_workers(framework: str, out_dir, nproc: int = 2, timeout_s: int = 150, script: str | None = None) -> list[dict]:
    """Run this file (or `script`, whose ``__main__`` takes the same arguments and ends in `write_record`)
    under torch.distributed.run (gloo, free port); return the per-rank records."""
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.abspath(script or __file__), framework, str(out_dir)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(nproc)]


def counts(records: list[dict], *keys: str) -> Counter:
    c: Counter = Counter()
    for rec in records:
        for key in keys:
            for epoch, idx in rec[key]:
                for i in idx:
                    c[(epoch, i)] += 1
    return c


def check_run(recs: list[dict], n: int, lr0: float, epochs: int = 2) -> None:
    import pytest

    # loss weights: the first optimizer step's gradient is the global per-token mean of its window
    assert len(recs[0]["first_window_global"]) >= 2
    assert recs[0]["ref_err"] < 1e-4, recs[0]["ref_err"]
    # every sample exactly once per epoch, uninterrupted and across a checkpoint/resume
    for keys in (("indices",), ("part1", "resume_indices")):
        c = counts(recs, *keys)
        assert set(c.values()) == {1}, keys
        assert sorted(c) == [(e, i) for e in range(epochs) for i in range(n)], keys
    assert recs[0]["part1"] and recs[0]["resume_indices"]
    # the linear schedule runs on samples: lr_k = lr0 * (1 - samples before step k / budget)
    budget = recs[0]["max_samples"]
    assert budget == epochs * n
    lrs = recs[0]["lr"]
    assert len(lrs) == recs[0]["progress"]["optimizer_steps"]
    assert len({s for s, _ in lrs}) == len(lrs)  # a new sample count at every step
    for before, lr in lrs:
        assert lr == pytest.approx(lr0 * (1 - before / budget), rel=1e-6), (before, lr)
    assert recs[0]["progress"]["samples"] == budget == recs[0]["resume_progress"]["samples"]


def main() -> None:
    framework, out_dir = sys.argv[1], sys.argv[2]
    if "WORLD_SIZE" in os.environ and framework == "plain":
        dist.init_process_group("gloo")
    run = {"hf": run_hf, "hf-exchange": lambda d: run_hf(d, exchange=True), "plain": run_plain,
           "accelerate": run_accelerate, "lightning": run_lightning}[framework]
    rec = run(out_dir)
    rec.pop("_before", None)
    write_record(rec, out_dir)


def write_record(rec: dict, out_dir: str) -> None:
    """Write this rank's record as ``<out_dir>/rank<r>.json`` and tear the process group down."""
    rank, _ = rank_world()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(rec, f)
    # Tear down while the interpreter is alive: a gloo work freed in its worker thread during interpreter
    # finalization needs the GIL and aborts the process (seen under load).
    import gc

    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # SYNC: every rank tears down together
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
