"""What real training loops do between batches, on 2-4 gloo ranks (issue 61).

A pause every rank takes at the same step (an evaluation, a checkpoint every rank writes) is not a failure,
whatever its length; only a rank whose peers wait for it in a collective is (`odb.runtime.engine`, "Pauses").
`filler_sample` is the content of every PAD filler, a rank with no sample at all included.  Slow tier: the
pause cases sleep 3x ``timeout_s`` by design.
"""

from collections import Counter

import pytest

from mp_harness import make_lengths, run_ranks, scenario
from proofs.conformance import assert_conformant

pytestmark = pytest.mark.slow

LENGTHS = make_lengths(400, seed=3, lo=2, hi=60)


def _run(tmp_path, world_size, proc_timeout=150, **spec):
    spec.setdefault("trace_dir", str(tmp_path / "traces"))
    spec.setdefault("lengths", LENGTHS)
    return run_ranks(scenario, world_size, tmp_path, args=(spec,), timeout_s=proc_timeout)


def _ok(res):
    assert all(r.status == "ok" for r in res), [(r.status, r.error_type, (r.error or "")[:1500]) for r in res]
    return [r.value for r in res]


def _every_sample_once(values, n=len(LENGTHS)):
    got = Counter(i for v in values for s in v["steps"] for i in s["ids"])
    assert sorted(got) == list(range(n)) and set(got.values()) == {1}, (len(got), n)


# Each: world size, window, mode, placement, shuffle seed, the steps at which every consumer pauses.  Seed 5 at
# W = 8 is the order that failed when the released batches' queue was bounded in samples (a round's samples
# differ per rank, so one engine parked before its post while its peer waited in that round's collective).
PAUSES = [
    (2, 8, "pad", None, 5, [4]),
    (2, 8, "pad", None, 1, [2, 9]),
    (2, 32, "pad", "auto", 5, [0, 6]),
    (3, 16, "join", None, 2, [3]),
    (2, 8, "quota", None, 5, [4]),
    (4, 8, "pad", "pooled", 1, [5]),
]


@pytest.mark.parametrize("n, W, mode, placement, seed, at", PAUSES,
                         ids=[f"n{p[0]}-W{p[1]}-{p[2]}-{p[3]}-seed{p[4]}" for p in PAUSES])
def test_a_pause_every_rank_takes_at_the_same_step_never_fails_however_long(tmp_path, n, W, mode, placement,
                                                                             seed, at):
    timeout = 2.0 if n == 2 else 3.0  # 4 processes on 2 cores: a round of a loaded machine stays well inside
    spec = dict(W=W, mode=mode, seed=seed, timeout_s=timeout, stall_at=at, stall_rank="all", stall_s=3 * timeout)
    if placement == "auto":
        spec["placement"] = "auto"
    elif placement == "pooled":
        spec.update(pool=2, sharding="dealt")
    values = _ok(_run(tmp_path, n, **spec))
    if mode != "quota":
        _every_sample_once(values)
    assert_conformant(str(tmp_path / "traces"))


def test_a_rank_pausing_alone_still_fails_every_rank_clearly_past_the_timeout(tmp_path):
    # the other side of the rule: rank 0 alone saves for 3x timeout_s while its peer waits in a collective for it
    res = _run(tmp_path, 2, W=8, seed=5, timeout_s=2, stall_at=4, stall_rank=0, stall_s=6)
    assert res[1].error_type == "RankFailure", (res[1].status, res[1].error)
    assert "did not complete within timeout_s=2" in res[1].error
    assert res[0].error_type == "RankFailure", (res[0].status, res[0].error)


FILLER = {"input_ids": [7, 7, 7], "labels": [-100, 7, 7], "id": [-1]}
# a rank whose stream is empty: PAD needs fillers on it from the first round, with no sample ever seen there
EMPTY_RANK = [list(range(0, 40)), []]


@pytest.mark.parametrize("placement", [None, "auto"])
def test_filler_sample_is_used_on_a_rank_whose_stream_is_empty(tmp_path, placement):
    spec = dict(shards=EMPTY_RANK, iterable=True, mode="pad", W=6, lengths=LENGTHS[:40], filler_sample=FILLER)
    if placement == "auto":
        spec["placement"] = "auto"
    values = _ok(_run(tmp_path, 2, **spec))
    _every_sample_once(values, 40)
    assert [len(v["steps"]) for v in values][0] == len(values[1]["steps"]) > 0
    assert all(s["filler"] and s["scale"] == 0 for s in values[1]["steps"] if not s["ids"])
    assert_conformant(str(tmp_path / "traces"))


@pytest.mark.parametrize("mode", ["join", "quota"])
def test_a_rank_whose_stream_is_empty_needs_no_filler_in_join_and_quota(tmp_path, mode):
    spec = dict(shards=EMPTY_RANK, iterable=True, mode=mode, W=6, lengths=LENGTHS[:40], filler_sample=FILLER)
    values = _ok(_run(tmp_path, 2, **spec))
    if mode == "join":
        _every_sample_once(values, 40)
    assert values[1]["steps"] == []
    assert_conformant(str(tmp_path / "traces"))


def test_without_filler_sample_an_empty_stream_rank_is_told_to_pass_one(tmp_path):
    res = _run(tmp_path, 2, shards=EMPTY_RANK, iterable=True, mode="pad", W=6, lengths=LENGTHS[:40])
    assert res[1].error_type == "SampleError" and "filler_sample" in res[1].error, (res[1].status, res[1].error)
    assert res[0].error_type == "RankFailure", (res[0].status, res[0].error)


# -- data that silently differs from what the loader assumes ------------------------------------------------------

def _own_shard(rank, world_size, spec):
    """Each rank builds the loader on its own equal shard of a map-style dataset (as pipelines that shard
    before the loader do), or on the whole dataset (``spec["whole"]``), optionally with random preprocessing."""
    import random

    import odb
    from mp_harness import Samples, id_collate

    reads: dict = {}

    class Noisy(Samples):  # random preprocessing: two reads of one index differ (a random crop, a template)
        def __getitem__(self, i):
            s, n = super().__getitem__(i), reads.get(i, 0)
            reads[i] = n + 1
            # "twice": the first two reads of an index alike on a rank and unlike across ranks (what a coin-flip
            # augmentation gives one construction in twenty), then others
            k = {"random": random.randint(0, 3), "twice": (rank + n // 2) % 4, "always": n % 4}[spec["noisy"]]
            return {**s, "input_ids": s["input_ids"] + [1] * k, "labels": s["labels"] + [1] * k}

    full = list(range(200))
    lengths = make_lengths(200, seed=1, lo=2, hi=40)
    ids = full if spec.get("whole") else full[rank::world_size]
    cls = Noisy if spec.get("noisy") else Samples
    ds = cls([lengths[i] for i in ids])
    ds.ids = ids
    with odb.ODBDataLoader(ds, 128, id_collate, timeout_s=10, buffer_size=8) as loader:
        at_construction = sum(reads.values())
        return sum(len(odb.pop_step_info(b).indices) for b in loader), at_construction


def test_ranks_given_their_own_shards_of_one_length_are_refused_on_every_rank_at_construction(tmp_path):
    res = run_ranks(_own_shard, 2, tmp_path, args=({},), timeout_s=60)
    for r in res:
        assert r.error_type == "ConfigError", (r.status, r.error)
        assert "different samples at the same position" in r.error and "whole dataset" in r.error


@pytest.mark.parametrize("noisy", [False, "random", "twice", "always"])
def test_the_whole_dataset_on_every_rank_passes_the_probe_random_preprocessing_included(tmp_path, noisy):
    res = run_ranks(_own_shard, 2, tmp_path, args=({"whole": True, "noisy": noisy},), timeout_s=60)
    values = _ok(res)
    assert sum(n for n, _ in values) == 200
    if noisy == "always":  # every two reads differ: the probe's stated cost, two reads of each of two positions
        assert [reads for _, reads in values] == [4, 4]


def _streams(rank, world_size, spec):
    """An IterableDataset split by rank or not (``spec["split"]``), or a map-style dataset with one sampler
    for every rank; returns the warnings the consumer saw before its first batch, and the samples trained."""
    import warnings

    import odb
    import odb.integrations
    from mp_harness import ListSampler, Samples, Stream, id_collate

    lengths = make_lengths(120, seed=2, lo=2, hi=40)
    kw = {}
    if spec.get("sampler"):
        ds = Samples(lengths)
        kw["sampler"] = ListSampler(range(0, 120) if not spec.get("split") else range(rank, 120, world_size))
    else:
        ds = Stream(lengths, range(rank, 120, world_size) if spec.get("split") else range(120))
    with odb.ODBDataLoader(ds, 128, id_collate, timeout_s=10, buffer_size=8, mode="join", **kw) as loader:
        with warnings.catch_warnings(record=True) as seen, odb.integrations.join_context(None, loader):
            warnings.simplefilter("always")
            it = iter(loader)
            first = next(it)
            before = [str(w.message) for w in seen]
            n = len(odb.pop_step_info(first).indices) + sum(len(odb.pop_step_info(b).indices) for b in it)
    return {"warned": before, "samples": n}


@pytest.mark.parametrize("kind", ["stream", "sampler"])
def test_a_stream_or_sampler_that_gives_every_rank_the_same_samples_is_named_before_the_first_batch(tmp_path,
                                                                                                      kind):
    values = _ok(run_ranks(_streams, 2, tmp_path, args=({"sampler": kind == "sampler"},), timeout_s=60))
    for v in values:
        assert any("ranks [0, 1] began the epoch with the same" in w and "Fix:" in w for w in v["warned"]), v
    split = _ok(run_ranks(_streams, 2, tmp_path / "split", args=({"sampler": kind == "sampler", "split": True},),
                          timeout_s=60))
    assert not any("began the epoch with the same" in w for v in split for w in v["warned"])
    assert sum(v["samples"] for v in split) == 120


# -- messages that say what happened ------------------------------------------------------------------------------

def test_a_peer_that_dies_is_reported_as_a_failure_before_the_timeout_not_as_a_timeout(tmp_path):
    res = _run(tmp_path, 2, W=4, die_at=2, die_rank=1, timeout_s=30, proc_timeout=60)
    assert res[1].status == "died"
    err = res[0]
    assert err.error_type == "RankFailure", (err.status, err.error)
    assert "before timeout_s=30" in err.error and "not a timeout" in err.error and "torch said" in err.error
    assert err.seconds < 25


def test_a_collective_failure_message_tells_a_timeout_from_an_earlier_error():
    from odb.runtime.group import collective_failure

    e = RuntimeError("Connection refused")
    early = collective_failure("rank 0: creating the group", 0.4, 120.0, "a rank did not construct one", e)
    assert "failed after 0.4 s, before timeout_s=120.0 (not a timeout" in early and "Connection refused" in early
    late = collective_failure("rank 0: creating the group", 119.0, 120.0, "a rank did not construct one", e)
    assert "did not complete within timeout_s=120.0: a rank did not construct one" in late


def test_an_exchange_with_a_pool_that_cannot_run_is_named_as_passed():
    import odb
    from odb.core.placement import check_pool, placement_label
    from odb.errors import ConfigError

    name = placement_label(odb.Exchanged(pool=3))
    with pytest.raises(ConfigError, match=r"^placement=odb\.Exchanged\(pool=3, slack=0\.0\): a pool of 3 does not"):
        check_pool(4, 3, "pad", "dealt", name=name)
    assert placement_label("auto") == "placement='auto' (the default)" and placement_label(None) == "placement=None"


def test_len_of_the_loader_says_what_to_use_instead_and_frameworks_still_see_no_length():
    import odb
    from mp_harness import Samples

    with odb.ODBDataLoader(Samples([3] * 10), 64) as loader:
        with pytest.raises(TypeError, match="sample_scheduler"):
            len(loader)
        assert bool(loader)
        try:  # what HF's has_length and Lightning's has_len do
            len(loader)
            sized = True
        except TypeError:
            sized = False
        assert not sized and len(list(loader)) > 0  # list() does not take the TypeError for a length


@pytest.mark.parametrize("output", [{"logits": "x"}, (None, "x")])
def test_a_batch_without_labels_gets_an_error_naming_them_not_a_key_error(output):
    import torch

    from odb.errors import ConfigError
    from odb.integrations import weighted_loss

    logits = torch.ones(2, requires_grad=True)
    out = {"logits": logits} if isinstance(output, dict) else (None, logits)
    with pytest.raises(ConfigError, match="no 'labels'"):
        weighted_loss(out, 0.5)
    assert float(weighted_loss(out, 0.0)) == 0.0  # a zero weight needs no loss
    assert float(weighted_loss({"loss": torch.tensor(2.0), "logits": logits}, 0.5)) == 1.0


def test_a_merged_state_missing_a_key_is_named_not_reported_as_a_changed_dataset():
    import odb
    from mp_harness import Samples
    from odb.errors import ConfigError

    with odb.ODBDataLoader(Samples([3] * 20), 64, buffer_size=4) as loader:
        it = iter(loader)
        odb.pop_step_info(next(it))
        merged = odb.merge_states([loader.state_dict()])
        it.close()
        cut = {k: v for k, v in merged.items() if k != "num_positions"}
        with pytest.raises(ConfigError, match="lacks 'num_positions'") as e:
            loader.load_state_dict(cut)
        assert "dataset changed" not in str(e.value)
        loader.load_state_dict(merged)  # the whole state loads


def test_a_construction_collective_that_fails_at_once_is_not_reported_as_a_timeout():
    from odb.errors import RankFailure
    from odb.runtime.group import LoaderGroup

    g = LoaderGroup(None, 30.0)  # one rank: its collectives are what the test hands it

    def refused():
        raise RuntimeError("Connection refused")
    with pytest.raises(RankFailure, match=r"failed after 0\.\d s, before timeout_s=30\.0 \(not a timeout"):
        g._gather("the construction check of ODBDataLoader", "did not construct its loader", refused)


def _own_dataset_with_sampler(rank, world_size, spec):
    """Each rank its own dataset (of one length) and a sampler over it: the user chose each rank's samples."""
    import odb
    from mp_harness import ListSampler, Samples, id_collate

    lengths = make_lengths(60, seed=rank + 7, lo=2, hi=40)
    with odb.ODBDataLoader(Samples(lengths), 128, id_collate, sampler=ListSampler(range(60)), timeout_s=10,
                           buffer_size=8) as loader:
        return sum(len(odb.pop_step_info(b).indices) for b in loader)


def test_each_rank_its_own_dataset_with_a_sampler_is_the_users_choice_and_runs(tmp_path):
    assert _ok(run_ranks(_own_dataset_with_sampler, 2, tmp_path, args=({},), timeout_s=60)) == [60, 60]


def _over_budget_images(rank, world_size, spec):
    """Rank 1's samples are all over the budget and hold an image (a 2-D tensor): none can be cut to a filler."""
    import torch

    import odb

    class Images(torch.utils.data.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            n = 200 if i % 2 else 10  # rank 1's (odd positions): over the budget of 64
            return {"input_ids": torch.ones(n, dtype=torch.long), "pixel_values": torch.zeros(2, 3)}

    def collate(samples):
        return {"n": torch.tensor([len(s["input_ids"]) for s in samples])}
    filler = {"input_ids": torch.ones(4, dtype=torch.long), "pixel_values": torch.zeros(2, 3)}
    from mp_harness import ListSampler

    shard = ListSampler(range(0, 40, 2) if rank == 0 else [1, 3])  # rank 1: two samples, then fillers
    with odb.ODBDataLoader(Images(), 64, collate, filler_sample=filler, sampler=shard, placement=None, timeout_s=10,
                           buffer_size=4) as loader:
        out = []
        for b in loader:
            info = odb.pop_step_info(b)
            out.append((info.filler, b["n"].tolist()))
        return out


def test_filler_sample_is_used_when_a_rank_saw_only_over_budget_samples_that_cannot_be_cut(tmp_path):
    values = _ok(run_ranks(_over_budget_images, 2, tmp_path, args=({},), timeout_s=60))
    assert len(values[0]) == len(values[1])
    fillers = [n for f, n in values[1] if f]
    assert fillers and all(n == [4] for n in fillers)  # filler_sample's content, not a cut of an image sample
