"""`paper_repro.defaults_grid`: the committed figures of the default configuration are today's default's, and its
report names every miss with its cause."""

from __future__ import annotations

import copy
import glob
import json
import os

import pytest

from paper_repro import defaults_grid as dg
from paper_repro.scale_grid import RESULTS, without_timings

FILES = sorted(glob.glob(os.path.join(RESULTS, "defaults_grid_*.json")))


def _committed() -> dict:
    assert FILES, "no committed defaults_grid_*.json: run python -m paper_repro.defaults_grid --run"
    with open(FILES[-1]) as f:
        return json.load(f)


def test_the_committed_rows_ran_the_placement_and_first_window_todays_default_resolves_to():
    from odb import LoaderSettings

    res = _committed()
    assert dg.FIRST_WINDOW == LoaderSettings(token_budget=64).first_window
    # the 80 points, less at most the five costliest, with today's default or (a run cut short) the earlier one's
    assert len(set(res["rows"]) | set(res.get("previous", {}))) >= 75
    for key, m in res["rows"].items():
        world = int(key.split(" N=")[1].split()[0])
        placed = LoaderSettings(token_budget=64).resolved(world, "dealt").placement
        assert m["placement"] == (None if placed is None else placed.as_dict()), key
        assert m["first_window"] == dg.FIRST_WINDOW and 0 < m["first_wait"], key


@pytest.mark.slow  # one grid point (3 s)
def test_a_committed_point_is_what_todays_code_computes():
    res = _committed()
    pts = {dg._key(r): r for r in dg.grid_points()}
    key = "llava N=64 W=256 packed 2048/rank"
    assert without_timings(dg.default_point(pts[key])) == without_timings(res["rows"][key])


def test_the_report_tallies_the_default_beside_the_opt_ins_and_names_each_miss_with_its_cause():
    res = _committed()
    lines = dg.report(res)
    assert any(line.startswith(f"| ODB default (placement='auto', first_window={dg.FIRST_WINDOW}) |") for line in lines)
    assert any(line.startswith("| ODB placement=None (the paper's) |") for line in lines)
    bad = copy.deepcopy(res)
    key = next(iter(bad["rows"]))
    bad["rows"][key]["straggler_eff"] = 0.5
    bad["rows"][key]["steps_vs_gmt"] = 1.2
    missed = [line for line in dg.report(bad) if line.startswith(f"- {key}:")]
    assert len(missed) == 1 and "straggler 0.500 (its ceiling" in missed[0] and "steps 1.200 x GMT's" in missed[0]


def test_the_committed_summary_holds_the_sections_its_generator_writes_from_the_committed_runs():
    from paper_repro.report import defaults_section, first_batch_section

    summary = open(os.path.join(RESULTS, "SUMMARY.md")).read()
    for section in (defaults_section(RESULTS), first_batch_section(RESULTS)):
        assert section and "\n".join(section) in summary
