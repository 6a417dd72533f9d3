"""`paper_repro.bench_first_batch`: every variant runs in one process group, and a miss names its cause."""

from paper_repro import bench_first_batch as fb


def test_a_tiny_run_times_every_variant_and_the_report_names_each_miss_with_its_cause():
    res = fb.run(windows=(8,), worlds=(1,), ms=0.0, windows_per_epoch=3, repeats=1)
    assert [r["variant"] for r in res["rows"]] == ["none", "full", "default"]
    assert all(r["first_batch_s"] > 0 and r["epoch_s"] >= r["first_batch_s"] and r["steps"] > 0 for r in res["rows"])
    assert [r["resolved"] for r in res["rows"]] == ["None"] * 3  # one rank: the default placement is None
    assert [r["first_window"] for r in res["rows"]] == [None, None, 32]
    slow = {**res, "ms": 2.0, "rows": [{**r, "window": 1024, "first_batch_s": 3.0 + k, "epoch_s": 10.0 + k}
                                       for k, r in enumerate(res["rows"])]}
    text = "\n".join(fb.lines(slow))
    assert "first batch at N=1, W=1024, 2.0 ms samples <= 0.5 s: MISSED (5.00 s" in text
    assert "first_window=32)" in text
    assert "epoch at N=1, W=1024 within 1.01x the full windows': MISSED (1.091x: the first rounds'" in text
    assert "| 1 | 1024 | default: None, 32 | 5.00 s | 2500 | 12.00 s | 1.091 |" in text
    fast = {**slow, "rows": [{**r, "first_batch_s": 0.3, "epoch_s": 10.0} for r in slow["rows"]]}
    text = "\n".join(fb.lines(fast))
    assert "<= 0.5 s: MET" in text and "the full windows': MET" in text
