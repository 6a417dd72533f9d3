"""The code that is simulated is the code that runs: `ODBDataLoader` and `odb.core.sim.simulate`, batch for batch.

Both drive the same `odb.core.rank.RankCore` per rank; the loader through its engine thread, its data
source and gloo, the simulation through an in-process gather.  Given the same order, settings and
policy (and no DataLoader workers, which the simulation does not model), every rank's sequence of
batches (dataset indices per step, fillers included) must be the same.  Slow tier for N > 1.
"""

import dataclasses

import pytest

from mp_harness import Samples, id_collate, make_lengths, run_ranks
from odb.batching import make_cost_model
from odb.core.sim import simulate
from odb.runtime.source import shard_order
from simkit import sim_settings

BUDGET = 160
LENGTHS = make_lengths(150, seed=31, lo=2, hi=60)
for k in (7, 40, 41, 99):
    LENGTHS[k] = 200 + k  # over the budget: emitted alone
DROPS = {3, 17, 18, 88, 120}


def _measure(i):
    return None if i in DROPS else ((LENGTHS[i],), LENGTHS[i] - 1)  # Samples' labels: [-100] + ones


def _loader_batches(rank, world_size, spec):
    """Every batch the loader emits on this rank (dataset indices, None for a filler); ``spec`` gives W, mode and
    sharding, and optionally ``lengths`` and ``drop`` (default: `LENGTHS` less `DROPS`)."""
    import odb
    from odb.integrations import join_context

    data = Samples(spec.get("lengths", LENGTHS), drop=spec.get("drop", DROPS))
    loader = odb.ODBDataLoader(data, BUDGET, id_collate, buffer_size=spec["W"], mode=spec["mode"],
                               sharding=spec["sharding"], seed=5, timeout_s=60,
                               placement=spec.get("placement", "auto"),
                               first_window=spec.get("first_window", odb.LoaderSettings.first_window))
    out = []
    with join_context(None, loader):  # JOIN: no model collective here
        for batch in loader:
            info = odb.pop_step_info(batch)
            out.append(None if info.filler else list(info.indices))
    loader.close()
    return out


def _settings(spec):
    """The loader's settings as the simulation takes them: the placement as the loader is given it ("auto", the
    default, resolved by both alike)."""
    s = sim_settings(make_cost_model("padded", BUDGET), spec["W"], mode=spec["mode"])
    return dataclasses.replace(s, placement=spec.get("placement", "auto"),
                               first_window=spec.get("first_window", s.first_window))


def _simulated(world_size, spec):
    if spec["sharding"] == "dealt":
        order = shard_order(len(LENGTHS), 0, 1, True, 5, 0)
        sim = simulate([[] for _ in range(world_size)], _settings(spec), deal=[_measure(i) for i in order])
        return [[None if b is None else [order[p] for p in b] for b in row] for row in sim.batches]
    orders = [shard_order(len(LENGTHS), r, world_size, True, 5, 0) for r in range(world_size)]
    sim = simulate([[_measure(i) for i in o] for o in orders], _settings(spec))
    return [[None if b is None else [orders[r][p] for p in b] for b in row] for r, row in enumerate(sim.batches)]


# (sharding, mode, W, placement): "auto" is the default (the exchange on dealt pad/quota at 2 ranks or more)
CASES = [("fixed", "pad", 8, "auto"), ("dealt", "pad", 8, "auto"), ("dealt", "join", 6, "auto"),
         ("fixed", "quota", 8, "auto"), ("dealt", "pad", 3, "auto"), ("dealt", "pad", 8, None)]


@pytest.mark.parametrize("sharding, mode, W, placement", CASES)
def test_the_loader_on_one_rank_emits_the_simulations_batches(sharding, mode, W, placement):
    spec = {"sharding": sharding, "mode": mode, "W": W, "placement": placement}
    assert [_loader_batches(0, 1, spec)] == _simulated(1, spec)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("sharding, mode, W, placement", CASES)
def test_the_loader_on_gloo_ranks_emits_the_simulations_batches(tmp_path, world_size, sharding, mode, W, placement):
    _gloo_ranks_as_simulated(tmp_path, world_size, {"sharding": sharding, "mode": mode, "W": W, "placement": placement})


def _gloo_ranks_as_simulated(tmp_path, world_size, spec):
    """The loader on `world_size` gloo ranks emits the simulation's batches; every sample once (but QUOTA)."""
    res = run_ranks(_loader_batches, world_size, tmp_path, args=(spec,), timeout_s=90)
    assert all(r.status == "ok" for r in res), [(r.status, r.error_type, (r.error or "")[:800]) for r in res]
    got, want = [r.value for r in res], _simulated(world_size, spec)
    assert got == want
    emitted = sorted(i for row in got for b in row if b for i in b)
    if spec["mode"] != "quota":
        assert emitted == sorted(set(range(len(LENGTHS))) - DROPS)


# (sharding, mode, W, placement, first_window): the first rounds' smaller windows (first_window < W), each
# mode, both shardings, with and without the exchange
RAMP_CASES = [("dealt", "pad", 8, "auto", 2), ("fixed", "join", 8, None, 1), ("dealt", "quota", 8, "auto", 3),
              ("fixed", "pad", 8, "auto", 2), ("dealt", "join", 8, None, 2)]


@pytest.mark.parametrize("sharding, mode, W, placement, first_window", RAMP_CASES)
def test_the_first_rounds_windows_run_on_one_rank_as_simulated(sharding, mode, W, placement, first_window):
    spec = {"sharding": sharding, "mode": mode, "W": W, "placement": placement, "first_window": first_window}
    assert [_loader_batches(0, 1, spec)] == _simulated(1, spec)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("sharding, mode, W, placement, first_window", RAMP_CASES)
def test_the_first_rounds_windows_run_on_gloo_ranks_as_simulated(tmp_path, world_size, sharding, mode, W, placement,
                                                                  first_window):
    _gloo_ranks_as_simulated(tmp_path, world_size, {"sharding": sharding, "mode": mode, "W": W, "placement": placement,
                                                    "first_window": first_window})


BIG = make_lengths(6500, seed=7, lo=2, hi=60)  # 2 ranks, W = 2,048: an end game of 2,402 positions (sorted)


@pytest.mark.slow
def test_a_dealt_end_game_large_enough_to_be_sorted_runs_on_gloo_ranks_as_simulated(tmp_path, monkeypatch):
    """The dealer's end game past `_FAST_LEFT` positions (`level_order`, parts as int arrays) in the runtime:
    the loader's batches on 2 gloo ranks are the simulation's, which took that path and compared it with the
    sort (`fill_order`) when it read the second rank's part, and every sample is emitted once."""
    import numpy as np

    from odb.batching import deal

    sorted_picks, levels = [], []
    real, real_levels = deal.fill_order, deal.level_order

    def spy(*a, **k):
        got = real(*a, **k)
        sorted_picks.append(len(got) if isinstance(got, np.ndarray) else 0)
        return got

    def spy_levels(*a):
        got = real_levels(*a)
        levels.append(0 if got is None else got.left)
        return got

    monkeypatch.setattr(deal, "fill_order", spy)
    monkeypatch.setattr(deal, "level_order", spy_levels)
    order = shard_order(len(BIG), 0, 1, True, 5, 0)
    # first_window=None: every round fills 2,048, so the end game starts with more than _FAST_LEFT positions left
    sim = simulate([[] for _ in range(2)], _settings({"W": 2048, "mode": "pad", "first_window": None}),
                   deal=[((BIG[i],), BIG[i] - 1) for i in order])
    want = [[None if b is None else [order[p] for p in b] for b in row] for row in sim.batches]
    assert max(sorted_picks) >= deal.FAST_LEFT and max(levels) >= deal.FAST_LEFT
    spec = {"sharding": "dealt", "mode": "pad", "W": 2048, "lengths": BIG, "drop": (), "first_window": None}
    res = run_ranks(_loader_batches, 2, tmp_path, args=(spec,), timeout_s=120)
    assert all(r.status == "ok" for r in res), [(r.status, r.error_type, (r.error or "")[:800]) for r in res]
    got = [r.value for r in res]
    assert got == want
    assert sorted(i for row in got for b in row if b for i in b) == list(range(len(BIG)))
