"""Cost models: the kinds compute what their docstrings say, are monotone, and reject bad specs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odb.batching import CostModel, make_cost_model
from odb.batching.cost import QUADRATIC_B
from odb.errors import ConfigError

sizes = st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 3000)), min_size=1, max_size=20)


def test_each_kind_costs_what_its_docstring_says():
    batch = [(100,), (300,), (200,)]
    assert make_cost_model("padded", 1000).batch_cost(batch) == (900,)
    assert make_cost_model("packed", 1000).batch_cost(batch) == (600,)
    q = make_cost_model("quadratic", 1000).batch_cost(batch)[0]
    assert q == pytest.approx(600 + QUADRATIC_B * (100**2 + 300**2 + 200**2))


def test_fits_and_utilisation_follow_the_budget():
    c = make_cost_model("padded", 600)
    assert c.fits([(200,), (300,)]) and not c.fits([(200,), (301,)])
    assert c.utilisation([(150,), (300,)]) == pytest.approx(1.0)


def test_a_multi_resource_budget_limits_every_resource():
    c = make_cost_model({"tokens": 1000, "image_patches": 100})
    assert isinstance(c, CostModel)
    assert c.fits([(500, 50), (400, 50)])
    assert not c.fits([(500, 60), (400, 50)])  # patches over, tokens fine
    assert not c.fits([(700, 10), (400, 10)])  # tokens over, patches fine
    mixed = make_cost_model({"tokens": ("padded", 1000), "image_patches": 100})
    assert mixed.batch_cost([(100, 5), (300, 7)]) == (600, 12)
    assert make_cost_model("padded", {"tokens": 10, "image_patches": 4}).batch_cost([(1, 3), (2, 1)]) == (4, 6)


def test_a_callable_cost_uses_one_budget_per_value():
    c = make_cost_model(lambda b: (len(b), sum(s[0] for s in b)), (3, 100))
    assert c.fits([(10,), (20,)]) and not c.fits([(10,)] * 4)
    bad = make_cost_model(lambda b: (1.0, 2.0), 5)
    with pytest.raises(ConfigError, match="2 values for 1 budgets"):
        bad.fits([(1,)])


@pytest.mark.parametrize("spec,budget,match", [
    ("paddd", 10, "unknown cost kind"),
    ("padded", None, "needs a budget"),
    ("packed", 0, "positive finite"),
    ("packed", float("nan"), "positive finite"),
    ({"image_patches": 5, "tokens": 10}, None, "'tokens' first"),
    ({"tokens": 10}, 5, "only the mapping"),
    (42, None, "not understood"),
])
def test_bad_specs_are_rejected_with_the_fix(spec, budget, match):
    with pytest.raises(ConfigError, match=match):
        make_cost_model(spec, budget)


@pytest.mark.parametrize("spec", ["padded", "packed", "quadratic",
                                  {"tokens": ("padded", 8000), "image_patches": 4000},
                                  {"tokens": ("quadratic", 8000), "image_patches": ("padded", 4000)}])
@settings(max_examples=60, deadline=None)
@given(batch=sizes, drop=st.data())
def test_a_sub_batch_never_costs_more(spec, batch, drop):
    c = make_cost_model(spec, None if isinstance(spec, dict) else 8000)
    keep = drop.draw(st.lists(st.booleans(), min_size=len(batch), max_size=len(batch)))
    sub = [s for s, k in zip(batch, keep) if k]
    full, part = c.batch_cost(batch), c.batch_cost(sub)
    assert all(p <= f + 1e-9 for p, f in zip(part, full))
    if c.fits(batch):
        assert c.fits(sub)


@settings(max_examples=200, deadline=None)
@given(batch=st.lists(st.lists(st.integers(0, 5000), max_size=3).map(tuple), min_size=1, max_size=12),
       spec=st.sampled_from(["padded", "packed", "quadratic"]))
def test_a_resource_costs_its_definition_when_some_samples_lack_it(batch, spec):
    """Image patches (resource 1) of a batch where some samples carry only tokens, or nothing: a sample without
    a resource has none of it, for every kind."""
    c = make_cost_model({"tokens": 10**6, "image_patches": (spec, 10**6)})
    lens = [s[1] if len(s) > 1 else 0 for s in batch]
    want = {"padded": len(batch) * max(lens), "packed": sum(lens),
            "quadratic": sum(L + QUADRATIC_B * L * L for L in lens)}[spec]
    assert c.batch_cost(batch)[1] == pytest.approx(want, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(window=st.lists(st.lists(st.integers(0, 3000), max_size=3).map(tuple), min_size=1, max_size=30),
       spec=st.sampled_from([("padded", 4000), ("packed", 6000), ("quadratic", 5000),
                             ({"tokens": ("padded", 5000), "image_patches": ("packed", 2000)}, None)]),
       data=st.data())
def test_the_first_group_over_budget_is_the_one_fits_refuses_first(window, spec, data):
    """`BudgetCost.first_over` (the partition check's pass over every group) finds what a loop of `fits` over the
    groups finds: the first group of two or more samples over some budget, or None; samples that lack a
    resource and lone samples over budget (allowed) included."""
    cost = make_cost_model(*spec)
    groups = data.draw(st.lists(st.lists(st.integers(0, len(window) - 1), max_size=6), max_size=8))
    want = next((k for k, g in enumerate(groups) if len(g) > 1 and not cost.fits([window[p] for p in g])), None)
    assert cost.first_over(groups, window) == want


# -- the construction check of a cost built with functools.partial (issue 61, item 6) -------------------------
def _weighted(batch, scale=1.0, floor=0):
    """A callable cost that a rank binds with functools.partial."""
    return max(floor, scale * len(batch) * max(s[0] for s in batch))


def _closing_over(inner):
    """A callable cost whose closure holds a partial."""
    def fn(batch):
        return inner(batch)
    return fn


def test_partials_of_one_function_are_described_apart_exactly_when_their_bound_arguments_differ():
    from functools import partial

    from odb.core.shared import describe_cost

    def d(fn):
        return describe_cost(make_cost_model(fn, 4096))
    same = [(partial(_weighted, scale=2.0), partial(_weighted, scale=2.0)),
            (partial(_weighted, 2.0), partial(_weighted, 2.0)),
            (partial(partial(_weighted, 2.0), floor=3), partial(partial(_weighted, 2.0), floor=3)),
            (_closing_over(partial(_weighted, 2.0)), _closing_over(partial(_weighted, 2.0)))]
    apart = [(partial(_weighted, scale=2.0), partial(_weighted, scale=3.0)),  # a keyword
             (partial(_weighted, 2.0), partial(_weighted, 3.0)),  # a positional argument
             (partial(_weighted, 2.0, 0), partial(_weighted, 2.0, 5)),  # the second of two
             (partial(_weighted, 2.0), partial(_weighted, scale=2.0)),  # bound otherwise
             (partial(_weighted, 2.0), _weighted),  # a partial or its function
             (partial(partial(_weighted, 2.0), floor=3), partial(partial(_weighted, 2.0), floor=4)),  # nested
             (partial(partial(_weighted, 2.0), floor=3), partial(partial(_weighted, 3.0), floor=3)),
             (_closing_over(partial(_weighted, 2.0)), _closing_over(partial(_weighted, 3.0)))]  # in a closure
    import numpy as np

    class Table:  # no repr of its own: its repr holds an address, which differs on every rank
        pass

    w = np.arange(2000.0)
    w2 = w.copy()
    w2[1000] += 1  # in the middle, where numpy's repr writes "..."
    same.append((partial(_weighted, scale=Table()), partial(_weighted, scale=Table())))
    apart.append((partial(_weighted, scale=w), partial(_weighted, scale=w2)))
    for a, b in same:
        assert d(a) == d(b), (d(a), d(b))
    for a, b in apart:
        assert d(a) != d(b), d(a)


def _partial_cost(rank, world_size, scales):
    """Build a loader whose cost is ``partial(_weighted, scale=scales[rank])``; run its epoch if built."""
    from functools import partial

    import odb
    from mp_harness import Samples, id_collate, make_lengths

    try:
        loader = odb.ODBDataLoader(Samples(make_lengths(40, 1, lo=2, hi=30)), None, id_collate, buffer_size=4,
                                   cost=make_cost_model(partial(_weighted, scale=scales[rank]), 4096), timeout_s=20)
    except ConfigError as e:
        return str(e)
    n = sum(1 for b in loader if odb.pop_step_info(b))
    loader.close()
    return n


@pytest.mark.slow  # 2 gloo ranks
@pytest.mark.parametrize("scales", [(2.0, 2.0), (2.0, 3.0)])
def test_ranks_whose_cost_partials_bind_different_arguments_are_refused_and_the_same_partial_runs(tmp_path, scales):
    from mp_harness import run_ranks

    res = run_ranks(_partial_cost, 2, tmp_path, args=(scales,), timeout_s=60)
    assert [r.status for r in res] == ["ok", "ok"], [r.error for r in res]
    got = [r.value for r in res]
    if scales[0] == scales[1]:
        assert got[0] == got[1] and isinstance(got[0], int) and got[0] > 0, got
    else:
        assert all(isinstance(g, str) and "built this ODBDataLoader differently (cost" in g
                   and "'scale': 2.0" in g and "'scale': 3.0" in g for g in got), got


@pytest.mark.parametrize("kind", ["padded", "packed", "quadratic"])
def test_a_sample_fits_alone_exactly_when_the_cost_model_says_a_batch_of_it_fits(kind):
    """`odb.batching.deal.sample_fits` (the rank core's test of each sample it reads): `cost.fits([sizes])`, at the
    budget, one over it, and for a sample that lacks the resource."""
    from odb.batching import make_cost_model
    from odb.batching.cost import BudgetCost, Resource
    from odb.batching.intake import sample_fits

    for cost in (make_cost_model(kind, 100),
                 BudgetCost("two", (Resource(name="tokens", index=0, kind="padded", budget=100),
                                       Resource(name="pixels", index=1, kind=kind, budget=50)))):
        fits = sample_fits(cost)
        for sizes in ((1,), (99,), (100,), (101,), (7, 50), (7, 51), (100, 0), (0,), (101, 1)):
            assert fits(sizes) == cost.fits([sizes]), (cost.name, sizes)
