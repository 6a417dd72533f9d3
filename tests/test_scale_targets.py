"""The tally of issue 15's targets over every committed scale grid (`paper_repro.scale_targets`)."""

import copy
import json
import math
import re
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def rows():
    from paper_repro.scale_grid import run_point

    return [run_point("sharegpt4o", 4, 16, 4096, "padded", 64), run_point("mmmix", 4, 16, 4096, "packed", 64)]


@pytest.fixture
def small_scope(monkeypatch):
    from paper_repro import scale_targets

    monkeypatch.setitem(scale_targets.TARGETS, "min_world", 2)
    monkeypatch.setitem(scale_targets.TARGETS, "min_window", 16)


def test_merge_keeps_a_point_once_unites_its_methods_and_refuses_files_that_disagree(rows):
    from paper_repro.scale_targets import merge

    a, b = copy.deepcopy(rows[0]), copy.deepcopy(rows[0])
    b["point_s"], b["methods"]["gmt"]["sim_s"] = 123.0, 9.0  # wall times differ run to run: not a disagreement
    only = b["methods"].pop("bmt")
    b["methods"]["extra"] = {"straggler_eff": 1.0}
    merged = merge({"x.json": {"rows": [a]}, "y.json": {"rows": [b, rows[1]]}})
    assert len(merged) == 2 and merged[0]["methods"]["bmt"] == only and merged[0]["methods"]["extra"]
    assert len(rows[0]["methods"]) + 1 == len(merged[0]["methods"])
    bad = copy.deepcopy(rows[0])
    bad["methods"]["odb_dealt"]["steps"] += 1
    with pytest.raises(ValueError, match="odb_dealt.*different figures"):
        merge({"x.json": {"rows": [a]}, "y.json": {"rows": [bad]}})
    other = copy.deepcopy(rows[0])
    other["budget"] *= 2
    with pytest.raises(ValueError, match="budget"):
        merge({"x.json": {"rows": [a]}, "y.json": {"rows": [other]}})


def test_the_dealing_bound_is_the_straggler_over_its_ceiling(rows, small_scope):
    from paper_repro.scale_targets import dealing_lines

    r = copy.deepcopy(rows[0])
    m = r["methods"]["odb_dealt"]
    m["straggler_eff"], m["straggler_ceiling"], m["predicted"]["straggler_eff"] = 0.90, 0.95, 0.93
    lines = [x for x in dealing_lines([r]) if x.startswith("- ODB (dealt, placement=None)")]
    assert "0.930-0.930, below 0.97 at 1/1" in lines[0]
    share = math.log(1 / 0.95) / math.log(1 / 0.90)
    assert f"explain {share:.0%} of the lost balance" in lines[1]
    assert f"would be {0.90 / 0.95:.3f}-{0.90 / 0.95:.3f} (now 0.900-0.900), >= 0.97 at 0/1 points (now 0)" in lines[1]
    m["straggler_eff"], m["straggler_ceiling"] = 0.96, 0.985  # level totals would lift this one over the target
    assert ">= 0.97 at 1/1 points (now 0)" in dealing_lines([r])[1]
    m["straggler_eff"] = m["straggler_ceiling"] = 1.0
    assert "no lost balance to explain" in dealing_lines([r])[1]


def test_the_per_window_lines_count_each_windows_misses_and_losses(rows, small_scope):
    from paper_repro.scale_targets import window_lines

    a, b = copy.deepcopy(rows[0]), copy.deepcopy(rows[1])
    b["window"] = 32
    for r, thr in ((a, 0.95), (b, 0.99)):
        m = r["methods"]["odb_dealt"]
        m["throughput_vs_gmt"], m["steps_vs_gmt"] = thr, 1.0
    a["methods"]["odb_dealt"]["steps_vs_gmt"] = 1.06
    a["methods"]["bmt"]["predicted"]["samples_per_s"] = a["methods"]["odb_dealt"]["predicted"]["samples_per_s"]  # a tie
    for peer in ("gmt_shuffled", "hf_rebalance", "dp_balanced", "release_reimpl"):
        for r in (a, b):
            if peer in r["methods"]:
                r["methods"][peer]["predicted"]["samples_per_s"] = (
                    0.5 * r["methods"]["odb_dealt"]["predicted"]["samples_per_s"])
    b["methods"]["bmt"]["predicted"]["samples_per_s"] = 0.5 * b["methods"]["odb_dealt"]["predicted"]["samples_per_s"]
    lines = [x for x in window_lines([a, b]) if x.startswith("- ODB (dealt, placement=None)")]
    assert lines[0].startswith("- ODB (dealt, placement=None) at W = 16: 1 points; predicted throughput 0.950-0.950")
    assert "below 0.97 at 1; not faster than a peer it must beat in 1 comparisons; steps over 1.05 x GMT's at 1" \
        in lines[0]
    assert "below 0.97 at 0; not faster than a peer it must beat in 0 comparisons; steps over 1.05 x GMT's at 0" \
        in lines[1] and "W = 32" in lines[1]


def test_the_tally_leaves_stale_files_out_and_names_every_file(rows, small_scope, tmp_path, monkeypatch):
    from paper_repro import provenance, scale_targets

    monkeypatch.setattr(provenance, "fingerprint", lambda *a, **k: "F")
    stale = copy.deepcopy(rows[1])
    stale["methods"]["odb_dealt"]["steps"] += 5  # would disagree, but its file is from other code: left out
    for name, fp, rs in (("scale_grid_a.json", "F", rows[:1]), ("scale_grid_b.json", "G", [stale]),
                         ("scale_grid_c.json", None, rows[1:])):
        res = {"rows": rs} if fp is None else {"rows": rs, "provenance": {"commit": "abc", "dirty": False,
                                                                          "fingerprint": fp}}
        (tmp_path / name).write_text(json.dumps(res))
    (tmp_path / "quality_sim.json").write_text(json.dumps({"results": []}))  # not a scale grid: not read
    lines, merged = scale_targets.tally(tmp_path)
    assert len(merged) == 2 and "2 points at N >= 2, W >= 16" in lines[0]
    text = "\n".join(lines)
    assert "`scale_grid_a.json`: current (from abc); 1 points, 1 in scope" in text
    assert "`scale_grid_c.json`: unstamped" in text and "left out, STALE: `scale_grid_b.json`" in text
    assert "- ODB (dealt, placement=None): predicted throughput >= 0.97 x sorted GMT's: " in text  # `target_lines` ran
    assert "- ODB (dealt, placement=None) at W = 16: 2 points" in text  # the per-window lines, on both merged points
    assert scale_targets.main([str(tmp_path)]) == 0
    assert next(tmp_path.glob("scale_targets_*.md")).read_text() == text
    for p in tmp_path.glob("scale_grid_[ac].json"):
        p.unlink()
    with pytest.raises(SystemExit, match="no current scale grid"):
        scale_targets.tally(tmp_path)


def test_the_committed_grids_agree_where_they_overlap_and_the_committed_tally_is_theirs(tmp_path):
    from paper_repro.scale_targets import PLOTS, plots, tally

    lines, merged = tally()  # raises if two committed files give one point different figures
    drawn = plots(merged, tmp_path)  # every method against N, the exchange rows among them
    assert [w for w, _ in drawn] == [w for w, _ in PLOTS] and all(Path(p).stat().st_size > 10_000 for _, p in drawn)
    n = int(re.search(r"\((\d+) points at N >= 64", lines[0]).group(1))
    committed = (Path(__file__).resolve().parents[1] / "paper_repro" / "results"
                 / "scale_targets_202612.md").read_text()
    assert f"({n} points at N >= 64" in committed.splitlines()[0]
    worst = re.search(r"ODB \(dealt, placement=None\): predicted throughput .*MISSED at (\d+)/(\d+) points; "
                      r"worst ([\d.]+)",
                      "\n".join(lines))
    assert worst and worst.group(0) in committed, "the committed scale_targets file is not the tally's: rerun it"


def test_the_exchange_rows_run_the_core_beside_gmt_and_merge_with_the_grids_point(small_scope):
    from paper_repro.scale_grid import (
        LABELS,
        POOLED,
        POOLED_X,
        POOLED_XB,
        SLACK,
        TARGETS,
        exchange_point,
        run_point,
        target_lines,
    )
    from paper_repro.scale_targets import merge

    p = ("sharegpt4o", 16, 16, 4096, "padded", 96)
    grid, ex = run_point(*p, pooled=True), exchange_point(*p)
    assert set(ex["methods"]) == {"gmt", POOLED_X}
    m, pooled = ex["methods"][POOLED_X], grid["methods"][POOLED]
    assert m["steps"] == pooled["steps"] and m["rounds"] == pooled["rounds"] + 1  # the same batches, one flush round
    assert 0 < m["moved_batches"] < 0.5 and m["straggler_eff"] != pooled["straggler_eff"]
    (merged,) = merge({"grid": {"rows": [grid]}, "exchange": {"rows": [ex]}})  # GMT recomputed alike, or it raises
    assert {POOLED_X, POOLED, "odb_dealt", "hf_rebalance"} <= set(merged["methods"])
    lines = "\n".join(target_lines({"targets": TARGETS, "rows": [merged]}))
    assert f"- {LABELS[POOLED_X]}: predicted throughput" in lines
    assert f"- {LABELS[POOLED_X]} must beat HF rebalance" in lines
    bal = exchange_point(*p, slack=SLACK)  # budget balance: the same batches, planned with the slack
    assert set(bal["methods"]) == {"gmt", POOLED_XB} and bal["methods"]["gmt"] == ex["methods"]["gmt"]
    b = bal["methods"][POOLED_XB]
    assert b["steps"] == m["steps"] and b["rounds"] == m["rounds"] and b["straggler_eff"] != m["straggler_eff"]
    (merged,) = merge({"grid": {"rows": [grid]}, "exchange": {"rows": [ex]}, "balanced": {"rows": [bal]}})
    assert {POOLED_X, POOLED_XB} <= set(merged["methods"])
    assert f"- {LABELS[POOLED_XB]}: straggler efficiency" in "\n".join(target_lines({"targets": TARGETS,
                                                                                      "rows": [merged]}))
