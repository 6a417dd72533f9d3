"""The HF Trainer adapter (odb.integrations.hf) with the real transformers package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("transformers")

from odb.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.adapters
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))


def run_workers(framework: str, out_dir, nproc: int = 2, timeout_s: int = 150) -> list[dict]:
    """Run tests/_integrations_worker.py under torch.distributed.run (gloo, free port); return per-rank records."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.join(ROOT, "tests", "_integrations_worker.py"), framework, str(out_dir)]
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


@pytest.mark.slow  # two torchrun ranks importing transformers (about 20 s on 2 cores)
def test_hf_trainer_two_ranks_global_token_mean_sample_schedule_exactly_once_and_resume(tmp_path):
    check_run(run_workers("hf", tmp_path), n=36, lr0=1e-2)


def test_hf_trainer_refuses_join_mode(tmp_path):
    from _tiny import TinyDataset, tiny_llama
    from transformers import TrainingArguments

    from odb.integrations.hf import ODBTrainer

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    with pytest.raises(ConfigError, match="join"):
        ODBTrainer(model=tiny_llama(), args=args, train_dataset=TinyDataset(4),
                   odb_loader_kwargs={"token_budget": 32, "mode": "join"})


def test_hf_trainer_rejects_unmasked_first_label_of_a_causal_lm(tmp_path):
    from _tiny import TinyDataset, tiny_llama
    from transformers import TrainingArguments

    from odb.integrations.hf import ODBTrainer
    from odb.runtime import pad_collate

    class Unmasked(TinyDataset):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            s["labels"] = s["input_ids"].clone()
            return s

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
                             disable_tqdm=True, num_train_epochs=1)
    t = ODBTrainer(model=tiny_llama(), args=args, train_dataset=Unmasked(8), data_collator=pad_collate,
                   odb_loader_kwargs={"token_budget": 64, "timeout_s": 30})
    with pytest.raises(ConfigError, match="labels"):
        t.train()
