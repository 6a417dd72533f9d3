"""Result provenance (`paper_repro.provenance`): the fingerprint of what the grid computes, and the check that
tells a result file made by today's code from one made by code that computes otherwise."""

import json

import pytest


def test_the_fingerprint_is_the_grids_figures_without_wall_times_and_a_rule_change_moves_it(monkeypatch):
    from odb.batching import policy
    from paper_repro import provenance

    a = provenance.fingerprint()
    assert a == provenance.fingerprint()  # wall times left out: the same code gives the same fingerprint
    assert provenance.fingerprint(probes=()) != a != provenance.fingerprint(quality_probes=())  # both grids count
    monkeypatch.setattr(policy, "fill_bucket", lambda fill: policy.NUM_BUCKETS - 1)  # the policy's rule 4 blinded
    assert provenance.fingerprint() != a


def test_timing_keys_are_left_out_wherever_they_sit():
    from paper_repro.scale_grid import without_timings as _computed

    x = {"methods": {"odb": {"sim_s": 1.5, "steps": 3, "predicted": {"samples_per_s": 2.0, "seconds": 9.0}}},
         "point_s": 4.0, "rows": [{"plan_s": 1.0, "steps": 2}]}
    assert _computed(x) == {"methods": {"odb": {"steps": 3, "predicted": {"samples_per_s": 2.0, "seconds": 9.0}}},
                            "rows": [{"steps": 2}]}


def test_the_check_names_each_result_current_stale_or_unstamped(tmp_path, monkeypatch):
    from paper_repro import provenance

    (tmp_path / "a.json").write_text(json.dumps({"provenance": {"commit": "abc", "dirty": False, "fingerprint": "F"}}))
    (tmp_path / "b.json").write_text(json.dumps({"provenance": {"commit": "def", "dirty": True, "fingerprint": "G"}}))
    (tmp_path / "c.json").write_text(json.dumps({"rows": []}))
    (tmp_path / "d.json").write_text("not json")
    assert provenance.check(tmp_path, current="F") == [
        ("a.json", "current", "abc"), ("b.json", "STALE", "def (dirty)"), ("c.json", "unstamped", ""),
        ("d.json", "unstamped", "")]
    (tmp_path / "b.json").unlink()
    monkeypatch.setattr(provenance, "fingerprint", lambda *a, **k: "F")
    assert provenance.main([str(tmp_path), "--strict"]) == 0
    monkeypatch.setattr(provenance, "fingerprint", lambda *a, **k: "H")  # the code computes otherwise
    assert provenance.main([str(tmp_path), "--strict"]) == 1 and provenance.main([str(tmp_path)]) == 0


def test_a_stamp_names_the_commit_and_whether_the_tree_was_dirty(monkeypatch):
    from paper_repro import provenance, scale_grid

    monkeypatch.setattr(scale_grid, "fingerprint", lambda *a, **k: "F")
    s = provenance.stamp()
    assert s["fingerprint"] == "F" and set(s) == {"commit", "dirty", "fingerprint"}
    if s["commit"] is not None:  # a git checkout (CI's clone is one)
        assert len(s["commit"]) == 40 and isinstance(s["dirty"], bool)


def test_verify_recomputes_a_results_cheapest_point_and_stamps_it_only_if_every_figure_is_equal(tmp_path, monkeypatch):
    from paper_repro import provenance
    from paper_repro.scale_grid import run_point

    monkeypatch.setattr(provenance, "fingerprint", lambda *a, **k: "F")
    rows = [run_point("mmmix", 8, 16, 4096, "packed", 64), run_point("llava", 8, 16, 4096, "padded", 96)]
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({"rows": rows}))
    rows[0]["methods"]["odb_dealt"]["steps"] += 1  # one figure of the cheapest point, as other code made it
    bad.write_text(json.dumps({"rows": rows}))
    assert provenance.verify(bad) == (False, ["mmmix", 8, 16, 4096, "packed", 64, False])
    assert json.loads(bad.read_text())["provenance"]["fingerprint"] is None  # recomputed otherwise: STALE
    assert provenance.verify(good)[0]
    prov = json.loads(good.read_text())["provenance"]
    assert prov["fingerprint"] == "F" and prov["commit"] is None and prov["verified"]["point"][0] == "mmmix"
    assert [c[:2] for c in provenance.check(tmp_path, current="F")] == [("bad.json", "STALE"), ("good.json", "current")]


def test_verify_reads_a_quality_grid_result_too(tmp_path, monkeypatch):
    from paper_repro import provenance
    from paper_repro.bench_grid import run_config

    monkeypatch.setattr(provenance, "fingerprint", lambda *a, **k: "F")
    f = tmp_path / "quality_sim_x.json"
    results = [run_config("llava", 2, 64, 4096, "padded", 256), run_config("release", 4, 32, 4096, "packed", 128)]
    results[1]["methods"]["odb"]["steps"] += 1  # a figure of a point verify does not pick stays unseen
    f.write_text(json.dumps({"results": results}, indent=1))
    assert provenance.verify(f) == (True, ["llava", 2, 64, 4096, "padded", 256])
    results[0]["methods"]["odb"]["steps"] += 1
    f.write_text(json.dumps({"results": results}, indent=1))
    assert provenance.verify(f, write=False)[0] is False


def test_exchange_rows_need_their_own_fingerprint_and_at_commit_tells_same_code_from_other(tmp_path, monkeypatch):
    """The exchange rows' code (`scale_grid.exchange_point`) is not in `fingerprint`: their files are current only
    with today's `exchange_fingerprint`.  `at_commit` computes it on a commit's code: a repository of today's
    tree is vouched for, and a commit whose budget balance re-sorts blocks of at most 2 steps is not."""
    import shutil
    import subprocess

    from paper_repro import provenance
    from paper_repro.scale_grid import POOLED_X, POOLED_XB, SLACK, exchange_fingerprint, stamp

    assert exchange_fingerprint(0) != exchange_fingerprint(SLACK) == exchange_fingerprint(SLACK)
    assert stamp(SLACK)["exchange_slack"] == SLACK and "exchange_fingerprint" not in stamp()
    monkeypatch.setattr(provenance, "fingerprint", lambda *a, **k: "F")
    repo, res = tmp_path / "repo", tmp_path / "res"
    res.mkdir()
    root = provenance.RESULTS.parents[1]
    for d in ("odb", "paper_repro"):
        shutil.copytree(root / d, repo / d, ignore=shutil.ignore_patterns("results", "__pycache__"))

    def commit(msg):
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
        subprocess.run([*git, "commit", "-qm", msg], check=True, capture_output=True)
        return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()

    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    today = commit("today")
    ex = repo / "odb" / "batching" / "exchange.py"
    assert ex.read_text().count("MAX_BLOCK = 4") == 1
    ex.write_text(ex.read_text().replace("MAX_BLOCK = 4", "MAX_BLOCK = 2"))
    other = commit("blocks of 2")

    def result(name, key, args, **prov):
        f = res / name
        f.write_text(json.dumps({"rows": [{"methods": {key: {}}}], "args": args,
                                 "provenance": {"dirty": False, "fingerprint": "F", **prov}}))
        return f

    plain = result("plain.json", POOLED_X, "", commit=today)
    same, differs = (result(n, POOLED_XB, f" --slack {SLACK}", commit=c) for n, c in (("a.json", today),
                                                                                      ("b.json", other)))
    dirty = result("c.json", POOLED_XB, f" --slack {SLACK}", commit=today)
    dirty.write_text(dirty.read_text().replace('"dirty": false', '"dirty": true'))
    assert [s for _, s, _ in provenance.check(res)] == ["unstamped"] * 4  # the exchange not fingerprinted
    assert provenance.at_commit(plain, repo=repo) and provenance.at_commit(same, repo=repo)
    assert not provenance.at_commit(differs, repo=repo)
    with pytest.raises(ValueError, match="clean commit"):
        provenance.at_commit(dirty, repo=repo)
    assert [s for _, s, _ in provenance.check(res)] == ["current", "STALE", "unstamped", "current"]
    assert json.loads(same.read_text())["provenance"]["exchange_slack"] == SLACK
    assert json.loads(plain.read_text())["provenance"]["exchange_slack"] == 0
