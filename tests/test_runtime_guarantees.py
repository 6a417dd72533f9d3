"""Every guarantee on the default path (issue 12): no silent loss, no silent no-op, loud divergence.

World size 1 here (in-process, seconds); the multi-rank cases are in `test_runtime_replicas.py`.
Each test names the defect it pins.
"""

import os
import signal
import threading
import time

import pytest
import torch

import odb
from mp_harness import Samples, id_collate, make_lengths
from odb.runtime.source import count_labels, default_length

LENGTHS = make_lengths(40, seed=4, lo=2, hi=30)


class Plain(torch.utils.data.Dataset):
    """Samples built by `make(i)`: the layouts users hand the loader."""

    def __init__(self, n, make):
        self.n, self.make = n, make

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.make(i)


def batches(loader):
    out = []
    for batch in loader:
        info = odb.pop_step_info(batch)
        out.append((batch, info))
    return out


# -- labels: never a silent zero -----------------------------------------------------------------------
@pytest.mark.parametrize("shift", [False, True])
def test_samples_without_labels_count_the_label_tokens_pad_collate_builds(shift):
    # defect: no 'labels' -> pad_collate trains on input_ids, the loader counted 0 -> loss_scale 0 everywhere
    ds = Plain(30, lambda i: {"input_ids": list(range(1, 3 + i % 7))})
    with odb.ODBDataLoader(ds, 64, buffer_size=8, shift_labels=shift) as loader:
        got = batches(loader)
    assert got and all(info.loss_scale > 0 for _, info in got)
    for batch, info in got:
        labels = batch["labels"][:, 1:] if shift else batch["labels"]
        assert int((labels != -100).sum()) == info.local_label_tokens > 0


def test_labels_all_masked_raise_on_every_rank_instead_of_training_with_zero_weights():
    # defect: every loss_scale 0, the model never changes, no warning
    ds = Plain(100, lambda i: {"input_ids": [1] * 5, "labels": [-100] * 5})
    with odb.ODBDataLoader(ds, 64, buffer_size=8) as loader:
        with pytest.raises(odb.SampleError, match="not one label token"):
            batches(loader)
    ds_small = Plain(10, lambda i: {"input_ids": [1] * 5, "labels": [-100] * 5})  # an epoch under 64 samples
    with odb.ODBDataLoader(ds_small, 64, buffer_size=4) as loader:
        with pytest.raises(odb.SampleError, match="not one label token"):
            batches(loader)


def test_a_step_without_label_tokens_gets_zero_weight_and_is_counted():
    # one sample of 40 is prompt-only (every label masked): its step, if alone, weighs 0 and is counted
    def make(i):
        return {"input_ids": [1] * 40, "labels": [-100] * 40} if i == 0 else {"input_ids": [1] * 40}
    with odb.ODBDataLoader(Plain(40, make), 40, buffer_size=4, shuffle=False) as loader:
        got = batches(loader)
    zero = [info for _, info in got if info.global_label_tokens == 0]
    assert len(zero) == 1 and zero[0].loss_scale == 0.0 and list(zero[0].indices) == [0]
    assert loader.stats.zero_label_steps == 1


def test_count_labels_shift_counts_the_targets_after_the_first_position():
    # defect class: shift counting labels[:-1] instead of labels[1:]
    assert count_labels({"labels": [5, -100]}, shift=True) == 0
    assert count_labels({"labels": [-100, 5]}, shift=True) == 1
    assert count_labels({"labels": [5, -100]}, shift=False) == 1
    assert count_labels({"input_ids": [3, 4, 5]}, shift=True) == 2  # no labels: the ids are the targets


# -- lengths: measured from 1-D data, or a SampleError naming the index ----------------------------------------
@pytest.mark.parametrize("ids, what", [(torch.ones(1, 50, dtype=torch.long), "shape"),
                                       ([[1] * 50], "nested"), ("hello", "str")])
def test_input_ids_that_are_not_one_dimensional_raise_with_the_index(ids, what):
    # defect: a [1, n] tensor (tokenizer(..., return_tensors="pt")) measured as 1 token; 3200 tokens vs 512
    ds = Plain(4, lambda i: {"input_ids": ids, "id": [i]})
    with odb.ODBDataLoader(ds, 512, buffer_size=4, shuffle=False) as loader:
        with pytest.raises(odb.SampleError, match=r"index 0 failed in measuring its length"):
            batches(loader)


@pytest.mark.parametrize("length, ok", [("12", False), (torch.tensor(12.7), False), (True, False), (12.0, False),
                                        (torch.tensor(12), True), ((12, 3), True), ([12], True)])
def test_a_length_fn_must_return_ints(length, ok):
    # defect: "12" became sizes (1, 2); a 0-d float tensor was truncated
    ds = Plain(3, lambda i: {"input_ids": [1] * 12})
    loader = odb.ODBDataLoader(ds, 512, buffer_size=4, length_fn=lambda s: length)
    with loader:
        if ok:
            assert sum(info.local_samples for _, info in batches(loader)) == 3
        else:
            with pytest.raises(odb.SampleError, match="length must be an int"):
                batches(loader)


def test_default_length_reads_one_dimensional_tensors_and_arrays():
    import numpy as np

    assert default_length({"input_ids": torch.arange(7)}) == 7
    assert default_length({"input_ids": np.arange(5)}) == 5
    assert default_length({"input_ids": (1, 2)}) == 2


# -- fillers never exceed the budget ---------------------------------------------------------------------------
def test_filler_sample_over_the_budget_is_refused_at_construction():
    with pytest.raises(odb.ConfigError, match="filler_sample has sizes"):
        odb.ODBDataLoader(Samples([5] * 4), 100, id_collate, filler_sample={"input_ids": [1] * 2000})


def test_a_rank_that_saw_no_sample_within_budget_builds_fillers_from_one_that_fits_or_a_cut_one():
    from odb.runtime.epoch_pass import filler_template

    ds = Samples([2000, 3000, 10, 20])
    loader = odb.ODBDataLoader(ds, 512, id_collate, buffer_size=4)
    assert len(filler_template(loader, [0, 1, 2, 3])(None)["input_ids"]) == 10
    # defect (issue 49): only over-budget samples -> "no sample to build a PAD filler batch"; now the
    # cheapest one is cut to the budget, every label ignored
    cut = filler_template(loader, [0, 1])(None)
    assert len(cut["input_ids"]) == 512 and loader.fits(cut)
    cut = filler_template(loader, [0, 1])({"input_ids": list(range(700)), "labels": list(range(700))})
    assert len(cut["input_ids"]) == 512 and cut["labels"] == [-100] * 512
    loader.close()
    images = Plain(2, lambda i: {"input_ids": [1] * 700, "pixel_values": torch.zeros(4, 3)})
    with odb.ODBDataLoader(images, 512, id_collate, buffer_size=4) as loader:
        with pytest.raises(odb.SampleError, match="cannot be cut.*filler_sample=.*mode='join'"):
            filler_template(loader, [0, 1])(images[0])
    with odb.ODBDataLoader(images, 512, id_collate, buffer_size=4, placement=odb.Exchanged()) as loader:
        with pytest.raises(odb.SampleError, match=r"filler_sample=<[^>]*>$"):  # join would be refused: not named
            filler_template(loader, [0, 1])(images[0])


# -- epochs and passes --------------------------------------------------------------------------------------------
def test_set_epoch_while_a_pass_is_open_is_refused_and_cannot_corrupt_the_next_epoch():
    # defect: set_epoch after a break with the iterator still held: 55 of 60 samples emitted next epoch
    loader = odb.ODBDataLoader(Samples(make_lengths(60, 9, 2, 20)), 64, id_collate, buffer_size=8)
    it = iter(loader)
    next(it)
    with pytest.raises(odb.ConfigError, match="while a pass over epoch 0 is open"):
        loader.set_epoch(1)
    loader.set_epoch(0)  # the same epoch is no change
    it.close()
    loader.set_epoch(1)
    seen = sorted(i for _, info in batches(loader) for i in info.indices)
    assert seen == list(range(60))
    loader.close()


def test_a_closed_loaders_iterator_raises_a_clear_error():
    # defect: stale batches, then ProtocolError ("always a bug in ODB")
    loader = odb.ODBDataLoader(Samples(make_lengths(60, 9, 2, 20)), 64, id_collate, buffer_size=8)
    it = iter(loader)
    next(it)
    loader.close()
    with pytest.raises(odb.ConfigError, match="was closed"):
        next(it)
    with pytest.raises(odb.ConfigError, match="closed"):
        iter(loader)


def test_resuming_from_a_completed_pass_starts_the_epoch_again():
    # defect class: load_state_dict dropping the complete flag (the resumed loader emitted nothing)
    with odb.ODBDataLoader(Samples(LENGTHS), 64, id_collate, buffer_size=8) as a:
        batches(a)
        state = a.state_dict()
    assert state["rank_0"]["complete"] is True
    with odb.ODBDataLoader(Samples(LENGTHS), 64, id_collate, buffer_size=8) as b:
        b.load_state_dict(state)
        assert sorted(i for _, info in batches(b) for i in info.indices) == list(range(len(LENGTHS)))


@pytest.mark.parametrize("change, msg", [
    ({"done": [[30, 50]]}, r"done\[0\] = \[30, 50\]"),          # past the end (40 positions): skipped silently
    ({"done": [[5, 3]]}, r"done\[0\]"),                           # reversed
    ({"done": [[-2, 3]]}, r"done\[0\]"),                          # negative
    ({"done": [[0, 4], [2, 6]]}, r"done\[1\]"),                   # overlapping
    ({"done": [[0, "4"]]}, r"done\[0\]"),                         # malformed entry (was a raw ValueError)
    ({"done": [[0]]}, r"done\[0\]"),
    ({"done": "0-4"}, "list of"),
    ({"complete": "no"}, "complete='no'"),                        # was read as True
    ({"num_positions": "40"}, "num_positions"),
])
def test_load_state_dict_validates_every_field(change, msg):
    with odb.ODBDataLoader(Samples(LENGTHS), 64, id_collate, buffer_size=8) as loader:
        it = iter(loader)
        next(it)
        it.close()
        state = loader.state_dict()
        state["rank_0"] = {**state["rank_0"], **change}
        with pytest.raises(odb.ConfigError, match=msg):
            loader.load_state_dict(state)
        state = loader.state_dict()
        with pytest.raises(odb.ConfigError, match="epoch"):
            loader.load_state_dict({**state, "epoch": "1"})


@pytest.mark.parametrize("kwargs, msg", [({"buffer_size": True}, "buffer_size"), ({"num_workers": True}, "num_workers"),
                                         ({"timeout_s": True}, "timeout_s"), ({"seed": 1.5}, "seed")])
def test_bool_and_float_settings_are_refused(kwargs, msg):
    with pytest.raises(odb.ConfigError, match=msg):
        odb.ODBDataLoader(Samples(LENGTHS), 64, id_collate, **kwargs)


def test_the_default_timeout_survives_a_long_save_on_one_rank():
    # peer slow (a consumer pausing to save a checkpoint) is waited for as long as torch.distributed's own
    # default collective timeout; a dead peer is seen by the transport within seconds (test_runtime_replicas)
    import inspect

    from torch.distributed.constants import default_pg_timeout

    default = inspect.signature(odb.ODBDataLoader).parameters["timeout_s"].default
    assert default >= default_pg_timeout.total_seconds() >= 1800


# -- errors reach the consumer at once ---------------------------------------------------------------------------
class Dies(torch.utils.data.Dataset):
    """Sample `at` kills its worker process (``how``: "exit" or "segv")."""

    def __init__(self, n, at, how):
        self.n, self.at, self.how = n, at, how

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.at and torch.utils.data.get_worker_info() is not None:
            if self.how == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            os._exit(3)
        return {"input_ids": [1] * 5, "id": [i]}


@pytest.mark.parametrize("how", ["exit", "segv"])
def test_a_dead_worker_is_seen_at_once_not_after_timeout_s(how):
    # defect: the SIGCHLD error was swallowed as queue.Empty and the engine waited timeout_s (300 s)
    loader = odb.ODBDataLoader(Dies(200, 37, how), 64, id_collate, buffer_size=8, num_workers=2, shuffle=False,
                               timeout_s=120)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        batches(loader)
    assert time.monotonic() - t0 < 30
    t1 = time.monotonic()
    loader.close()
    assert time.monotonic() - t1 < 30  # the engine left its fetch and posted (no 120 s wait)


class SlowSamples(torch.utils.data.Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        time.sleep(0.05)
        return {"input_ids": [1] * 5, "id": [i]}


class Preempted(Exception):
    pass


def test_a_signal_handlers_exception_reaches_the_training_loop():
    # defect: a handler raising on SIGUSR1 (preemption) was discarded and the epoch trained on
    def handler(signum, frame):
        raise Preempted()
    import gc

    gc.collect()  # finalize earlier tests' loaders now: a handler's exception raised inside a __del__ is lost
    old = signal.signal(signal.SIGUSR1, handler)
    loader = odb.ODBDataLoader(SlowSamples(), 64, id_collate, buffer_size=16)
    try:
        with pytest.raises(Preempted):
            for k, _ in enumerate(loader):
                if k == 0:  # the signal arrives while the loop runs (mostly while it waits on the loader)
                    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    finally:
        signal.signal(signal.SIGUSR1, old)
        loader.close()


def test_a_signal_handlers_exception_inside_collate_is_not_reported_as_a_collate_error():
    # torch's dead-worker error comes from its SIGCHLD handler wherever the main thread is, often in
    # collate_fn: it must not become "collate_fn raised ... on dataset indices [...]"
    def handler(signum, frame):
        raise Preempted()

    def collate(samples):
        os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs inside collate_fn
        return id_collate(samples)
    old = signal.signal(signal.SIGUSR1, handler)
    try:
        with odb.ODBDataLoader(Samples(LENGTHS), 64, collate, buffer_size=8) as loader:
            with pytest.raises(Preempted):
                batches(loader)
    finally:
        signal.signal(signal.SIGUSR1, old)


class FailingSummary(odb.batching.BalancedPolicy):
    """Summarizes two rounds, then raises (a custom policy's bug)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def summarize(self, window, cost, exhausted):
        self.calls += 1
        if self.calls == 3:
            raise ZeroDivisionError("injected summary bug")
        return super().summarize(window, cost, exhausted)


def test_a_summarize_failure_is_posted_as_the_rank_status_and_the_trace_conforms(tmp_path):
    # defect: a neutral summary was posted with st = 0; every rank raised "use the same alignment policy"
    from proofs.conformance import check_dir

    loader = odb.ODBDataLoader(Samples(LENGTHS), 64, id_collate, buffer_size=4, policy=FailingSummary(),
                               trace_dir=str(tmp_path))
    with pytest.raises(odb.ProtocolError, match="failed to summarize"):
        batches(loader)
    loader.close()
    (rep,) = check_dir(str(tmp_path))
    assert rep.ok, rep.problems
    assert rep.aborted and rep.rows["return_abort"] == 1 and rep.local_errors


def test_weighted_loss_is_finite_and_keeps_the_graph_when_a_batch_has_no_label_token():
    # defect: the README's recipe `loss * info.loss_scale` is NaN when the rank's batch has no label token
    from odb.integrations import weighted_loss

    lin = torch.nn.Linear(4, 5)
    x, y = torch.randn(3, 4), torch.full((3,), -100)
    logits = lin(x)
    per_token = torch.nn.functional.cross_entropy(logits, y, reduction="sum") / (y != -100).sum()  # 0 / 0
    naive = per_token * 0.0
    assert torch.isnan(naive)  # what the recipe logged (its gradients happen to be 0 for cross entropy)
    safe = weighted_loss({"loss": per_token, "logits": logits}, 0.0)
    safe.backward()
    assert safe.item() == 0.0 and lin.weight.grad is not None and torch.all(lin.weight.grad == 0)
    out = {"loss": torch.tensor(2.0), "logits": logits}
    assert weighted_loss(out, 0.5).item() == 1.0 and weighted_loss((torch.tensor(2.0), logits), 0.5).item() == 1.0


class HangsAt(torch.utils.data.Dataset):
    def __init__(self, n, at):
        self.n, self.at = n, at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.at:
            time.sleep(60)
        return {"input_ids": [1] * 4, "id": [i]}


def test_closing_while_the_engine_waits_on_a_hung_worker_returns_at_once():
    # the engine's fetch gives up as soon as the rank must stop (it does not wait out timeout_s)
    loader = odb.ODBDataLoader(HangsAt(100, 20), 64, id_collate, buffer_size=4, num_workers=1, shuffle=False,
                               timeout_s=120)
    it = iter(loader)
    while max(odb.pop_step_info(next(it)).indices) < 12:
        pass  # the engine runs at most about 3 windows ahead of the consumer: bring it to index 20
    time.sleep(0.5)  # the engine reaches index 20 and waits on the hung worker
    t0 = time.monotonic()
    it.close()
    loader.close()
    assert time.monotonic() - t0 < 15


def test_the_header_carries_the_status_the_row_posted_not_a_later_one():
    # the posted st is the table's payload (in.quit as the row read it); a stop arriving after the row
    # fired is posted in the next round's header, so the trace and the header agree
    from odb.batching import default_policy, make_cost_model
    from odb.core import Replicated, Shared
    from odb.core.header import header_layout
    from odb.core.info import LoaderStats
    from odb.core.rank import RankCore
    from odb.core.types import CLOSED

    class Listed:  # a data source of four samples
        def __init__(self):
            self.items, self.pulled, self.dry = [(p, p, {"input_ids": [1] * 3}, ((3,), 3)) for p in range(4)], 0, False
            self.reserve_taken = 0

        def next(self):
            if self.pulled == len(self.items):
                return None
            self.pulled += 1
            return self.items[self.pulled - 1]

    lay = header_layout(default_policy().summary_len, 8)
    shared = Shared(protocol="p", window=8, mode="pad", sharding="fixed", header_len=lay.length, policy="p",
                    cost="c", loss_basis="label_tokens", shift_labels=False, order="own")
    core = RankCore(rank=0, world_size=1, mode=0, policy=default_policy(), cost=make_cost_model("padded", 64),
                    replica=Replicated(shared, world_size=1, aheads=(0,), policy=default_policy(), order=None, epoch=0),
                    layout=lay, source=Listed(), oversize="alone", loss_slot=1, stats=LoaderStats(),
                    template=lambda _fallback: None)
    read_at_post = []

    def status():  # the consumer stops right after the post row read quit = 0
        if read_at_post:
            return CLOSED
        if core.local["exhausted"]:  # the source is exhausted: this read is the post row's payload
            read_at_post.append(1)
        return 0
    out = core.step(status)
    while out.post is None:
        out = core.step(status)
    assert out.step.payload["st"] == 0 and lay.decode(out.post.header).st == 0


@pytest.mark.parametrize("window", [2, 3, 4])
def test_join_mode_emits_every_sample_whatever_the_last_window_holds(window):
    # the rank's iterator ends only when its window is empty and its source exhausted: a last window
    # of one sample (n mod W == 1 after carries) must still be emitted
    for n in range(1, 14):
        with odb.ODBDataLoader(Samples(make_lengths(n, n, 2, 30)), 64, id_collate, buffer_size=window,
                               mode="join") as loader:
            got = sorted(i for _, info in batches(loader) for i in info.indices)
        assert got == list(range(n)), (window, n, got)
