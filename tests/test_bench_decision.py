"""One rank replayed on recorded headers (`odb.core.sim.replay_rank`, `paper_repro.bench_decision`)."""

import pytest

from odb.batching import make_cost_model
from odb.core.header import Post, reduce_posts
from odb.core.sim import replay_rank, simulate
from odb.errors import ProtocolError
from paper_repro.distributions import sample_lengths
from simkit import sim_settings


def _record(world=4, window=16, per_rank=48, stop=None):
    sizes = sample_lengths("sharegpt4o", world * per_rank, 3)
    cost = make_cost_model("padded", 4096)
    posts = []

    def keep(k, p):
        assert k == len(posts)
        posts.append(list(p))
        return stop is not None and len(posts) >= stop

    res = simulate([[] for _ in range(world)], sim_settings(cost, window), deal=sizes, on_round=keep)
    return sizes, cost, posts, res


def _rounds(posts, r):
    return [(p[r], reduce_posts(p)) for p in posts]


def test_every_rank_replayed_alone_posts_the_header_it_posted_in_the_simulation():
    sizes, cost, posts, res = _record()
    assert res.rounds == len(posts) >= 3
    for r in range(4):
        got = replay_rank(r, _rounds(posts, r), [[] for _ in range(4)], sim_settings(cost, 16), deal=sizes)
        assert len(got) == len(posts)
        assert all(v >= 0 for row in got for v in row.values())
        assert sum(row["policy_s"] for row in got) > 0


def test_a_replay_fed_another_runs_headers_is_refused():
    sizes, cost, posts, _ = _record()
    bad = _rounds(posts, 2)
    mine, g = bad[1]
    bad[1] = (Post(mine.header, [mine.counts[0] + 1, *mine.counts[1:]]), g)  # another round-1 post than rank 2's
    with pytest.raises(ProtocolError, match="round 1's post differs"):
        replay_rank(2, bad, [[] for _ in range(4)], sim_settings(cost, 16), deal=sizes)


def test_on_round_ends_the_simulation_where_it_says():
    _, _, posts, res = _record(stop=2)
    assert len(posts) == 2 and res.rounds == 1  # the second round's headers were seen, not collected


@pytest.mark.slow  # a subprocess replays (imports odb; ~5 s)
def test_decision_at_scale_end_to_end_on_a_small_point():
    from paper_repro.bench_decision import decision_at_scale

    out = decision_at_scale(world=4, window=16, budget=4096, per_rank=64, rounds=3, passes=2)
    assert out["rounds"] == 3 and out["samples"] == 6
    assert out["reference_ms_before_replay"] > 0  # the machine's speed at the replay, beside the figures
    assert out["transport"] == "gather"  # 4 ranks: every rank's header and 3W counts gathered
    assert out["received_bytes"] == 4 * (out["header_bytes"] + 8 * 3 * 16)
    for part in ("policy", "collect", "decode", "decision", "local"):
        assert 0 <= out[part]["median_ms"] <= out[part]["p99_ms"] <= out[part]["max_ms"]
        assert len(out[part]["round_medians_ms"]) == 3 and max(out[part]["round_medians_ms"]) <= out[part]["max_ms"]
        f = out["gc_frozen"][part]  # the second replay, after gc.freeze()
        assert 0 <= f["median_ms"] <= f["p99_ms"] <= f["max_ms"]
    # the whole decision is the decoding and the WAIT row of each round
    assert out["decision"]["max_ms"] <= out["decode"]["max_ms"] + out["collect"]["max_ms"] + 1e-9
    assert out["plan"]["max_ms"] == 0  # no exchange, no plan
    assert set(out["verdicts"]) == {"policy_median_ms", "policy_p99_ms", "decision_median_ms", "decision_p99_ms"}
    assert out["verdicts"]["decision_median_ms"] == (out["decision"]["median_ms"] < 1.0)


def test_a_frozen_replay_freezes_what_its_process_holds_before_the_rank_is_built(tmp_path):
    import gc

    from paper_repro.bench_decision import record, replay

    a = dict(dist="sharegpt4o", world=4, window=16, budget=4096, kind="padded", per_rank=64, seed=0, rounds=3,
             passes=1, rank=1, pool_size=1)
    record(a, str(tmp_path / "posts.npz"))
    before = gc.get_freeze_count()
    try:
        assert len(replay(a, str(tmp_path / "posts.npz"))) == 3 and gc.get_freeze_count() == before
        assert len(replay(dict(a, gc_freeze=True), str(tmp_path / "posts.npz"))) == 3
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()


def test_a_pooled_lane_replayed_alone_posts_its_header_and_counts_and_the_pools_posts_stand_for_its_lanes():
    """Pooled windows: every lane replayed on its exact run (every rank's own core) posts what it posted;
    the one-core-per-pool run's posts, each pool's header G times, are the N headers the transport hands
    a lane and their summed counts the reduced totals (the maxima: an upper bound), as bench_decision
    records them."""
    from paper_repro.bench_decision import as_rank_sees

    world, G, window = 4, 2, 8
    sizes = sample_lengths("sharegpt4o", world * 48, 3)
    cost = make_cost_model("padded", 4096)
    exact, pooled = [], []
    simulate([[] for _ in range(world)], sim_settings(cost, window, pool=G),
             deal=sizes, replicas=True, on_round=lambda k, p: exact.append(list(p)))
    simulate([[] for _ in range(world)], sim_settings(cost, window, pool=G),
             deal=sizes, on_round=lambda k, p: pooled.append(list(p)))
    assert len(exact) == len(pooled) >= 3
    for ex, po in zip(exact, pooled):
        g, h = reduce_posts(ex), reduce_posts(po)
        assert [list(x) for x in g.rows] == [list(po[r // G].header) for r in range(world)]
        assert list(g.totals) == list(h.totals)
        assert all(a <= b for a, b in zip(g.tokens_max, h.tokens_max))
    assert any(a < b for ex, po in zip(exact, pooled)
               for a, b in zip(reduce_posts(ex).tokens_max, reduce_posts(po).tokens_max))  # the bound is not exact
    for r in range(world):
        got = replay_rank(r, _rounds(exact, r), [[] for _ in range(world)], sim_settings(cost, window, pool=G),
                          deal=sizes)
        assert len(got) == len(exact)
        as_recorded = [as_rank_sees(po[r // G], reduce_posts(po), G) for po in pooled]  # as bench_decision feeds it
        assert all(g.rows.tolist() == [list(po[q // G].header) for q in range(world)] and mine.counts is None
                   for (mine, g), po in zip(as_recorded, pooled))
        assert len(replay_rank(r, as_recorded, [[] for _ in range(world)], sim_settings(cost, window, pool=G),
                               deal=sizes)) == len(pooled)
    wrong = _rounds(exact, 1)  # lane 1 fed as lane 0: its own counts differ
    with pytest.raises(ProtocolError, match="post differs"):
        replay_rank(0, wrong, [[] for _ in range(world)], sim_settings(cost, window, pool=G), deal=sizes)


@pytest.mark.slow  # a subprocess replays (imports odb; ~5 s)
def test_decision_at_scale_pooled_end_to_end_on_a_small_point():
    from paper_repro.bench_decision import decision_at_scale

    out = decision_at_scale(world=4, window=8, budget=4096, per_rank=64, rounds=3, passes=2, pool_size=2, rank=3)
    assert out["rounds"] == 3 and out["samples"] == 6 and out["pool_size"] == 2
    assert out["policy"]["median_ms"] > 0


@pytest.mark.parametrize("pool, slack", [(1, 0), (2, 125)])
def test_an_exchanging_rank_replayed_alone_receives_what_the_simulation_moved_and_posts_what_it_posted(pool, slack):
    """With the round exchange the replayed rank plans every round and is handed, by origin slot, the batches
    the simulation moved into its core (`simulate`'s ``on_moved``).  Unpooled, its posts' counts are checked
    too, and they hold the received batches' counts: a replay that received other batches would be refused."""
    world, window = 4, 16
    sizes = sample_lengths("sharegpt4o", world * 64, 3)
    cost = make_cost_model("padded", 4096)
    posts, moved = [], []
    settings = sim_settings(cost, window, pool=pool, exchange=True, slack_bp=slack)

    def on_moved(k, m):
        moved.append({c: {o: (b.positions, b.indices, b.sizes, b.counts) for o, b in got.items()}
                      for c, got in m.items()})
    res = simulate([[] for _ in range(world)], settings, deal=sizes, on_round=lambda k, p: posts.append(list(p)),
                   on_moved=on_moved)
    assert res.moved > 0 and len(moved) == res.rounds == len(posts)
    for r in range(world):
        mine = r // pool
        rounds = [(p[mine], reduce_posts(p)) for p in posts]
        if pool > 1:
            from paper_repro.bench_decision import as_rank_sees

            rounds = [as_rank_sees(p[mine], reduce_posts(p), pool) for p in posts]
        got = replay_rank(r, rounds, [[] for _ in range(world)], settings, deal=sizes,
                          received=[m.get(mine, {}) for m in moved])
        assert len(got) == len(posts) and sum(row["receive_s"] > 0 for row in got) >= 1
        # every round but the last (the flush round plans nothing) plans the previous one, inside its collect
        assert all(0 < row["plan_s"] < row["collect_s"] for row in got[1:-1]) and got[-1]["plan_s"] == 0
    taken = next(k for k, m in enumerate(moved) if m.get(0))
    lacking = [dict(m.get(0, {})) for m in moved]
    lacking[taken].popitem()
    with pytest.raises(ProtocolError, match="the recording lacks"):
        replay_rank(0, [(p[0], reduce_posts(p)) for p in posts] if pool == 1 else
                    [as_rank_sees(p[0], reduce_posts(p), pool) for p in posts], [[] for _ in range(world)], settings,
                    deal=sizes, received=lacking)


@pytest.mark.slow  # subprocesses replay (imports odb; ~10 s)
def test_decision_at_scale_with_the_exchange_end_to_end_on_a_small_point():
    from paper_repro.bench_decision import decision_at_scale

    out = decision_at_scale(world=8, window=8, budget=4096, per_rank=64, passes=2, pool_size=2, rank=3,
                            exchange=True, exchange_slack=125)
    assert out["exchange"] and out["exchange_slack"] == 125 and out["rounds"] >= 3
    assert out["collect"]["median_ms"] > 0 and out["decision"]["max_ms"] >= out["collect"]["max_ms"]
    assert 0 < out["plan"]["median_ms"] < out["collect"]["median_ms"]
    cut = decision_at_scale(world=8, window=8, budget=4096, per_rank=64, rounds=3, passes=2, pool_size=2, rank=3,
                            exchange=True)  # the third round's moves are recorded although the recording stops
    assert cut["rounds"] == 3 and cut["samples"] == 6


def test_a_replays_times_are_parts_of_its_wall_time():
    """Each figure `replay_rank` returns is a duration inside the replay: never more than its wall time."""
    import time

    sizes, cost, posts, _ = _record()
    t0 = time.perf_counter()
    got = replay_rank(1, _rounds(posts, 1), [[] for _ in range(4)], sim_settings(cost, 16), deal=sizes)
    wall = time.perf_counter() - t0
    for key in got[0]:
        assert 0 <= sum(row[key] for row in got) <= wall, key
