"""make repro's statistics: paired ratios over rounds, what counts as resolved, the GMT = BMT gauge, the
run-to-run comparison, the length-cache arithmetic and the loop's CPU split (all in-process, fast)."""

import threading
import time

import pytest

from paper_repro import cache_cost, cpu
from paper_repro import repro_stats as st
from paper_repro.cpu import ENGINE_PREFIX, LoopMeter
from paper_repro.report import verdict
from paper_repro.train import keep_attempt, rerun, round_order


def rec(rnd, sps, **kw):
    base = {"round": rnd, "samples_per_s": sps, "steps_per_rank": [10, 10], "samples": 100, "real_tokens": 900,
            "padded_tokens": 1000, "micro_steps": 10, "val_loss": [(0, 7.0), (100, 6.0)], "wall_s": 100 / sps,
            "exactly_once": True}
    return {**base, **kw}


def run(name, methods, cv=None):
    return {"spec": {"name": name, "paper_cv": cv, "repeats": 3}, "world_size": 2,
            "methods": {m: {"method": m, "repeats": [rec(i, v) for i, v in enumerate(vals)]}
                        for m, vals in methods.items()}}


def test_ratios_are_paired_within_a_round_so_a_slow_round_cancels():
    # round 1 is slow for both methods: per-round ratios stay 1.5, a ratio of medians would not see it
    r = run("w", {"odb_pad": [150, 75, 150], "standard1": [100, 50, 100]})
    assert st.paired(r, "odb_pad", "standard1") == pytest.approx([1.5, 1.5, 1.5])
    assert st.ratios(r, "standard1", ["odb_pad", "standard1"]) == {
        "odb_pad": {"med": pytest.approx(1.5), "lo": pytest.approx(1.5), "hi": pytest.approx(1.5), "n": 3}}


def test_a_ratio_is_resolved_only_if_its_range_excludes_one_and_every_other_range():
    rs = {"a": st.spread([1.2, 1.3, 1.4]), "b": st.spread([1.35, 1.5, 1.6]), "c": st.spread([0.9, 1.0, 1.1]),
          "d": st.spread([0.7, 0.8, 0.85])}
    res = st.resolve(rs)
    assert res["a"] == {"vs_one": "above", "overlaps": ["b"]}
    assert res["c"]["vs_one"] == "not resolved" and res["c"]["overlaps"] == []
    assert res["d"] == {"vs_one": "below", "overlaps": []}
    assert verdict(rs["a"], 1.0) == "PASS" and verdict(rs["c"], 1.0) == "NOT RESOLVED"
    assert verdict(rs["d"], 1.0) == "MISS" and verdict(rs["a"], 2.0) == "MISS"


def test_the_gauge_uses_only_rounds_where_gmt_and_bmt_emitted_identical_batches():
    same = run("same", {"gmt": [100, 110, 90], "bmt": [100, 100, 100]})
    other = run("other", {"gmt": [100, 100, 100], "bmt": [80, 80, 80]})
    for r in other["methods"]["bmt"]["repeats"]:
        r["steps_per_rank"] = [11, 11]  # a split larger than one bucket: BMT's batches differ
    g = st.gauge([same, other])
    assert g["skipped"] == ["other"]
    assert [v for _, _, v in g["ratios"]] == pytest.approx([1.0, 1.1, 0.9])
    assert g["spread"]["lo"] == pytest.approx(0.9) and g["spread"]["hi"] == pytest.approx(1.1)


def test_two_runs_agree_when_each_median_lies_in_the_others_range():
    a, b, c = st.spread([1.0, 1.2, 1.4]), st.spread([1.1, 1.3, 1.5]), st.spread([1.5, 1.6, 1.7])
    assert st.agree(a, b) and not st.agree(a, c) and st.agree(a, None) is None
    prev = run("w", {"odb_pad": [140, 150, 160], "standard1": [100, 100, 100]})
    cur = run("w", {"odb_pad": [150, 155, 200], "standard1": [100, 100, 100]})
    rows = {r["what"]: r["agree"] for r in st.compare_runs([prev], [cur])}
    assert rows == {"odb_pad samples/s": True, "odb_pad / standard1": True, "standard1 samples/s": True}
    # ODB against the oracle is compared too: 1.4-1.6 then 1.0-1.1 (paired per round) do not agree
    prev["methods"]["gmt"] = run("w", {"gmt": [100, 100, 100]})["methods"]["gmt"]
    cur["methods"]["gmt"] = run("w", {"gmt": [150, 150, 180]})["methods"]["gmt"]
    rows = {r["what"]: r["agree"] for r in st.compare_runs([prev], [cur])}
    assert rows["odb_pad / gmt"] is False and rows["gmt / standard1"] is False
    # a previous file without rounds (before repeats) is not compared
    old = {"spec": {"name": "w"}, "methods": {"odb_pad": {"samples_per_s": 1.0}}}
    assert st.compare_runs([old], [cur]) == []


def test_the_agreement_to_expect_without_drift_grows_with_the_rounds():
    e = [st.expected_agreement(n, trials=4000) for n in (3, 4, 5, 8)]
    assert e == sorted(e) and 0.55 < e[1] < 0.68 and e[3] > 0.88  # n = 4: about 0.61
    assert st.expected_agreement(4, trials=4000) == e[1]  # seeded: the report prints the same figure every run


def test_ordering_along_cv_is_judged_on_ranges():
    up = [(0.3, st.spread([1.0, 1.1])), (0.5, st.spread([1.2, 1.3])), (0.8, st.spread([1.4, 1.5]))]
    assert st.ordering(up) == "rises"
    assert st.ordering([(x, {**s, "lo": -s["hi"], "hi": -s["lo"]}) for x, s in up]) == "falls"
    tie = [(0.3, st.spread([1.0, 1.25])), (0.5, st.spread([1.2, 1.3]))]
    assert st.ordering(tie).startswith("not resolved") and "0.3->0.5 tie" in st.ordering(tie)


def test_summarize_flags_rounds_that_did_not_emit_the_same_batches():
    r = run("w", {"odb_pad": [150, 150, 150]})
    for x in r["methods"]["odb_pad"]["repeats"]:
        x.update(cpu=[{"main_cpu_s": 0.9, "loader_cpu_s": 0.05, "other_cpu_s": 0.0}] * 2, external_cores=0.1)
    sm = st.summarize(r, "odb_pad")
    assert sm["same_batches"] and sm["val_identical"] and sm["exactly_once"]
    assert sm["loader"]["med"] == pytest.approx(0.05 / (100 / 150))
    r["methods"]["odb_pad"]["repeats"][2]["real_tokens"] = 901
    assert not st.summarize(r, "odb_pad")["same_batches"]


def test_rounds_rotate_and_round_zero_keeps_the_reference_first():
    ms = ["odb_pad", "gmt", "bmt", "standard1"]
    assert [round_order(ms, r) for r in range(3)] == [ms, ms[1:] + ms[:1], ms[2:] + ms[:2]]
    assert round_order(ms, 4) == ms


def test_a_loaded_run_is_rerun_within_its_budget_and_the_least_loaded_attempt_is_kept():
    spec = {"max_load_cores": 0.15, "retries": 2, "retry_budget_s": 30.0}
    a = [{"external_cores": 0.9, "samples_per_s": 50.0, "wall_s": 10.0}]
    assert rerun(a, 0.0, spec) and not rerun(a, 30.0, spec)  # budget spent
    assert not rerun([{**a[0], "external_cores": 0.1}], 0.0, spec)  # quiet enough
    assert not rerun([{**a[0], "external_cores": None}], 0.0, spec)  # no /proc: never rerun
    three = a + [{"external_cores": 0.3, "samples_per_s": 70.0, "wall_s": 7.0},
                 {"external_cores": 0.5, "samples_per_s": 90.0, "wall_s": 5.0}]
    assert not rerun(three, 0.0, spec)  # retries spent
    # chosen on the machine's load, not on the run's own speed (the fastest attempt is not kept)
    k = keep_attempt(three, spec)
    assert k["samples_per_s"] == 70.0 and k["loaded"] and [x["samples_per_s"] for x in k["attempts"]] == [50.0, 90.0]


def test_length_cache_views_and_extrapolation_arithmetic():
    v = cache_cost.views(samples=1000, epochs=2, loop_s=10.0, cache_s=5.0)
    assert v["loop"] == 100 and v["amortized"] == pytest.approx(1000 / 15)
    assert v["one_epoch"] == pytest.approx(500 / 10) and v["cache_over_epoch"] == 1.0
    prices = {k: {"ms": 2.0, "mean_len": 100.0} for k in cache_cost.PIPELINES}
    spec = {"kind": "lengths", "cache_pipeline": "mm", "num_train": 2048}
    assert cache_cost.charge_s(prices, spec, 2) == pytest.approx(2e-3 * 1024)
    assert cache_cost.charge_s(prices, {**spec, "kind": "text"}, 2) is None
    for r in cache_cost.extrapolate(prices):
        # the share of one epoch is c * R / P whatever the split's size
        n0, n1 = cache_cost.PAPER_SIZES
        assert r["seconds"][n0] / r["epoch_s"][n0] == pytest.approx(r["share_per_gpu"])
        assert r["seconds"][n1] / r["epoch_s"][n1] == pytest.approx(r["share_per_gpu"])
        assert r["share_workers"] == pytest.approx(r["share_per_gpu"] / cache_cost.WORKERS_PER_GPU)
    text = next(r for r in cache_cost.extrapolate(prices) if r["pipeline"] == "text")
    assert text["ms"] == pytest.approx(2.0 * 1300 / 100)  # scaled by tokens to the dataset's mean length


def _spin(seconds):
    t = time.thread_time()
    while time.thread_time() - t < seconds:
        pass


def test_loop_meter_charges_an_engine_thread_to_the_loader_and_the_training_thread_to_main():
    m = LoopMeter()
    m.start()
    th = threading.Thread(target=_spin, args=(0.25,), name=ENGINE_PREFIX + "0")
    th.start()
    while th.is_alive():
        m.poll()
        time.sleep(0.01)
    _spin(0.15)
    m.stop()
    r = m.result()
    if r["machine_busy_s"] is None:
        pytest.skip("no /proc on this platform")
    assert r["loader_cpu_s"] == pytest.approx(0.25, abs=0.06)  # /proc ticks are 10 ms
    assert r["main_cpu_s"] == pytest.approx(0.15, abs=0.05)
    assert r["proc_cpu_s"] >= r["main_cpu_s"] + r["loader_cpu_s"] - 0.03
    assert r["machine_busy_s"] >= 0.3


def test_the_reference_workload_is_fixed_and_a_changed_one_is_refused(monkeypatch):
    # result files compare by the reference's time only while the workload stays the same
    assert cpu._reference() == cpu.REFERENCE_CHECKSUM
    assert cpu.reference_ms(1) > 0
    monkeypatch.setattr(cpu, "_reference", lambda: cpu.REFERENCE_CHECKSUM + 1)
    with pytest.raises(RuntimeError, match="changed"):
        cpu.reference_ms(1)


def test_every_grid_spec_is_valid_and_meets_the_stated_repeat_and_gauge_targets():
    from paper_repro.repro import BUDGET, full_specs, quick_specs
    from paper_repro.spec import RunSpec

    for grid in (quick_specs(), full_specs()):
        for s in grid:
            assert RunSpec.of(s) == s  # complete and typed: nothing added after validation is unknown
            assert s["repeats"] >= BUDGET["rounds_min"] and s["num_train"] % 2 == 0
            if s["kind"] == "lengths":
                assert s["cache_pipeline"] in cache_cost.PIPELINES
            if "gmt" in s["methods"] and "bmt" in s["methods"] and s["kind"] != "mm":
                # the gauge needs BMT to emit GMT's batches: the split fits one bucket (mm: stale cache aside)
                assert s["num_train"] <= s["bmt_bucket"]
    assert all("bmt" in s["methods"] for s in quick_specs())


def test_the_run_comparison_says_how_much_agreement_no_change_would_give():
    from paper_repro.report import _compare_section

    prev = run("w", {"odb_pad": [140, 150, 160, 150], "standard1": [100, 100, 100, 100]})
    cur = run("w", {"odb_pad": [150, 155, 200, 150], "standard1": [100, 100, 100, 100]})
    text = "\n".join(_compare_section([prev], [cur]))
    assert "Ratios: 1 of 1 agree" in text and f"{st.expected_agreement(4):.0%} of quantities" in text
    assert "| w | odb_pad / standard1 |" in text
    assert "nothing to compare" in "\n".join(_compare_section([], [cur]))
