"""Ranks simulated through the DGAP table with the batching policies: coverage, equal steps,
budget, and ODB's policy beats the release algorithm on the release's own long-tail mix; with a
dealt order (``deal=``) the same coverage, no rank running dry, and a higher straggler ceiling."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odb.baselines import ReleasePolicy
from odb.batching import default_policy, make_cost_model
from odb.core.sim import simulate
from paper_repro.bench import metrics
from paper_repro.distributions import sample_lengths
from simkit import sim_settings


def _emitted(sim):
    return [sorted(i for b in row if b for i in b) for row in sim.batches]


@pytest.mark.parametrize("mode", ["pad", "join"])
@settings(max_examples=25, deadline=None)
@given(shards=st.lists(st.lists(st.integers(1, 3000), max_size=40), min_size=1, max_size=4),
       window=st.integers(1, 12), kind=st.sampled_from(["padded", "packed", "quadratic"]))
def test_every_sample_is_emitted_exactly_once_within_budget(mode, shards, window, kind):
    sizes = [[(x,) for x in sh] for sh in shards]
    cost = make_cost_model(kind, 2048)
    sim = simulate(sizes, sim_settings(cost, window, mode=mode))
    assert _emitted(sim) == [list(range(len(sh))) for sh in sizes]
    if mode == "pad":
        assert len({len(row) for row in sim.batches}) == 1
    for r, row in enumerate(sim.batches):
        for b in row:
            assert b is None or len(b) == 1 or cost.fits([sizes[r][i] for i in b])


def test_quota_mode_stops_all_ranks_together_and_reports_the_rest():
    sizes = [[(100,)] * 30, [(100,)] * 5]
    sim = simulate(sizes, sim_settings(make_cost_model("packed", 400), 8, mode="quota"))
    assert len({len(row) for row in sim.batches}) == 1
    for r in range(2):
        got = sorted(i for b in sim.batches[r] if b for i in b)
        assert sorted(got + sim.unemitted[r]) == list(range(len(sizes[r])))
    assert sim.unemitted[0] and not sim.unemitted[1]


def test_odb_beats_the_release_algorithm_on_its_long_tail_mix():
    n, per = 4, 1024
    sizes = sample_lengths("release", n * per, seed=3)
    shards = [sizes[r::n] for r in range(n)]
    flat = [s for sh in shards for s in sh]
    cost = make_cost_model("padded", 8192)
    out = {}
    for name, pol in [("odb", default_policy), ("release", ReleasePolicy)]:
        sim = simulate(shards, sim_settings(cost, 256, policy=pol))
        rows = [[None if b is None else [r * per + i for i in b] for b in row] for r, row in enumerate(sim.batches)]
        out[name] = metrics(rows, flat, cost)
        if name == "odb":  # the steps before the epoch's last round (it splits windows down, rule 5 of the policy)
            starts = [sum(sim.targets[:k]) for k in range(len(sim.targets))]  # each round's first step
            last = max(k for k in starts if k < len(rows[0]))
            out["odb_flowing"] = metrics([row[:last] for row in rows], flat, cost)
            fillers = sum(b is None for row in rows for b in row[last:])
    assert out["odb"]["steps"] < out["release"]["steps"]
    assert out["odb"]["straggler_eff"] > out["release"]["straggler_eff"]
    assert out["odb_flowing"]["singletons_avoid"] < 0.02 < out["release"]["singletons"]
    # the last round splits a rank's groups (singletons at worst) rather than hand out fillers
    assert out["odb"]["singletons_avoid"] < 0.05 and fillers == 0


def test_bench_bounds_hold_for_every_method_on_a_small_point():
    from paper_repro.bench import run_config

    r = run_config("mmmix", 4, 64, 8192, "packed", 256)
    assert r["lower_bound"] * 4 >= r["shard_lower_bound"] >= r["lower_bound"]  # ceil(LB/N) <= shard LB
    for name, m in r["methods"].items():
        if "straggler_eff" in m:
            assert m["straggler_eff"] <= m["straggler_ceiling"] + 1e-9, name
        if name in ("odb", "release_reimpl"):  # fixed shards: no policy beats their lower bound
            assert m["steps"] >= r["shard_lower_bound"], name
            assert m["straggler_eff"] <= r["shard_token_ceiling"] + 1e-9, name  # packed: exact ceiling
            assert m["budget_use"] <= r["packed_use_ceiling"] + 1e-9, name
    assert r["methods"]["odb_dealt"]["steps"] >= r["lower_bound"]  # dealt: only the global bound holds


def test_the_released_package_runs_at_padded_points_of_the_default_grid():
    # `paper_repro.bench` compares the package with ODB's figures at the same grid point (one run)
    from paper_repro.bench import grid, release_points

    pts = release_points()
    assert pts and len(set(pts)) == len(pts)
    assert set(pts) <= set(grid(False)) and {p[4] for p in pts} == {"padded"}
    assert {p[1] for p in pts} == {2, 8, 16}


def test_at_the_epoch_end_the_costliest_leftover_groups_go_first():
    from odb.batching.policy import fill_bucket

    cost = make_cost_model("padded", 1000)
    ws = [[(1500,), (900,), (400,), (400,), (300,), (300,)], [(600,), (450,), (450,)]]
    pols = [default_policy() for _ in ws]
    summaries = [p.summarize(w, cost, x) for p, w, x in zip(pols, ws, (False, True))]
    t = pols[0].propose(summaries, 8)
    groups = pols[0].partition(ws[0], t, t, cost, summaries=summaries)
    fills = [cost.utilisation([ws[0][i] for i in g]) for g in groups]
    assert t == 2 and fills[0] == 1.5 and fill_bucket(fills[0]) < fill_bucket(fills[1])


def test_every_rank_receives_the_same_gathered_summaries_in_partition():
    from odb.batching.policy import BalancedPolicy

    pols = []

    class Recording(BalancedPolicy):  # each simulated rank runs its own copy: each registers at its first call
        def summarize(self, window, cost, exhausted):
            if not any(p is self for p in pols):
                self.posted, self.got = [], []
                pols.append(self)
            self.posted.append(super().summarize(window, cost, exhausted))
            return self.posted[-1]

        def partition(self, window, target, real, cost, *, summaries=None):
            self.got.append((len(self.posted) - 1, [list(x) for x in summaries]))
            return super().partition(window, target, real, cost, summaries=summaries)

    sizes = [sample_lengths("mmmix", 300, seed=r) for r in range(3)]
    simulate(sizes, sim_settings(make_cost_model("padded", 4096), 32, policy=Recording))
    assert len(pols) == 3 and all(p.got for p in pols)
    for p in pols:  # exactly this round's posted summaries of every rank, in rank order
        for rnd, got in p.got:
            assert got == [q.posted[rnd] for q in pols]


def test_a_policy_that_sorts_the_window_it_is_handed_changes_no_batch():
    """The rank keeps its window's sizes from the post to the round's partition (`RankCore._window_sizes`):
    each call is handed a copy, and the copy is remade when the window changes, so a policy that sorts the
    list in place in `summarize` is handed the window as it is in `partition`, and every round's window is
    its own."""
    from odb.batching.policy import BalancedPolicy

    class Sorting(BalancedPolicy):
        def summarize(self, window, cost, exhausted):
            out = super().summarize(window, cost, exhausted)
            window.sort()  # in place, after reading it
            return out

    sizes = [sample_lengths("mmmix", 200, seed=r) for r in range(3)]
    cost = make_cost_model("padded", 4096)
    plain = simulate(sizes, sim_settings(cost, 24))
    sorting = simulate(sizes, sim_settings(cost, 24, policy=Sorting))
    assert plain.rounds > 3 and sorting.batches == plain.batches


def _dealt_schedule(order, n, window, kind="packed", budget=2048, **kw):
    cost = make_cost_model(kind, budget)
    return simulate([[] for _ in range(n)], sim_settings(cost, window), deal=order, **kw), cost


@pytest.mark.parametrize("n, window, total", [(1, 8, 50), (1, 4, 3), (3, 4, 200), (4, 16, 10), (5, 2, 0)])
def test_a_dealt_order_is_emitted_exactly_once_in_equal_steps(n, window, total):
    order = sample_lengths("mmmix", total, seed=n) if total else []  # (4, 16, 10): shorter than N x W
    sim, cost = _dealt_schedule(order, n, window)
    assert sorted(i for row in sim.batches for b in row if b for i in b) == list(range(total))
    assert len({len(row) for row in sim.batches}) == 1
    for row in sim.batches:
        for b in row:
            assert b is None or len(b) == 1 or cost.fits([order[i] for i in b])


@settings(max_examples=40, deadline=None)
@given(order=st.lists(st.integers(1, 3000), max_size=120), n=st.integers(1, 4), window=st.integers(1, 12),
       kind=st.sampled_from(["padded", "packed", "quadratic"]), ahead=st.integers(0, 3))
def test_a_rank_dealt_its_per_round_bound_never_takes_its_reserve(order, n, window, kind, ahead):
    # each rank topped up to W - n + U(T) + its prefetch + 1 (deal.round_needs) reads only what it was
    # dealt: without drops it never reaches past its keys into its reserve class
    sizes = [(x,) for x in order]
    sim, _ = _dealt_schedule(sizes, n, window, kind, aheads=[ahead] * n)
    assert sorted(i for row in sim.batches for b in row if b for i in b) == list(range(len(sizes)))
    assert sim.reserve_taken == [0] * n


def test_a_bound_without_the_emitted_groups_makes_ranks_take_their_reserve(monkeypatch):
    # teeth for the test above: a bound that leaves out U(T) (what the round emits) under-deals the ranks;
    # nothing is lost (they take their reserve), but the check sees it
    import odb.batching.intake as intake
    monkeypatch.setattr(intake, "intake_bound", lambda window, n, ladder, target: np.maximum(0, window - n))
    sim, _ = _dealt_schedule(sample_lengths("mmmix", 400, seed=3), 3, 16)
    assert sum(sim.reserve_taken) > 0
    assert sorted(i for row in sim.batches for b in row if b for i in b) == list(range(400))


def test_dropped_samples_are_counted_and_the_dealt_rank_takes_its_reserve_for_them():
    order = [None if k % 3 == 0 else (50 + k,) for k in range(90)]  # every third sample is a drop
    sim, _ = _dealt_schedule(order, 2, 8)
    assert sorted(i for row in sim.batches for b in row if b for i in b) == [k for k in range(90) if k % 3]
    assert sum(st.dropped for st in sim.stats) == 30 and sum(sim.reserve_taken) > 0


def test_dealing_lifts_the_straggler_ceiling_of_imbalanced_shards():
    n, per, rng = 4, 256, random.Random(7)
    # rank 0's shard holds only long samples: its total is about 4x any other's
    shards = [[(rng.randint(2000, 4000),) for _ in range(per)]] + \
        [[(rng.randint(200, 1300),) for _ in range(per)] for _ in range(n - 1)]
    cost = make_cost_model("packed", 8192)
    fixed = simulate(shards, sim_settings(cost, 16))
    rows = [[None if b is None else [r * per + i for i in b] for b in row] for r, row in enumerate(fixed.batches)]
    order = [s for sh in shards for s in sh]
    m_fixed = metrics(rows, order, cost)
    m_dealt = metrics(_dealt_schedule(order, n, 16, "packed", 8192)[0].batches, order, cost)
    assert m_fixed["straggler_ceiling"] < 0.6
    assert m_dealt["straggler_ceiling"] > m_fixed["straggler_ceiling"] + 0.3
    assert m_dealt["straggler_eff"] > m_fixed["straggler_eff"] + 0.3
    assert m_dealt["steps"] < m_fixed["steps"]


@pytest.mark.parametrize("drops", [False, True])
def test_replicas_sharing_each_deal_emit_what_replicas_dealing_alone_emit(drops):
    # the simulation's shared deals (one computation per round for N replicas) are a cache, not a model:
    # the same batches, rounds, reserve takes and counters as every replica running its own dealer
    order = [None if drops and k % 5 == 0 else s for k, s in enumerate(sample_lengths("sharegpt4o", 600, seed=4))]
    cost = make_cost_model("padded", 8192)
    runs = [simulate([[] for _ in range(5)], sim_settings(cost, 16),
                     deal=order, share_deals=share) for share in (True, False)]
    assert runs[0].batches == runs[1].batches and runs[0].rounds == runs[1].rounds
    assert runs[0].reserve_taken == runs[1].reserve_taken and runs[0].targets == runs[1].targets
    assert runs[0].unemitted == runs[1].unemitted and sum(map(len, runs[0].batches)) > 0
    assert (sum(runs[0].reserve_taken) > 0) == drops  # the reserve path is exercised where drops make it


@pytest.mark.parametrize("stop_at", [0, 2, 3])
def test_a_rank_that_stops_in_round_k_fails_its_peers_naming_round_k(stop_at):
    from odb.core.header import reduce_posts
    from odb.core.sim import _Setting
    from odb.core.types import CLOSED, OK
    from odb.errors import RankFailure

    sizes = sample_lengths("sharegpt4o", 3 * 64, seed=2)
    setting = _Setting(3, sim_settings(make_cost_model("padded", 8192), 8), sizes, None)
    cores = [setting.core(r, [])[0] for r in range(3)]
    errors = []
    for rnd in range(10):
        posts = []
        for r, c in enumerate(cores):
            status = (lambda: CLOSED) if r == 1 and rnd >= stop_at else (lambda: OK)
            while not c.waiting and not c.done:
                o = c.step(status)
                posts += [o.post] if o.post is not None else []
        if all(c.done for c in cores):
            break
        errors += [o.abort_error for o in (c.collect(reduce_posts(posts)) for c in cores) if o.abort_error]
    assert len(errors) == 2 and all(isinstance(e, RankFailure) and f"in round {stop_at} " in str(e) for e in errors)


def test_the_time_a_simulation_spends_in_the_policy_is_within_its_wall_time():
    import time

    sizes = [sample_lengths("mmmix", 300, seed=r) for r in range(3)]
    t0 = time.perf_counter()
    res = simulate(sizes, sim_settings(make_cost_model("padded", 4096), 32))
    wall = time.perf_counter() - t0
    assert len(res.decision_s) == 3 * res.rounds and 0 < sum(res.decision_s) <= wall


def test_every_rank_of_every_pool_has_its_first_batchs_wait():
    """Pooled windows simulated with one core per pool: `first_wait` is set for each lane of each pool, the pool's."""
    from odb import LoaderSettings, Pooled

    order = [((x,), x - 1) for (x,) in sample_lengths("sharegpt4o", 4 * 64, seed=3)]
    res = simulate([[] for _ in range(4)], LoaderSettings(token_budget=4096, buffer_size=16, placement=Pooled(2)),
                   deal=order)
    assert None not in res.first_wait
    assert res.first_wait[0] == res.first_wait[1] and res.first_wait[2] == res.first_wait[3]


def _stepwise(self, status):
    """`RankCore.advance` as a traced driver runs it: `step` after `step`, one row a call, every row's `Step`
    built, up to the row that posts (or no row fired: a restart); an error a row leaves goes to the driver at
    once."""
    while True:
        o = self.step(status)
        if o.step is None or o.local_error is not None or o.step.effect == "post":
            return o


@pytest.mark.parametrize("mode,pool,exchange,oversize", [
    ("pad", 1, False, "alone"), ("join", 1, False, "skip"), ("quota", 1, True, "alone"), ("pad", 2, False, "alone"),
    ("pad", 2, True, "alone"), ("pad", 1, False, "error")])
@settings(max_examples=15, deadline=None)
@given(lens=st.lists(st.one_of(st.none(), st.integers(0, 600)), min_size=0, max_size=120),
       window=st.integers(1, 9), dealt=st.booleans())
def test_advance_fires_the_rows_that_step_after_step_fires(mode, pool, exchange, oversize, lens, window, dealt):
    """`RankCore.advance` (what the simulation and an untraced loader run) gives every batch, round, count and
    error that one `step` a row gives, drops (None), empty and over-budget samples included."""
    from odb.core.rank import RankCore

    cost = make_cost_model("padded", 512)
    n = 4
    measures = [None if x is None else ((x,), x) for x in lens]
    shards = [[] for _ in range(n)] if dealt or exchange or pool > 1 else [measures[r::n] for r in range(n)]
    deal = measures if dealt or exchange or pool > 1 else None
    settings_ = sim_settings(cost, window, mode=mode, pool=pool, exchange=exchange, oversize=oversize)

    def outcome():
        try:
            sim = simulate(shards, settings_, deal=deal)
        except Exception as e:  # noqa: BLE001 - the error itself is compared
            return type(e).__name__, str(e)
        return (sim.batches, sim.rounds, sim.targets, sim.moved, sim.unemitted,
                [(s.dropped, s.empty, s.oversize, s.oversize_skipped, s.rounds, s.budget_batches) for s in sim.stats])

    fast = outcome()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RankCore, "advance", _stepwise)
        slow = outcome()
    assert slow == fast
