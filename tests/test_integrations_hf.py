"""The HF Trainer adapter (odb.integrations.hf) with the real transformers package."""

from __future__ import annotations

import pytest
import transformers  # noqa: E402,F401  (installed by `make test`; missing fails, never skips)

from _integrations_worker import N, check_run, run_workers  # noqa: E402
from odb.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.adapters


@pytest.mark.slow  # two torchrun ranks importing transformers (about 20 s on 2 cores)
def test_hf_trainer_two_ranks_global_token_mean_sample_schedule_exactly_once_and_resume(tmp_path):
    check_run(run_workers("hf", tmp_path), n=N, lr0=1e-2)


@pytest.mark.slow
def test_hf_trainer_with_the_round_exchange_keeps_the_token_mean_exactly_once_and_resume(tmp_path):
    recs = run_workers("hf-exchange", tmp_path)
    assert sum(r["moved"] for r in recs) > 0  # batches did move between the two ranks
    check_run(recs, n=N, lr0=1e-2)


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
                   odb_loader_kwargs={"token_budget": 64, "timeout_s": 30, "shift_labels": False})
    with pytest.raises(ConfigError, match="labels"):
        t.train()

    class Masked(Unmasked):  # labels[0] = -100: unshifted counts are the shifted loss's, so it trains
        def __getitem__(self, i):
            s = super().__getitem__(i)
            s["labels"][0] = -100
            return s

    t = ODBTrainer(model=tiny_llama(), args=args, train_dataset=Masked(8), data_collator=pad_collate,
                   odb_loader_kwargs={"token_budget": 64, "timeout_s": 30, "shift_labels": False})
    t.train()
    assert t.odb_progress.samples == 8


def _construction_warnings(tmp_path, words, **args):
    """The warnings containing `words` that building an ODBTrainer with these TrainingArguments gives."""
    import warnings

    from _tiny import TinyDataset, tiny_llama
    from transformers import TrainingArguments

    from odb.integrations.hf import ODBTrainer

    targs = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ODBTrainer(model=tiny_llama(), args=targs, train_dataset=TinyDataset(4), odb_loader_kwargs={"token_budget": 32})
    return [str(w.message) for w in caught if words in str(w.message)]


@pytest.mark.parametrize("warmup, warns", [(0, False), (0.1, False), (1, True), (50, True)])
def test_hf_trainer_says_a_whole_warmup_steps_is_read_as_samples(tmp_path, warmup, warns):
    said = _construction_warnings(tmp_path, "read as a number of samples", warmup_steps=warmup)
    assert len(said) == warns, said


@pytest.mark.parametrize("steps, warns", [(0.5, True), (10, False), (-1, False)])
def test_hf_trainer_says_a_logging_share_is_of_the_sample_bound_and_only_for_a_share(tmp_path, steps, warns):
    said = _construction_warnings(tmp_path, "is a share of max_steps", logging_steps=steps)
    assert len(said) == warns, said


def test_hf_trainer_counts_an_encoder_decoders_labels_unshifted_and_a_causal_lms_shifted(tmp_path):
    from _tiny import TinyDataset, tiny_llama
    from transformers import T5Config, T5ForConditionalGeneration, TrainingArguments

    from odb.integrations.hf import ODBTrainer

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                             num_heads=2, decoder_start_token_id=0))
    # an encoder-decoder's loss reads every label: its loader must not drop labels[0] from the counts
    for model, shifted in ((t5, False), (tiny_llama(), True)):
        t = ODBTrainer(model=model, args=args, train_dataset=TinyDataset(4), odb_loader_kwargs={"token_budget": 32})
        t.get_train_dataloader()
        assert t.odb_loader.shift_labels is shifted, type(model).__name__
        t.odb_loader.close()


def _unmasked_trainer(tmp_path, data_collator=None, **args):
    """An ODBTrainer over 24 samples whose labels are their input_ids (a user's tokenized dataset)."""
    from _tiny import TinyDataset, tiny_llama
    from transformers import TrainingArguments

    from odb.integrations.hf import ODBTrainer

    class Unmasked(TinyDataset):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            s["labels"] = s["input_ids"].clone()
            return s
    targs = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], disable_tqdm=True,
                              num_train_epochs=1, logging_steps=1, **args)
    return ODBTrainer(model=tiny_llama(), args=targs, train_dataset=Unmasked(24), data_collator=data_collator,
                      odb_loader_kwargs={"token_budget": 64, "timeout_s": 30, **({"shift_labels": False}
                                                                                  if data_collator else {})})


def test_hf_trainer_after_a_resume_reports_the_throughput_of_the_samples_this_run_trained(tmp_path):
    import torch

    first = _unmasked_trainer(tmp_path, save_strategy="steps", save_steps=2)
    first.train()
    assert first.odb_progress.samples == 24
    saved = torch.load(tmp_path / "checkpoint-2" / "odb_rank0.pt", weights_only=False)["progress"]["samples"]
    assert 0 < saved < 24
    resumed = _unmasked_trainer(tmp_path, save_strategy="no")
    out = resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed.odb_progress.samples == 24  # the checkpoint's samples and the rest of the epoch
    rate, runtime = out.metrics["train_samples_per_second"], out.metrics["train_runtime"]
    assert rate == round((24 - saved) / runtime, 3), (rate, saved, runtime)  # not the checkpoint's samples
    assert resumed.state.log_history[-1]["train_samples_per_second"] == rate


def test_hf_trainer_checks_the_first_label_of_every_row_not_only_the_first_rows(tmp_path):
    from odb.runtime import pad_collate

    rows = []

    def first_row_masked(samples):  # the 2nd batch of each window of 2: row 0 masked, the other rows' labels[0]
        rows.append(len(samples))  # targets; the 1st batch: every row masked (it trains)
        batch = pad_collate(samples)
        batch["labels"][: 1 if len(rows) % 2 == 0 else None, 0] = -100
        return batch
    trainer = _unmasked_trainer(tmp_path, first_row_masked, save_strategy="no", gradient_accumulation_steps=2)
    with pytest.raises(ConfigError, match=r"labels\[:, 0\] != -100"):
        trainer.train()
    assert rows[1] > 1  # the first window's 2nd batch holds a row after the first: refused there
