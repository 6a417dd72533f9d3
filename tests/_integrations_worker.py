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
    return 0, 1


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
def run_hf(out_dir: str) -> dict:
    from transformers import TrainerCallback, TrainingArguments

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
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=1, num_train_epochs=2,
                                 learning_rate=LR, gradient_accumulation_steps=GA, use_cpu=True, report_to=[],
                                 save_strategy="no", logging_strategy="no", disable_tqdm=True,
                                 lr_scheduler_type="linear", warmup_steps=0.0, optim="sgd", max_grad_norm=0.0,
                                 seed=0, ddp_backend="gloo" if world > 1 else None, **extra)
        ref = [None]
        t = Recording(model=tiny_llama(0), args=args, train_dataset=TinyDataset(N), data_collator=pad_collate,
                      odb_loader_kwargs={"token_budget": BUDGET, "buffer_size": 6, "timeout_s": 60},
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


def main() -> None:
    framework, out_dir = sys.argv[1], sys.argv[2]
    if "WORLD_SIZE" in os.environ and framework in ("plain",):
        dist.init_process_group("gloo")
    rec = {"hf": run_hf}[framework](out_dir)
    rank, _ = rank_world()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(rec, f)


if __name__ == "__main__":
    main()
