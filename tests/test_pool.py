"""Pooled windows (`odb.core.placement`): a pool's ranks run one window and split its batches.

What must hold, and what each test pins:
- the pure pieces: the pool rows the table reads (a lane's stop stops its pool; lanes that posted other
  headers stop every rank), the proposal made a multiple of the pool size, the settings refused;
- the simulation: one core per pool emits exactly the batches every rank's own replica emits (the
  runtime's shape), every sample once, every rank the same number of steps, a step's batches on a pool's
  ranks neighbours in fill; the pooled grid beats the unpooled one where ranks are many;
- the runtime on gloo ranks: the loader emits the simulation's batches, the StepInfo's global counts are
  the sums over every rank of that step, its traces conform to the table, a divergence is loud.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mp_harness import Samples, id_collate, make_lengths, run_ranks
from odb.batching import make_cost_model
from odb.core.header import Header, HeaderLayout
from odb.core.placement import check_pool, lane_proposal, pool_aheads, pool_rows
from odb.core.sim import simulate
from odb.errors import ConfigError, ProtocolError
from odb.runtime.source import shard_order
from simkit import sim_settings

BUDGET = 160
LENGTHS = make_lengths(300, seed=47, lo=2, hi=90)
for _k in (11, 150):
    LENGTHS[_k] = 200 + _k  # over the budget: emitted alone
DROPS = {5, 77, 201}


_LAY = HeaderLayout(2, 8, 1)  # the layout of `_h`'s headers


def _gathered(rows):
    """Decoded headers as the transport hands them to the rank core (`Headers`)."""
    return _LAY.decode_all(rows)


def _h(st=0, n=4, summary=(1, 2), **kw):
    base = dict(st=st, round=0, n=n, epoch=0, deal=7, target=1, proposal=1, summary=summary, taken=4, cost=9,
                dry=0, reserve=0, intake=(1,))
    return Header(**{**base, **kw})


# -- the pure pieces --------------------------------------------------------------------------------------
def test_pool_rows_take_lane_zero_with_the_largest_status_of_the_pool():
    rows = _gathered([_h(), _h(), _h(n=5), _h(n=5)])
    assert list(pool_rows(rows, 1, 0)) == list(rows)
    assert list(pool_rows(rows, 2, 0)) == [_h(), _h(n=5)]
    stopping = _gathered([_h(), _h(st=1, n=2), _h(n=5), _h(n=5)])  # a lane that stops posts another window: no error
    assert [r.st for r in pool_rows(stopping, 2, 0)] == [1, 0]
    assert list(pool_rows(stopping, 2, 0)) == [_h(st=1), _h(n=5)]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.data())
def test_the_table_reads_the_same_collective_inputs_from_the_pool_rows_as_from_every_ranks(pools, lanes, data):
    """Why the table's proofs for N ranks cover a pooled run: its lanes are the table's N ranks, and
    reading the P pool rows instead of the N rows changes none of the table's collective inputs (the
    largest status, the windows' extremes) while no rank stops, and none that the abort round reads when
    one does, whatever each lane posts, as long as no error is raised."""
    from odb.core.replica import table_headers
    from odb.protocol import machine
    from odb.protocol.table import DGAP

    W = 8
    rows = []
    for _ in range(pools):
        n = data.draw(st.integers(0, W))
        sts = data.draw(st.lists(st.sampled_from((0, 0, 0, 1, 2)), min_size=lanes, max_size=lanes))
        # a lane that stops posts its own window (it stopped filling); the others post the pool's
        rows += [_h(st=s_, n=data.draw(st.integers(0, W)) if s_ else n) for s_ in sts]
    try:
        pooled = pool_rows(_gathered(rows), lanes, 0)
    except ProtocolError:
        assert lanes > 1
        return
    cfg = {"W": W, "W0": W, "mode": 0, "header_len": 1, "xchg": 0}
    # the pool rows as columns (what the rank core reads), every rank's one mapping each (the table's own form)
    got, raw = (machine.collective_inputs(DGAP, table_headers(r, 1), 3, cfg) for r in (pooled, rows))
    if raw["max_st"] == 0:
        assert got == raw
    else:  # some rank stops: every rank takes return_abort, which reads max_st only
        from odb.protocol.expr import Let, Scope, evaluate

        assert got["max_st"] == raw["max_st"]
        assert all(evaluate(Let("abort"), Scope(inputs=i, cfg=cfg, lets=DGAP.let_map)) for i in (got, raw))


@pytest.mark.parametrize("field, value", [("summary", (1, 3)), ("n", 3), ("cost", 10), ("deal", 8), ("taken", 5)])
def test_pool_rows_refuse_lanes_that_posted_other_headers(field, value):
    rows = _gathered([_h(), _h(), _h(), _h(**{field: value})])
    with pytest.raises(ProtocolError, match=rf"pooled ranks diverged in round 3: rank 3 .*'{field}'"):
        pool_rows(rows, 2, 3)
    with pytest.raises(ProtocolError, match="do not make pools"):
        pool_rows(rows[:3], 2, 0)


def test_with_the_exchange_pool_rows_compare_the_fills_the_plan_reads_and_no_others():
    """A pooled header carries the pool window's fills (the round exchange); the plan reads the first T, the
    held round's target.  A lane whose fill differs there diverged; past T no decision reads a fill."""
    lay = HeaderLayout(2, 8, 1, lanes=2, exchange=True)
    fills = (5, 4, 3, -1, -1, -1, -1, -1)

    def h(f=fills):
        return lay.flat(_h(fills=f))

    other_read, other_unread = (5, 4, 2, *fills[3:]), (*fills[:3], 7, *fills[4:])
    rows = lay.decode_all([h(), h(), h(), h(other_read)])
    with pytest.raises(ProtocolError, match=r"diverged in round 4: rank 3 posted other \['fills'\]"):
        pool_rows(rows, 2, 4, 3)
    rows = lay.decode_all([h(), h(), h(), h(other_unread)])
    with pytest.raises(ProtocolError, match=r"rank 3 posted other \['fills'\]"):
        pool_rows(rows, 2, 4)  # every field compared (no count of fills read)
    assert list(pool_rows(rows, 2, 4, 3)) == [_h(fills=fills)] * 2  # lane 0's header: the unread slot never counts
    assert pool_rows(rows, 2, 4, 3).fills.tolist() == [list(fills)] * 2


def test_pool_rows_name_the_diverged_rank_behind_a_stopping_pool():
    # pool 0 stops (its lanes may differ), pool 1 agrees, pool 2's lane 1 diverged: rank 5 is named, not rank 3
    rows = _gathered([_h(st=1), _h(n=9), _h(), _h(), _h(), _h(cost=10)])
    with pytest.raises(ProtocolError,
                       match=r"pooled ranks diverged in round 2: rank 5 posted other \['cost'\] than rank 4"):
        pool_rows(rows, 2, 2)
    assert [r.st for r in pool_rows(_gathered([_h(st=1), _h(n=9), _h(), _h()]), 2, 0)] == [1, 0]


def test_a_pools_over_budget_slots_come_in_multiples_of_its_ranks_so_a_step_holds_one_level():
    from odb.batching.policy import OVER, BalancedPolicy, default_policy, over_slots

    over = [[0, 0, 5, 3, 0, 0], [0, 1, 9, 2, 0, 0], [0, 0, 6, 7, 0, 0]]  # 3 participants' over-budget histograms
    # the quorum: the 2nd largest holding per level (after lending)
    assert over_slots(over, 100)[0] == [2] * 6 + [3] * 2
    levels, own = over_slots(over, 100, lanes=4)
    assert levels == [2, 2, 2, 2]  # 6 -> 4, 3 -> 0: the rest is carried
    assert all(len(o) == 4 for o in own) and len(over[0]) == OVER
    assert over_slots(over, 5, lanes=4)[0] == [2, 2, 2, 2]  # a target cuts the same prefix
    assert default_policy(4).lanes == 4 and default_policy().lanes == 1
    with pytest.raises(ConfigError, match="lanes must be an int >= 1"):
        BalancedPolicy(lanes=0)


def test_the_proposal_becomes_the_nearest_multiple_of_the_pool_within_the_bound():
    assert [lane_proposal(p, 1, 64) for p in (1, 5, 64)] == [1, 5, 64]
    assert [lane_proposal(p, 4, 64) for p in (1, 2, 3, 5, 6, 7, 9, 62, 64)] == [4, 4, 4, 4, 8, 8, 8, 64, 64]
    assert lane_proposal(63, 8, 64) == 64 and lane_proposal(60, 8, 64) == 64 and lane_proposal(59, 8, 64) == 56
    assert pool_aheads([1, 4, 2, 0], 2) == (4, 2) and pool_aheads([1, 4], 1) == (1, 4)


@pytest.mark.parametrize("world, lanes, mode, sharding, match", [
    (4, 3, "pad", "dealt", "does not divide"), (4, 2, "join", "dealt", "needs mode='pad'"),
    (4, 2, "pad", "fixed", "needs dealt sharding"), (4, 0, "pad", "dealt", "an int >= 1"),
    (4, True, "pad", "dealt", "an int >= 1")])
def test_pools_that_cannot_run_are_refused(world, lanes, mode, sharding, match):
    with pytest.raises(ConfigError, match=match):
        check_pool(world, lanes, mode, sharding)
    with pytest.raises(ConfigError, match=r"ranks 2..3 read ahead \[4, 2\]"):
        check_pool(4, 2, "pad", "dealt", (1, 1, 4, 2))
    check_pool(4, 2, "pad", "dealt", (1, 1, 4, 4))
    check_pool(world, 1, mode, sharding)  # no pooling: anything goes


# -- the simulation ----------------------------------------------------------------------------------------
def _measure(i):
    return None if i in DROPS else ((LENGTHS[i],), LENGTHS[i] - 1)  # Samples' labels: [-100] + ones


def _order():
    return shard_order(len(LENGTHS), 0, 1, True, 5, 0)


def _pooled(world, lanes, W, replicas=False, deal=None, on_round=None):
    cost = make_cost_model("padded", BUDGET)
    order = _order()
    return simulate([[] for _ in range(world)], sim_settings(cost, W, mode="pad", pool=lanes),
                    replicas=replicas, deal=deal or [_measure(i) for i in order], on_round=on_round), order


@pytest.mark.parametrize("world, lanes, W", [(2, 2, 8), (4, 2, 6), (4, 4, 5), (6, 3, 16), (8, 2, 4), (8, 8, 3)])
def test_one_core_per_pool_emits_what_every_rank_replica_emits(world, lanes, W):
    from odb.batching import default_policy
    from odb.core.header import header_layout

    layout, largest = header_layout(default_policy().summary_len, W, lanes), []
    one, order = _pooled(world, lanes, W, on_round=lambda k, posts: largest.append(
        max(layout.decode(p.header).n for p in posts)))
    each, _ = _pooled(world, lanes, W, replicas=True)
    assert one.batches == each.batches and one.rounds == each.rounds
    # a multiple of the pool size, unless the largest pool window held fewer (the table's clamp; none: the stop)
    assert all(t % lanes == 0 or t == max(1, n) for t, n in zip(one.targets, largest)), (one.targets, largest)
    rows = one.batches
    assert len({len(r) for r in rows}) == 1, "every rank runs the same steps"
    got = sorted(p for r in rows for b in r if b for p in b)
    assert got == sorted(p for p, i in enumerate(order) if i not in DROPS), "every usable sample once"
    # every rank of a pool got a real batch at some step: the pool's batches are shared out
    assert all(any(b is not None for b in r) for r in rows)


def test_a_steps_batches_on_a_pools_ranks_are_neighbours_in_fill():
    """Pool batch k (decreasing fill in its round) goes to lane k mod G: within a step, lane 0's batch
    costs at least lane 1's at every step where both are real batches of one round."""
    cost = make_cost_model("padded", BUDGET)
    res, order = _pooled(2, 2, 32)
    sizes = [_measure(i) for i in order]
    a, b = res.batches
    util = lambda bt: cost.utilisation([sizes[p][0] for p in bt])  # noqa: E731
    both = [(x, y) for x, y in zip(a, b) if x and y]
    assert len(both) > 10
    assert sum(util(x) >= util(y) - 1e-9 for x, y in both) == len(both)


def test_pooling_shortens_the_epoch_where_ranks_are_many():
    """Side by side on one epoch (sharegpt4o lengths, 32 ranks, padded): pools of 8 take less step time
    (a step as long as its costliest batch) and fewer steps than every rank alone."""
    from paper_repro.bench_grid import point
    from paper_repro.bench_metrics import metrics

    pt = point("sharegpt4o", 32, 8192, "padded", 512)
    figs = {}
    for lanes in (1, 8):
        sim = simulate([[] for _ in range(32)], sim_settings(pt.cost, 64, mode="pad", pool=lanes), deal=pt.sizes)
        figs[lanes] = metrics(sim.batches, pt.sizes, pt.cost)
    assert figs[8]["step_time"] < 0.98 * figs[1]["step_time"], figs
    assert figs[8]["steps"] <= figs[1]["steps"], figs


def test_the_simulation_refuses_pools_it_cannot_run():
    cost = make_cost_model("padded", BUDGET)
    with pytest.raises(ConfigError, match="does not divide"):
        simulate([[] for _ in range(4)], sim_settings(cost, 4, pool=3), deal=[(3,)] * 10)
    with pytest.raises(ConfigError, match="dealt sharding"):
        simulate([[(3,)]] * 4, sim_settings(cost, 4, pool=2))


# -- the runtime -------------------------------------------------------------------------------------------
def _loader_run(rank, world_size, spec):
    import odb
    from odb.batching.policy import default_policy

    ds = Samples(LENGTHS, drop=DROPS)
    if spec.get("diverge_on") == rank:  # this rank measures its samples otherwise than its pool's other lane
        # (not at the construction check's probed positions, the first and the middle: those refuse it there)
        ds.lengths = [n + (i % 7 == 0 and i not in (0, len(LENGTHS) // 2)) for i, n in enumerate(LENGTHS)]
    loader = odb.ODBDataLoader(ds, BUDGET, id_collate, buffer_size=spec["W"], mode=spec.get("mode", "pad"),
                               placement=odb.Pooled(spec["lanes"]), seed=5, timeout_s=30,
                               trace_dir=spec.get("trace_dir"),
                               num_workers=spec.get("workers", {}).get(rank, 0))
    assert type(loader.policy) is type(default_policy()) and loader.policy.lanes == spec["lanes"]
    out = []
    try:
        for batch in loader:
            if spec.get("break_on") == rank and len(out) == 2:
                break
            info = odb.pop_step_info(batch)
            out.append((None if info.filler else list(info.indices), info.local_samples, info.global_samples,
                        info.local_label_tokens, info.global_label_tokens, info.loss_scale))
    finally:
        loader.close()
    return out


def _failures(res):
    return [(r.status, r.error_type, (r.error or "")[:600]) for r in res]


@pytest.mark.slow
@pytest.mark.parametrize("world, lanes, W", [(4, 2, 8), (4, 4, 4)])
def test_the_pooled_loader_emits_the_simulations_batches_with_global_counts(tmp_path, world, lanes, W):
    from proofs.conformance import assert_conformant

    spec = {"lanes": lanes, "W": W, "trace_dir": str(tmp_path / "trace")}
    res = run_ranks(_loader_run, world, tmp_path, args=(spec,), timeout_s=120)
    assert all(r.status == "ok" for r in res), _failures(res)
    sim, order = _pooled(world, lanes, W)
    want = [[None if b is None else [order[p] for p in b] for b in row] for row in sim.batches]
    got = [[s[0] for s in r.value] for r in res]
    assert got == want
    for step in zip(*(r.value for r in res)):  # every rank's StepInfo: the sums over the ranks of this step
        assert {s[2] for s in step} == {sum(s[1] for s in step)}
        assert {s[4] for s in step} == {sum(s[3] for s in step)}
        if sum(s[3] for s in step):
            assert sum(s[5] for s in step) == pytest.approx(world)  # the ranks' loss scales average to 1
    assert_conformant(str(tmp_path / "trace"))


def _resume_run(rank, world_size, spec):
    import odb

    kw = dict(buffer_size=spec["W"], placement=odb.Pooled(spec["lanes"]), seed=5, timeout_s=30)
    first = odb.ODBDataLoader(Samples(LENGTHS, drop=DROPS), BUDGET, id_collate, **kw)
    a = []
    for k, batch in enumerate(first):
        info = odb.pop_step_info(batch)
        a += list(info.indices)
        if k + 1 == spec["stop"]:  # every rank stops at the same step (a checkpoint)
            break
    state = first.state_dict()
    first.close()
    second = odb.ODBDataLoader(Samples(LENGTHS, drop=DROPS), BUDGET, id_collate, **kw)
    second.load_state_dict(state)
    b = [i for batch in second for i in odb.pop_step_info(batch).indices]
    second.close()
    return a, b


@pytest.mark.slow
@pytest.mark.parametrize("stop", [1, 7])
def test_a_pooled_run_resumed_from_a_checkpoint_emits_every_sample_once(tmp_path, stop):
    """A pool's window holds samples no lane has yielded at the checkpoint; each lane records only what it
    yielded, so the resumed pass deals those again and nothing is lost or repeated."""
    res = run_ranks(_resume_run, 4, tmp_path, args=({"lanes": 2, "W": 8, "stop": stop},), timeout_s=180)
    assert all(r.status == "ok" for r in res), _failures(res)
    got = [i for r in res for part in r.value for i in part]
    assert sorted(got) == sorted(set(range(len(LENGTHS))) - DROPS)
    assert all(r.value[0] for r in res) and all(r.value[1] for r in res)


@pytest.mark.slow
def test_lanes_with_workers_read_their_pools_samples_alike(tmp_path):
    """Each lane's workers read ahead of its core, at the same points on every lane of a pool (the same
    prefetch), so with drops (reserve takes) the lanes still see the same samples in the same order."""
    spec = {"lanes": 2, "W": 8, "workers": {0: 2, 1: 2, 2: 1, 3: 1}}
    res = run_ranks(_loader_run, 4, tmp_path, args=(spec,), timeout_s=180)
    assert all(r.status == "ok" for r in res), _failures(res)
    assert len({len(r.value) for r in res}) == 1
    got = sorted(i for r in res for s in r.value if s[0] for i in s[0])
    assert got == sorted(set(range(len(LENGTHS))) - DROPS)
    for step in zip(*(r.value for r in res)):
        assert {s[2] for s in step} == {sum(s[1] for s in step)}


@pytest.mark.slow
def test_a_lane_that_stops_early_stops_every_rank_and_the_others_are_told_which_pool(tmp_path):
    res = run_ranks(_loader_run, 4, tmp_path, args=({"lanes": 2, "W": 8, "break_on": 3},), timeout_s=120)
    assert res[3].status == "ok" and len(res[3].value) == 2, _failures(res)
    for r in res[:3]:
        assert r.status == "error" and r.error_type == "RankFailure", _failures(res)
        assert "a rank of pool 1 (ranks 2..3) stopped iterating" in r.error, r.error[:500]


@pytest.mark.slow
def test_lanes_that_read_ahead_otherwise_are_refused_on_every_rank(tmp_path):
    res = run_ranks(_loader_run, 4, tmp_path, args=({"lanes": 2, "W": 8, "workers": {0: 2, 3: 1}},), timeout_s=180)
    assert all(r.status == "error" and r.error_type == "ConfigError" and "read ahead [4, 0]" in r.error
               for r in res), _failures(res)


@pytest.mark.slow
def test_pooled_ranks_that_measure_a_sample_otherwise_stop_every_rank_loudly(tmp_path):
    spec = {"lanes": 2, "W": 8, "diverge_on": 3}  # pool 1's second lane
    res = run_ranks(_loader_run, 4, tmp_path, args=(spec,), timeout_s=120)
    assert [r.status for r in res] == ["error"] * 4, _failures(res)
    assert all(r.error_type == "ProtocolError" and "pooled ranks diverged" in r.error for r in res), _failures(res)


@pytest.mark.slow
@pytest.mark.parametrize("lanes, mode, match", [(3, "pad", "does not divide"), (2, "join", "needs mode='pad'")])
def test_a_pool_that_cannot_run_is_refused_on_every_rank(tmp_path, lanes, mode, match):
    res = run_ranks(_loader_run, 4, tmp_path, args=({"lanes": lanes, "W": 8, "mode": mode},), timeout_s=120)
    assert all(r.status == "error" and r.error_type == "ConfigError" and match in r.error for r in res), \
        _failures(res)


@pytest.mark.slow
def test_ranks_that_ask_for_other_pools_are_refused_by_the_construction_check(tmp_path):
    def run(rank, world_size):
        import odb

        odb.ODBDataLoader(Samples(LENGTHS), BUDGET, id_collate, buffer_size=8, placement=odb.Pooled(1 + (rank == 1)),
                          timeout_s=30)
    res = run_ranks(run, 2, tmp_path, timeout_s=120)
    assert all(r.status == "error" and r.error_type == "ConfigError" and "placement" in r.error for r in res), \
        _failures(res)
