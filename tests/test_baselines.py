"""Baselines: every sample scheduled exactly once, batches fit, and the lower bound is a bound."""


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odb.baselines import (
    ReleasePolicy,
    ScheduleSampler,
    batch_lower_bound,
    bucketed_max_tokens,
    global_max_tokens,
    memory_equivalent_batch_size,
    standard,
    step_lower_bound,
)
from odb.batching import AlignmentPolicy, check_partition, make_cost_model
from odb.errors import ConfigError

lengths = st.lists(st.integers(1, 3000), min_size=1, max_size=200)


def _flat(schedule):
    return sorted(i for row in schedule for b in row if b for i in b)


@pytest.mark.parametrize("kind", ["padded", "packed", "quadratic"])
@settings(max_examples=40, deadline=None)
@given(ls=lengths, world=st.integers(1, 5))
def test_gmt_and_bmt_schedule_every_sample_once_within_budget(kind, ls, world):
    sizes = [(x,) for x in ls]
    cost = make_cost_model(kind, 2048)
    for sched in (global_max_tokens(sizes, cost, world), bucketed_max_tokens(sizes, cost, world, bucket=16)):
        assert len(sched) == world and len({len(r) for r in sched}) == 1  # equal step counts
        assert _flat(sched) == list(range(len(sizes)))
        for row in sched:
            for b in row:
                assert b is None or len(b) == 1 or cost.fits([sizes[i] for i in b])
        assert len(sched[0]) >= step_lower_bound(sizes, cost, world)


def test_lower_bound_counts_unpairable_samples_alone():
    cost = make_cost_model("padded", 1000)
    sizes = [(600,), (700,), (100,), (100,)]  # 600 and 700 cannot share with anything (2 x 600 > 1000)
    assert batch_lower_bound(sizes, cost) == 3
    assert len(global_max_tokens(sizes, cost, 1)[0]) == 3


def test_gmt_deals_consecutive_batches_to_one_step():
    cost = make_cost_model("padded", 100)
    sizes = [(50,)] * 4 + [(10,)] * 20
    sched = global_max_tokens(sizes, cost, 2)
    assert [len(b) for b in (sched[0][0], sched[1][0])] == [2, 2]   # both long batches in step 0
    assert sched[0][1] is not None and len(sched[0][1]) == 10


def test_standard_uses_strided_shards_and_fillers():
    sched = standard(5, 2, batch_size=2)
    assert sched == [[[0, 2], [4]], [[1, 3], None]]
    assert list(ScheduleSampler(sched, 1)) == [[1, 3]] and len(ScheduleSampler(sched, 0)) == 2


def test_memory_equivalent_batch_size_is_the_largest_worst_case_fit():
    cost = make_cost_model("padded", 1000)
    assert memory_equivalent_batch_size([(100,), (333,), (20,)], cost) == 3
    assert memory_equivalent_batch_size([(1001,)], cost) == 1


def test_bad_arguments_raise_config_errors():
    with pytest.raises(ConfigError):
        standard(4, 0)
    with pytest.raises(ConfigError):
        bucketed_max_tokens([(1,)], make_cost_model("packed", 5), 1, bucket=0)


@settings(max_examples=40, deadline=None)
@given(ls=st.lists(st.integers(1, 5000), min_size=1, max_size=60), data=st.data())
def test_release_reimplementation_keeps_the_partition_contract(ls, data):
    pol = ReleasePolicy()
    assert isinstance(pol, AlignmentPolicy)
    window = [(x,) for x in ls]
    cost = make_cost_model("padded", 4096)
    g = pol._runs(window, cost)
    assert len(g[0]) == 1  # the forced singleton that starts every window
    assert pol.groups(window, cost) is None  # its runs are no intake promise (`AlignmentPolicy.groups`)
    real = data.draw(st.integers(1, len(window)))
    check_partition(pol.partition(window, real, real, cost), len(window), real, window, cost)


def test_release_target_is_the_max_group_count_clipped_by_min_samples():
    pol = ReleasePolicy()
    tag = 0x0DB0
    assert pol.propose([[tag, 10, 0, 4], [tag, 10, 0, 7]], 10) == 7
    assert pol.propose([[tag, 10, 0, 4], [tag, 3, 1, 7]], 10) == 3
    assert pol.propose([[tag, 0, 1, 0], [tag, 5, 0, 2]], 10) == 2
