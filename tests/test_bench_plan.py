"""`paper_repro.bench_plan`: the planner's wall time per point, against a target written as data."""

from paper_repro import bench_plan


def test_the_benchmark_times_each_point_and_names_a_miss_with_its_work(monkeypatch):
    res = bench_plan.run([(600, 2)])
    (row,) = res["rows"]
    assert row["lengths"] == 600 and row["world_size"] == 2 and row["samples_per_rank"] == 300
    assert row["candidates"] == 2 * 3 * 2 and row["windows_cut"] == [1024, 2048, 4096]  # 256 and 300 a rank
    assert row["default_seconds"] > 0 and row["default_jobs"] == 1  # 7,200 sample runs: no pool
    assert row["seconds"] > 0 and row["meets"] == (row["seconds"] <= bench_plan.TARGETS["seconds"])
    monkeypatch.setitem(bench_plan.TARGETS, "seconds", 0.0)
    row["meets"] = False
    assert "miss: 600 samples x 12 candidates simulated, each round 2 cores deciding on 2 headers" in \
        bench_plan.lines(res)[-1] and "(1 processes)" in bench_plan.lines(res)[-1]
