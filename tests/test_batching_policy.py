"""The default alignment policy keeps the partition contract for every window and target,
and its proposal is a deterministic function of the gathered summaries."""

import random

import pytest
from hypothesis import given, settings, strategies as st

from odb.batching import AlignmentPolicy, check_partition, default_policy, make_cost_model, pack
from odb.errors import ProtocolError

SPECS = ["padded", "packed", "quadratic", {"tokens": 2000, "image_patches": ("padded", 900)}]


def _cost(spec, budget=2000):
    return make_cost_model(spec, None if isinstance(spec, dict) else budget)


windows = st.lists(st.tuples(st.integers(0, 2600), st.integers(0, 400)), min_size=1, max_size=40)


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=80, deadline=None)
@given(window=windows, data=st.data())
def test_partition_keeps_the_contract_for_any_real(spec, window, data):
    cost = _cost(spec)
    pol = default_policy()
    assert isinstance(pol, AlignmentPolicy)
    real = data.draw(st.integers(1, len(window)))
    target = data.draw(st.integers(real, max(real, 50)))
    groups = pol.partition(window, target, real, cost)
    check_partition(groups, len(window), real, window, cost)  # exactly `real`, disjoint, non-empty, fits
    carried = len(window) - sum(len(g) for g in groups)
    assert 0 <= carried <= len(window)


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=60, deadline=None)
@given(window=windows)
def test_pack_covers_the_window_once_and_only_the_last_group_is_open(spec, window):
    cost = _cost(spec)
    gs = pack(window, cost)
    pos = sorted(p for g in gs for p in g.positions)
    assert pos == list(range(len(window)))
    assert all(g.closed for g in gs[:-1])
    for g in gs:
        assert len(g.positions) == 1 or cost.fits([window[p] for p in g.positions])


@settings(max_examples=60, deadline=None)
@given(sums=st.lists(st.tuples(st.integers(0, 64), st.booleans(), st.integers(0, 10), st.integers(0, 3)),
                     min_size=1, max_size=8))
def test_propose_is_deterministic_and_the_minimum_need(sums):
    pol = default_policy()
    summaries = [[0x0DB1, n, int(x), f, f + extra, 900] for n, x, f, extra in sums]
    t = pol.propose(summaries, 64)
    assert t == default_policy().propose(summaries, 64)
    # a permutation of ranks does not change the proposal (documented: rank order is irrelevant)
    assert t == pol.propose(list(reversed(summaries)), 64)
    needs = [(s[4] if s[2] else s[3]) for s in summaries if s[1] > 0]
    assert t == (max(1, min(needs)) if needs else 1)
    assert t >= 1


def test_propose_rejects_a_summary_from_another_policy():
    with pytest.raises(ProtocolError, match="same alignment policy"):
        default_policy().propose([[0x0DB1, 4, 0, 1, 1, 900], [7, 7]], 8)


def test_summary_length_does_not_depend_on_the_window():
    pol, cost = default_policy(), _cost("packed")
    for n in (0, 1, 17, 300):
        assert len(pol.summarize([(100,)] * n, cost, n % 2 == 0)) == pol.summary_len


def test_full_groups_fill_the_packed_budget():
    rng = random.Random(1)
    w = [(rng.randint(64, 1400),) for _ in range(512)]
    cost = _cost("packed", 8192)
    pol = default_policy()
    s = pol.summarize(w, cost, False)
    groups = pol.partition(w, s[3], s[3], cost)
    fills = [cost.utilisation([w[p] for p in g]) for g in groups]
    assert min(fills) > 0.9 and sum(fills) / len(fills) > 0.98
    assert fills == sorted(fills, reverse=True)  # emitted in decreasing cost
