"""`paper_repro.bench_exchange` on 2 gloo ranks: the three modes run side by side, and the figures are the loader's."""


def test_the_bench_runs_each_mode_and_scores_the_budget_cost_per_step():
    from paper_repro.bench_exchange import measure

    fig = measure(world=2, window=64, samples_per_rank=512, passes=1, slack=500)
    s = fig["summary"]
    assert set(s) == {"plain", "exchange", "balanced"}
    assert s["plain"]["batches_moved_per_pass"] == 0 and s["plain"]["exchange_s_mean"] == 0
    for mode in ("plain", "exchange", "balanced"):
        x = s[mode]
        assert x["samples_per_pass"] == 1024  # every sample once a pass, in each mode
        assert 0.5 < x["straggler_budget_mean"] <= 1 and 0.5 < x["straggler_tokens_mean"] <= 1
    assert s["plain"]["straggler_budget_mean"] < 1  # the loader alone leaves steps unequal: the figure can move
    for mode in ("exchange", "balanced"):
        assert s[mode]["batches_moved_per_pass"] > 0 and 0 < s[mode]["moved_fraction"] < 1
    assert [run["mode"] for run in fig["ranks"][0]] == ["plain", "exchange", "balanced"]


def test_the_plan_cpu_bench_times_the_core_s_calls_on_a_round_of_the_headers_shape():
    from paper_repro.bench_exchange import plan_cpu

    rows = plan_cpu(worlds=(16,), steps=(4,), slacks=(0, 125), reps=2)
    assert [(r["world"], r["steps"], r["slack"], r["batches"]) for r in rows] == [(16, 4, 0, 64), (16, 4, 125, 64)]
    assert all(0 <= r["cpu_ms"] <= r["median_ms"] for r in rows)
