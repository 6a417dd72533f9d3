"""Hugging Face ``datasets`` through `odb.ODBDataLoader` and `odb.integrations.hf.ODBTrainer`, with the real
package: map-style (``from_dict`` + ``map``, ``set_transform``, ``with_format("torch")``) and iterable
(``to_iterable_dataset`` + ``split_dataset_by_node`` + ``shuffle``: a new order every epoch, because the
loader forwards ``set_epoch``), and the Trainer's progress bar and logged epoch.

The 2-rank Trainer run is this file's ``__main__`` under torch.distributed.run.
"""

from __future__ import annotations

import os
import re
import sys
import warnings

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, HERE)

import datasets  # noqa: E402,F401  (installed by `make test`; missing fails, never skips)

from _integrations_worker import rank_world, run_workers, write_record  # noqa: E402

pytestmark = pytest.mark.adapters

N, BUDGET = 36, 48


def _mapped():
    """``from_dict`` + ``map``: lists of ids, labels built by the map (position 0 masked)."""
    from _tiny_hf import tiny_hf_dataset

    return tiny_hf_dataset(N).map(lambda ex: {"labels": [-100] + ex["input_ids"][1:]})


def _transformed():
    """``set_transform``: text tokenized on access by the tiny tokenizer."""
    from _tiny_hf import tiny_hf_dataset, tiny_tokenizer

    tok = tiny_tokenizer()
    text = datasets.Dataset.from_dict({"text": [" ".join(f"t{i}" for i in ids)
                                                for ids in tiny_hf_dataset(N)["input_ids"]]})

    def tokenize(batch):
        ids = tok(batch["text"])["input_ids"]
        return {"input_ids": ids, "labels": [[-100] + x[1:] for x in ids]}
    text.set_transform(tokenize)
    return text


MAP_STYLE = {"map": _mapped, "set_transform": _transformed, "with_format_torch": lambda: _mapped().with_format("torch")}


def _stream(rank: int, world: int, num_shards: int = 4):
    """``to_iterable_dataset`` + ``shuffle`` + ``split_dataset_by_node``: this rank's shuffled shard, with ids."""
    from _tiny_hf import tiny_hf_dataset
    from datasets.distributed import split_dataset_by_node

    ds = tiny_hf_dataset(N, labels=True, ids=True).to_iterable_dataset(num_shards=num_shards)
    return split_dataset_by_node(ds.shuffle(seed=0, buffer_size=8), rank=rank, world_size=world)


def _epochs(loader, epochs: int) -> list[list[tuple[int, int]]]:
    """Per epoch, the (stream position, id) of every real sample the loader emitted on this rank."""
    import odb

    out = []
    for e in range(epochs):
        loader.set_epoch(e)
        seen = []
        for batch in loader:
            info = odb.pop_step_info(batch)
            if not info.filler:
                seen += list(zip(info.indices, batch["id"].tolist()))
        out.append(seen)
    return out


# ------------------------------------------------------------------------------------ the loader
@pytest.mark.parametrize("kind", sorted(MAP_STYLE))
def test_map_style_dataset_through_the_loader_every_sample_once_and_unchanged(kind):
    import torch

    import odb

    ds = MAP_STYLE[kind]()
    seen = []
    with odb.ODBDataLoader(ds, token_budget=BUDGET, buffer_size=8) as loader:
        for batch in loader:
            info = odb.pop_step_info(batch)
            assert batch["input_ids"].numel() <= BUDGET or len(info.indices) == 1
            for row, i in enumerate(info.indices):
                ids = torch.as_tensor(ds[i]["input_ids"])
                assert torch.equal(batch["input_ids"][row, :len(ids)], ids)
                assert torch.equal(batch["labels"][row, :len(ids)], torch.as_tensor(ds[i]["labels"]))
            seen += info.indices
    assert sorted(seen) == list(range(N))


def test_shuffled_iterable_dataset_gets_its_own_order_of_each_epoch_through_set_epoch():
    import odb

    ds = _stream(0, 1)
    with odb.ODBDataLoader(ds, token_budget=BUDGET, buffer_size=8) as loader:
        got = _epochs(loader, 3)
    orders = []
    for e, seen in enumerate(got):
        ds.set_epoch(e)
        ref = [s["id"] for s in ds]  # the dataset's own order of epoch e
        assert sorted(i for _, i in seen) == list(range(N))  # every sample once
        assert all(ref[pos] == i for pos, i in seen)  # at the stream position the epoch-e order has it
        orders.append(ref)
    assert len({tuple(o) for o in orders}) == 3  # a new order every epoch (set_epoch reached the dataset)


def _two_rank_stream(rank, world):
    import odb

    with odb.ODBDataLoader(_stream(rank, world), token_budget=BUDGET, buffer_size=6, timeout_s=30) as loader:
        got = _epochs(loader, 2)
        return got, loader.stats.fillers


@pytest.mark.slow  # two forked gloo ranks
def test_split_dataset_by_node_two_ranks_every_sample_once_per_epoch_and_a_new_order_each_epoch(tmp_path):
    from mp_harness import run_ranks

    out = run_ranks(_two_rank_stream, 2, tmp_path, timeout_s=90)
    assert [o.status for o in out] == ["ok", "ok"], [o.error for o in out]
    for e in range(2):
        ids = [i for o in out for _, i in o.value[0][e]]
        assert sorted(ids) == list(range(N)), e
    for r, o in enumerate(out):
        ds = _stream(r, 2)
        for e in range(2):
            ds.set_epoch(e)
            ref = [s["id"] for s in ds]
            assert all(ref[pos] == i for pos, i in o.value[0][e]), (r, e)
    assert [i for _, i in out[0].value[0][0]] != [i for _, i in out[0].value[0][1]]


# ----------------------------------------------------------------------------------- the Trainer
def _args(out: str, world: int, **extra):
    from transformers import TrainingArguments

    kw = dict(output_dir=out, num_train_epochs=2, learning_rate=1e-2, gradient_accumulation_steps=2, use_cpu=True,
              report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, optim="sgd", seed=0,
              ddp_backend="gloo" if world > 1 else None)
    kw.update(extra)
    return TrainingArguments(**kw)


def _trainer_run(key: str, rec: dict, out: str, train_dataset, **kw):
    """One ODBTrainer run over `train_dataset`; records the micro-steps (ids popped from the batch when the
    dataset has them), the logged epochs beside the samples, and the progress bar at the end (rank 0)."""
    from _tiny import tiny_llama
    from transformers import TrainerCallback

    from odb.integrations.hf import ODBTrainer
    from odb.runtime import pad_collate

    rank, world = rank_world()
    r = rec[key] = {"steps": [], "logs": []}
    args = _args(out, world, **kw.pop("args", {}))

    class Recording(ODBTrainer):
        def get_train_dataloader(self):
            stream = super().get_train_dataloader()

            class Tap:
                def __iter__(tap):
                    for ms in stream:
                        ids = ms.batch.pop("id").tolist() if "id" in ms.batch else list(ms.info.indices)
                        r["steps"].append([ms.info.epoch, [] if ms.info.filler else ids])
                        yield ms
            return Tap()

    class Rec(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **k):
            if "epoch" in (logs or {}):
                r["logs"].append([logs["epoch"], trainer.odb_progress.samples, "loss" in logs])

        def on_train_end(self, args, state, control, **k):  # runs before the bar is closed
            from odb.integrations.hf import _SampleProgress

            bars = [c for c in trainer.callback_handler.callbacks if isinstance(c, _SampleProgress)]
            if bars and bars[0].training_bar is not None:
                r["bar"] = [bars[0].training_bar.n, bars[0].training_bar.total]

    trainer = Recording(model=tiny_llama(0), args=args, train_dataset=train_dataset, data_collator=pad_collate,
                        odb_loader_kwargs={"token_budget": BUDGET, "buffer_size": 6, "timeout_s": 60},
                        callbacks=[Rec()], **kw)
    out_metrics = trainer.train()
    r["epoch"] = out_metrics.metrics.get("epoch")
    r["progress"] = trainer.odb_progress.state_dict()
    r["max_steps"] = trainer.args.max_steps
    return trainer


def _worker(out_dir: str) -> dict:
    rank, world = rank_world()
    rec: dict = {}
    tqdm_on = {"disable_tqdm": False}
    _trainer_run("with_format_torch", rec, os.path.join(out_dir, "a"), MAP_STYLE["with_format_torch"](), args=tqdm_on)
    _trainer_run("set_transform", rec, os.path.join(out_dir, "b"), _transformed(), args={"num_train_epochs": 1})
    _trainer_run("stream_budget", rec, os.path.join(out_dir, "c"), _stream(rank, world), max_samples=2 * N,
                 args=tqdm_on)
    _trainer_run("stream_epochs", rec, os.path.join(out_dir, "d"), _stream(rank, world),
                 args={"lr_scheduler_type": "constant", **tqdm_on})
    return rec


def _once_per_epoch(recs, key, epochs):
    for e in range(epochs):
        ids = sorted(i for rec in recs for ep, idx in rec[key]["steps"] if ep == e for i in idx)
        assert ids == list(range(N)), (key, e)


@pytest.mark.slow  # two torchrun ranks importing transformers, four short trainings (about 15 s on 2 cores)
def test_odb_trainer_two_ranks_map_style_and_iterable_datasets_exactly_once_progress_and_epoch(tmp_path):
    recs = run_workers("datasets", tmp_path, script=__file__, timeout_s=240)
    r0 = recs[0]
    for key, epochs in (("with_format_torch", 2), ("set_transform", 1), ("stream_budget", 2), ("stream_epochs", 2)):
        _once_per_epoch(recs, key, epochs)
        assert r0[key]["progress"]["samples"] == epochs * N and r0[key]["epoch"] == pytest.approx(epochs), key
    assert r0["stream_epochs"]["progress"]["epoch"] == 2  # whole passes: the stream's end stopped the run
    # an IterableDataset needs no max_steps: the budget (or the passes) ends the run; a new order each epoch
    for key in ("stream_budget", "stream_epochs"):
        orders = [[i for ep, idx in recs[0][key]["steps"] if ep == e for i in idx] for e in range(2)]
        assert orders[0] != orders[1], key
    assert r0["stream_budget"]["max_steps"] == 2 * N and r0["stream_epochs"]["max_steps"] == 2 ** 62
    # the progress bar ends at its total (samples), and the logged epoch is samples / len (or passes)
    assert r0["with_format_torch"]["bar"] == [2 * N, 2 * N]
    assert r0["stream_budget"]["bar"] == [2 * N, 2 * N]
    assert r0["stream_epochs"]["bar"] == [2 * N, None]
    for key in ("with_format_torch", "set_transform"):
        logs = [(e, s) for e, s, is_step in r0[key]["logs"] if is_step]
        assert logs and all(e == pytest.approx(s / N) for e, s in logs), (key, logs)
    for key in ("stream_budget", "stream_epochs"):  # a stream: passes completed, then samples / one pass
        logs = [(e, s) for e, s, is_step in r0[key]["logs"] if is_step]
        assert all(e == (0.0 if s <= N else pytest.approx(s / N)) for e, s in logs), (key, logs)


def test_odb_trainer_progress_bar_counts_samples_and_the_log_shows_the_epoch(tmp_path, capsys):
    """One rank, in process: what the user sees on the terminal (the Trainer's bar ended at 24/128 and
    logged epoch 0.1875 after a full 2-epoch run before)."""
    rec: dict = {}
    _trainer_run("one", rec, str(tmp_path), _mapped(), args={"disable_tqdm": False})
    err = capsys.readouterr().err
    bars = re.findall(r"(\d+)/(\d+) \[", err)
    assert bars and bars[-1] == (str(2 * N), str(2 * N)), err[-2000:]
    assert rec["one"]["epoch"] == pytest.approx(2.0)
    epochs = [e for e, _, is_step in rec["one"]["logs"] if is_step]
    assert epochs[-1] == pytest.approx(2.0) and epochs == sorted(epochs)


def test_odb_trainer_iterable_dataset_without_a_budget_refuses_a_schedule_that_needs_one(tmp_path):
    from _tiny import tiny_llama

    from odb.errors import ConfigError
    from odb.integrations.hf import ODBTrainer

    for extra, match in (({}, "lr_scheduler_type"), ({"lr_scheduler_type": "constant", "num_train_epochs": 1.5},
                                                      "whole number of epochs"),
                         # a warmup given as a share needs the horizon a stream does not tell
                         ({"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 0.1}, "lr_scheduler_type")):
        with pytest.raises(ConfigError, match=match):
            ODBTrainer(model=tiny_llama(0), args=_args(str(tmp_path), 1, **extra), train_dataset=_stream(0, 1),
                       odb_loader_kwargs={"token_budget": BUDGET})
    for extra in ({"lr_scheduler_type": "constant"}, {"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 5},
                  {"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 0}):  # no horizon needed
        with pytest.warns(UserWarning) if extra.get("warmup_steps") else warnings.catch_warnings():
            t = ODBTrainer(model=tiny_llama(0), args=_args(str(tmp_path), 1, **extra), train_dataset=_stream(0, 1),
                           odb_loader_kwargs={"token_budget": BUDGET})
        assert t.args.max_steps == 2 ** 62  # the stream's passes end the run


if __name__ == "__main__":
    write_record(_worker(sys.argv[2]), sys.argv[2])
