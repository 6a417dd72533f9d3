"""ODBDataLoader at world size 1 (no process group): contracts, bad input, resume, lifecycle."""

import threading
import warnings

import pytest
import torch

import odb
from mp_harness import Samples, Stream, id_collate, list_collate, make_lengths
from odb.runtime import pad_collate
from proofs.conformance import assert_conformant

LENGTHS = make_lengths(50, seed=3, lo=2)


def ids_of(loader):
    out = []
    for batch in loader:
        info = odb.pop_step_info(batch)
        assert batch["id"][:, 0].tolist() == list(info.indices)
        out.append(info)
    return out


def odb_threads():
    return [t for t in threading.enumerate() if t.name.startswith("odb-engine")]


def test_every_sample_is_emitted_once_and_the_trace_conforms(tmp_path):
    loader = odb.ODBDataLoader(Samples(LENGTHS), 128, id_collate, buffer_size=8, trace_dir=str(tmp_path))
    infos = ids_of(loader)
    seen = [i for info in infos for i in info.indices]
    assert sorted(seen) == list(range(50))
    assert all(info.loss_scale == 1.0 and not info.filler for info in infos)
    assert loader.stats.samples == 50 and loader.stats.steps == len(infos) and loader.stats.rounds >= 7
    assert loader.stats.real_tokens == sum(LENGTHS) <= loader.stats.padded_tokens
    rows = assert_conformant(str(tmp_path))
    assert {"take_sample", "see_exhausted", "post_header", "return_go", "emit_group", "end_round",
            "return_stop"} <= set(rows)
    loader.close()
    assert not odb_threads()


def test_batches_respect_the_budget_and_oversize_samples_go_alone():
    lengths = [10, 200, 30, 40, 5, 300]
    with odb.ODBDataLoader(Samples(lengths), 100, id_collate, buffer_size=4, shuffle=False) as loader:
        infos = ids_of(loader)
    for info in infos:
        sizes = [lengths[i] for i in info.indices]
        assert len(sizes) * max(sizes) <= 100 or len(sizes) == 1
    assert sorted(i for info in infos for i in info.indices) == list(range(6))
    assert loader.stats.oversize == 2 and loader.stats.oversize_skipped == 0


def test_oversize_skip_is_counted_and_error_names_the_index():
    lengths = [10, 200, 30]
    with odb.ODBDataLoader(Samples(lengths), 100, id_collate, buffer_size=4, oversize="skip") as loader:
        seen = sorted(i for info in ids_of(loader) for i in info.indices)
    assert seen == [0, 2] and loader.stats.oversize_skipped == 1 and loader.stats.oversize == 1
    with odb.ODBDataLoader(Samples(lengths), 100, id_collate, buffer_size=4, oversize="error",
                           shuffle=False) as loader:
        with pytest.raises(odb.SampleError, match="index 1 has sizes"):
            ids_of(loader)


def test_dropped_and_empty_samples_are_counted_never_silent():
    lengths = list(LENGTHS)
    lengths[4] = 0
    with odb.ODBDataLoader(Samples(lengths, drop={2, 9}), 128, id_collate, buffer_size=8) as loader:
        seen = sorted(i for info in ids_of(loader) for i in info.indices)
    assert seen == sorted(set(range(50)) - {2, 4, 9})
    assert loader.stats.dropped == 2 and loader.stats.empty == 1


def test_a_sample_without_a_length_raises_with_its_index():
    with odb.ODBDataLoader(Samples(LENGTHS, no_len={5}), 128, id_collate, buffer_size=8) as loader:
        with pytest.raises(odb.SampleError, match=r"index 5 failed in measuring its length.*input_ids"):
            ids_of(loader)
    assert not odb_threads()


def test_an_exception_in_getitem_raises_with_its_index_from_a_worker():
    with odb.ODBDataLoader(Samples(LENGTHS, raise_at={11}), 128, id_collate, buffer_size=8,
                           num_workers=1) as loader:
        with pytest.raises(odb.SampleError, match=r"index 11 failed in preprocessing.*injected failure at 11"):
            ids_of(loader)


class _HangsAt(Samples):
    """A worker that hangs (alive, never answers) on one index."""

    def __init__(self, lengths, hang_at):
        super().__init__(lengths)
        self.hang_at = hang_at

    def __getitem__(self, i):
        if i == self.hang_at:
            import time

            time.sleep(3600)
        return super().__getitem__(i)


def test_a_hung_worker_fails_the_rank_within_timeout_s():
    import time

    t0 = time.monotonic()
    with odb.ODBDataLoader(_HangsAt(LENGTHS, 5), 128, id_collate, buffer_size=8, num_workers=1, shuffle=False,
                           timeout_s=2) as loader:
        with pytest.raises(odb.SampleError, match=r"no preprocessed sample arrived within timeout_s=2 s"):
            ids_of(loader)
    assert time.monotonic() - t0 < 30


def test_collate_errors_and_non_mapping_batches_name_the_indices():
    def bad(samples):
        raise KeyError("boom")

    with odb.ODBDataLoader(Samples(LENGTHS), 128, bad, buffer_size=8) as loader:
        with pytest.raises(odb.SampleError, match=r"collate_fn raised KeyError.*dataset indices \["):
            next(iter(loader))
    with odb.ODBDataLoader(Samples(LENGTHS), 128, list_collate, buffer_size=8) as loader:
        with pytest.raises(odb.SampleError, match="returned list"):
            next(iter(loader))
    assert not odb_threads()


def test_empty_dataset_yields_nothing():
    with odb.ODBDataLoader(Samples([]), 128, id_collate, buffer_size=8) as loader:
        assert ids_of(loader) == []
        assert loader.stats.rounds == 1


def test_iterable_dataset_with_two_workers_emits_every_sample_once():
    ds = Stream(LENGTHS, range(50))
    with odb.ODBDataLoader(ds, 128, id_collate, buffer_size=8, num_workers=2,
                           dataloader={"multiprocessing_context": "fork"}) as loader:
        got = []
        for batch in loader:
            odb.pop_step_info(batch)
            got += batch["id"][:, 0].tolist()
    assert sorted(got) == list(range(50))


def test_persistent_workers_serve_two_epochs_with_different_orders():
    with odb.ODBDataLoader(Samples(LENGTHS), 128, id_collate, buffer_size=8, num_workers=1,
                           dataloader={"persistent_workers": True}) as loader:
        a = [i for info in ids_of(loader) for i in info.indices]
        loader.set_epoch(1)
        b = [i for info in ids_of(loader) for i in info.indices]
    assert sorted(a) == sorted(b) == list(range(50)) and a != b


def resumed(make, steps):
    """Indices seen by `steps` batches of ``make()``, then by a fresh ``make()`` resumed from its
    state to the end of the epoch; returns (indices, the second loader)."""
    first = make()
    it = iter(first)
    seen = []
    for _ in range(steps):
        seen += odb.pop_step_info(next(it)).indices
    state = first.state_dict()
    first.close()
    second = make()
    second.load_state_dict(state)
    seen += [i for info in ids_of(second) for i in info.indices]
    return seen, second


def test_resume_in_a_fresh_loader_emits_every_sample_exactly_once():
    seen, second = resumed(lambda: odb.ODBDataLoader(Samples(LENGTHS), 128, id_collate, buffer_size=8), 5)
    assert sorted(seen) == list(range(50))
    second.set_epoch(1)
    assert sorted(i for info in ids_of(second) for i in info.indices) == list(range(50))


def test_load_state_dict_is_strict_and_says_why():
    loader = odb.ODBDataLoader(Samples(LENGTHS), 128, id_collate, buffer_size=8)
    good = loader.state_dict()
    for change, msg in (({"seed": 1}, "seed"), ({"world_size": 2}, "world_size"), ({"rank": 1}, "another rank"),
                        ({"extra": 0}, "unknown keys"), ({"version": 9}, "version"),
                        ({"sharding": "dealt" if good["sharding"] == "fixed" else "fixed"}, "sharding")):
        with pytest.raises(odb.ConfigError, match=msg):
            loader.load_state_dict({**good, **change})
    other = odb.ODBDataLoader(Samples(LENGTHS[:40]), 128, id_collate, buffer_size=8)
    with pytest.raises(odb.ConfigError, match="positions"):
        other.load_state_dict({**good, "rank_0": {**good["rank_0"], "num_positions": 50}})
    loader.close()
    other.close()


def test_break_close_and_garbage_collection_stop_the_engine_and_workers():
    loader = odb.ODBDataLoader(Samples(LENGTHS), 64, id_collate, buffer_size=4, num_workers=1)
    for k, batch in enumerate(loader):
        if k == 2:
            break
    assert not odb_threads()
    it = iter(loader)
    next(it)
    del it
    assert not odb_threads()
    with odb.ODBDataLoader(Samples(LENGTHS), 64, id_collate, buffer_size=4) as other:
        next(iter(other))
    assert not odb_threads()
    loader.close()
    with pytest.raises(odb.ConfigError, match="closed"):
        iter(loader)


def test_loss_scale_bases_and_pop_step_info_contract():
    with odb.ODBDataLoader(Samples(LENGTHS), 128, id_collate, buffer_size=8, loss_basis="samples") as loader:
        batch = next(iter(loader))
        info = odb.pop_step_info(batch)
        assert info.loss_scale == 1.0 and info.local_samples == info.global_samples == len(info.indices)
        assert info.local_label_tokens == sum(LENGTHS[i] - 1 for i in info.indices)
        with pytest.raises(odb.SampleError, match="odb_step_info"):
            odb.pop_step_info(batch)


@pytest.mark.parametrize("collate", ["pad", "packed"])
def test_shift_labels_counts_label_tokens_as_the_causal_lm_loss_sees_them(collate):
    from odb.batching import packed_collate

    fn = {"pad": pad_collate, "packed": packed_collate}[collate]
    ds = Stream(LENGTHS, range(50))  # labels == input_ids: labels[0] is a label, not -100
    counts = {}
    if collate == "packed":  # packing masks each sample's first label: counting it would be one per sample too many
        with pytest.raises(odb.ConfigError, match="shift_labels=False with a packing collate"):
            odb.ODBDataLoader(ds, 128, fn, shift_labels=False)
    for shift in ((None, True) if collate == "packed" else (False, True)):
        with odb.ODBDataLoader(ds, 128, fn, buffer_size=8, shift_labels=shift) as loader:
            infos = []
            for batch in loader:
                info = odb.pop_step_info(batch)
                shifted = int((batch["labels"][:, 1:] != -100).sum())  # what the shifted CE loss averages over
                if shift or collate == "packed":
                    assert info.local_label_tokens == info.global_label_tokens == shifted
                infos.append(info)
        counts[shift] = sum(i.local_label_tokens for i in infos)
    if collate == "packed":
        assert counts[None] == counts[True] == sum(LENGTHS) - 50  # the default counts the shifted targets
    else:
        assert counts[False] == sum(LENGTHS) and counts[True] == sum(LENGTHS) - 50
    with pytest.raises(odb.ConfigError, match="shift_labels"):
        odb.ODBDataLoader(ds, 128, fn, shift_labels="yes")


def test_count_labels_shift_skips_position_zero():
    from odb.runtime.source import count_labels

    s = {"labels": [7, -100, 8, 9]}
    assert count_labels(s) == 3 and count_labels(s, shift=True) == 2
    assert count_labels({"labels": torch.tensor([5, 6])}, shift=True) == 1 and count_labels({}, shift=True) == 0


@pytest.mark.parametrize("kwargs, msg", [
    ({"mode": "fast"}, "mode"), ({"oversize": "drop"}, "oversize"), ({"loss_basis": "x"}, "loss_basis"),
    ({"buffer_size": 0}, "buffer_size"), ({"timeout_s": 0}, "timeout_s"), ({"sharding": "even"}, "sharding"),
    ({"sharding": "dealt", "sampler": [0, 1, 2]}, "sampler="),
])
def test_bad_settings_are_rejected_with_the_valid_values(kwargs, msg):
    with pytest.raises(odb.ConfigError, match=msg):
        odb.ODBDataLoader(Samples(LENGTHS), 128, id_collate, **kwargs)


class _BrokenPartition(odb.batching.BalancedPolicy):
    """Breaks the partition contract from round 2 on (one group too few)."""

    def partition(self, window, target, real, cost, **kw):
        groups = super().partition(window, target, real, cost, **kw)
        self.calls = getattr(self, "calls", 0) + 1
        return groups[:-1] if self.calls >= 2 and len(groups) > 1 else groups


def test_a_policy_breaking_its_contract_raises_and_the_rank_stops_through_the_table(tmp_path):
    with odb.ODBDataLoader(Samples(LENGTHS), 128, id_collate, buffer_size=8, policy=_BrokenPartition(),
                           trace_dir=str(tmp_path)) as loader:
        with pytest.raises(odb.ProtocolError, match="broke the partition contract in round 1 on rank 0"):
            ids_of(loader)  # its second partition: the collect of round 1
    assert not odb_threads()
    rows = assert_conformant(str(tmp_path), allow_abort=True)
    assert rows["return_abort"] == 1 and "return_stop" not in rows


def test_a_break_ends_the_pass_through_return_abort(tmp_path):
    loader = odb.ODBDataLoader(Samples(LENGTHS), 128, id_collate, buffer_size=4, trace_dir=str(tmp_path))
    seen = []
    for k, batch in enumerate(loader):
        seen += odb.pop_step_info(batch).indices
        if k == 1:
            break
    assert not odb_threads()
    rows = assert_conformant(str(tmp_path), allow_abort=True)
    assert rows["return_abort"] == 1 and rows["post_header"] == rows["return_go"] + 1
    with pytest.raises(AssertionError, match="aborted=True"):
        assert_conformant(str(tmp_path))
    # the next pass starts the epoch again, as torch's DataLoader does (issue 49: continuing it lost the
    # samples of a peeked batch)
    again = [i for info in ids_of(loader) for i in info.indices]
    assert sorted(again) == list(range(50)) and set(seen) < set(again)
    loader.close()


def test_the_runtime_default_collate_is_the_one_batching_pad_collate():
    from odb.batching import collate

    assert pad_collate is collate.pad_collate
    loader = odb.ODBDataLoader(Samples(LENGTHS), 128, buffer_size=8)
    assert loader.collate_fn is collate.pad_collate
    batch = next(iter(loader))
    assert batch["id"].shape[1] == 1 and batch["labels"][:, 0].eq(-100).all()  # extra keys are kept
    loader.close()
    out = pad_collate([{"input_ids": [1, 2, 3], "labels": [5, 6, 7]}, {"input_ids": [4], "labels": [8]}])
    assert out["labels"].tolist() == [[5, 6, 7], [8, -100, -100]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["input_ids"].dtype == torch.int64


@pytest.mark.parametrize("workers", [2, 0])  # 0: the direct path, whose keys the deal grows as the epoch runs
def test_dealt_sharding_on_one_rank_emits_every_sample_once_with_workers_and_resumes(tmp_path, workers):
    kw = dict(buffer_size=6, sharding="dealt", num_workers=workers, trace_dir=str(tmp_path))
    seen, second = resumed(lambda: odb.ODBDataLoader(Samples(LENGTHS, drop=[4]), 128, id_collate, **kw), 4)
    assert sorted(seen) == sorted(set(range(50)) - {4})
    assert_conformant(str(tmp_path), allow_abort=True)
    second.close()


class _Flaky(torch.utils.data.Dataset):
    """Samples of `LENGTHS`; None at index 3, an exception at index 5 (both reach the rank as values)."""

    def __len__(self):
        return len(LENGTHS)

    def __getitem__(self, i):
        if i == 3:
            return None
        if i == 5:
            raise OSError("unreadable")
        return {"input_ids": list(range(LENGTHS[i])), "labels": [-100] + list(range(1, LENGTHS[i]))}


class _FlakyStream(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i in range(len(LENGTHS)):
            yield _Flaky()[i] if i != 5 else {"input_ids": [1, 2]}


@pytest.mark.parametrize("iterable", [False, True])
def test_the_direct_path_yields_what_the_inner_dataloader_yields(iterable):
    """No workers and no pinning: the rank's thread calls the wrapper itself (`source._direct`). The same
    source through the DataLoader (pin_memory=True: on a CPU build it pins nothing) yields equal items."""
    from odb.core.types import Failure
    from odb.runtime.source import Source

    def items(pin):
        src = Source(_FlakyStream() if iterable else _Flaky(), length_fn=None, num_workers=0,
                     dataloader={"pin_memory": pin}, shift_labels=True)
        assert (src._loader is None) == (not pin)
        keys = None if iterable else [(p, i) for p, i in enumerate(reversed(range(len(LENGTHS))))]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pin_memory without an accelerator
            src.start(keys)
            out = []
            while (item := src.next()) is not None:
                out.append(item)
        return out, src.pulled

    direct, through = items(False), items(True)
    assert direct[1] == through[1] == len(LENGTHS)
    for a, b in zip(direct[0], through[0], strict=True):
        assert a[:3] == b[:3]
        if isinstance(a[3], Failure):
            assert isinstance(b[3], Failure) and a[3][:3] == b[3][:3]
        else:
            assert a[3] == b[3]
    by_index = {it[1]: it for it in direct[0]}
    assert by_index[3][2] is None and by_index[3][3] is None  # None: a drop, as a value
    if not iterable:
        assert isinstance(by_index[5][3], Failure) and "unreadable" in by_index[5][3].message
    assert by_index[7][3] == ((LENGTHS[7],), LENGTHS[7] - 1)  # shift_labels: the -100 head is off
