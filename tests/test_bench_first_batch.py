"""`paper_repro.bench_first_batch`: both placements run in one process group, and a miss names its cause."""

from paper_repro import bench_first_batch as fb


def test_a_tiny_run_times_both_placements_and_the_report_names_each_miss_with_its_cause():
    res = fb.run(windows=(8,), worlds=(1,), ms=0.0, windows_per_epoch=3, repeats=1)
    assert [r["placement"] for r in res["rows"]] == ["none", "default"]
    assert all(r["first_batch_s"] > 0 and r["epoch_s"] >= r["first_batch_s"] and r["steps"] > 0 for r in res["rows"])
    assert res["rows"][0]["resolved"] == res["rows"][1]["resolved"] == "None"  # one rank: the default is None
    slow = {**res, "ms": 2.0, "rows": [{**r, "window": 1024, "first_batch_s": 3.0 + k, "epoch_s": 10.0 + k}
                                       for k, r in enumerate(res["rows"])]}
    text = "\n".join(fb.lines(slow))
    assert "first batch at N=1, W=1024, 2.0 ms samples <= 0.5 s: MISSED (4.00 s" in text
    assert "epoch at N=1, W=1024 within 1.01x placement=None's: MISSED (1.100x: the same placement resolved" in text
    fast = {**slow, "rows": [{**r, "first_batch_s": 0.3, "epoch_s": 10.0} for r in slow["rows"]]}
    text = "\n".join(fb.lines(fast))
    assert "<= 0.5 s: MET" in text and "placement=None's: MET" in text
