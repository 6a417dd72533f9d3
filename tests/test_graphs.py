"""Graph questions answered with networkx: happens-before of real traces, waits-for graphs, engines agree.

Each check is shown able to fail: a trace that reorders two collectives on one rank, a waits-for
cycle, and seeded bugs in the explorer's hand-written graph analyses.  About 5 s on one core
(one 3-rank gloo run, explorations of at most a few thousand states).
"""

import importlib
import json
import shutil
import subprocess
import sys
from functools import lru_cache

import pytest

from models.env import SysState
from models.scopes import Scope
from mp_harness import make_lengths, run_ranks, scenario
from odb.protocol.table import DGAP, DONE, PAD, WAIT
from proofs.conformance import check_dir
from proofs.conformance.hb import happens_before
from proofs.explicit import counterexample, explore, waits_for_chain, waits_for_graph
from proofs.explicit.check import ROUNDS_CLOSED_FORM, check_scope
from proofs.explicit.crosscheck import CROSS_CHECK_MUTANTS, cross_check, mutant_cross_checks

EXPLORE = importlib.import_module("proofs.explicit.explore")  # the module (the package exports the function)


# -- happens-before of a real run -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def three_rank_traces(tmp_path_factory):
    """Three ranks with uneven shards (20, 8 and 4 samples): rank 0 has the most rows between collectives."""
    tmp = tmp_path_factory.mktemp("hb")
    spec = {"lengths": make_lengths(40, 9, lo=2), "shards": [list(range(20)), list(range(20, 28)),
                                                              list(range(28, 32))],
            "W": 4, "trace_dir": str(tmp / "traces")}
    res = run_ranks(scenario, 3, tmp, args=(spec,), timeout_s=60)
    assert all(r.status == "ok" for r in res), [r.error for r in res]
    return tmp / "traces"


def load_all(d):
    """Every rank's events (meta record dropped), in rank order."""
    out = []
    for rank in range(3):
        (path,) = d.glob(f"L*_it0_rank{rank}.jsonl")
        out.append([json.loads(x) for x in path.read_text().splitlines()[1:]])
    return out


def test_a_real_run_is_acyclic_its_collectives_line_up_and_its_critical_path_passes_every_collective(
        three_rank_traces):
    (report,) = check_dir(str(three_rank_traces))
    assert report.ok, report.problems
    cp = report.critical_path
    assert cp["collectives"] == report.rounds > 3
    assert sum(cp["segments_by_rank"].values()) == report.rounds + 1  # a segment before each collective, one after
    assert max(cp["segments_by_rank"], key=cp["segments_by_rank"].get) == 0  # the rank with the largest shard
    hb = happens_before(load_all(three_rank_traces))
    assert hb.ok and hb.order == list(range(report.rounds))
    assert hb.events == sum(len(t) for t in load_all(three_rank_traces))
    # program order (events - 3 edges) plus 3 x 3 post -> collect edges per collective (one of them on the rank's own
    # program order, post_header -> return_*: the graph keeps it once)
    assert hb.edges == hb.events - 3 + report.rounds * (9 - 3)


def swap_rounds(events, a, b):
    """The rank logs collective `b` where it took part in `a` and the other way round."""
    for ev in events:
        if ev.get("effect") in ("post", "collect") and ev["round"] in (a, b):
            ev["round"] = a + b - ev["round"]


def test_a_trace_that_reorders_two_collectives_on_one_rank_is_rejected_naming_the_rank_and_the_rounds(
        three_rank_traces, tmp_path):
    d = tmp_path / "t"
    shutil.copytree(three_rank_traces, d)
    (path,) = d.glob("L*_it0_rank1.jsonl")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    swap_rounds(lines[1:], 1, 2)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (report,) = check_dir(str(d))
    hb = [p for p in report.problems if p.startswith("happens-before")]
    assert len(hb) == 2 and report.critical_path is None, report.problems
    assert hb[0].startswith("happens-before cycle through rounds [1, 2] on ranks [") and "rank 1 event" in hb[0]
    assert "all-gather #1 of each rank (from 0) is round 1 on ranks [0, 2]; round 2 on ranks [1]" in hb[1]


def ev(kind, rnd):
    return {"effect": kind, "round": rnd, "row": {"post": "post_header", "collect": "return_go"}[kind]}


def local(row="take_sample"):
    return {"effect": "fetch", "row": row}


def rounds(*rs, before=0):
    return [local()] * before + [e for r in rs for e in (ev("post", r), ev("collect", r))]


def test_a_rank_that_stopped_early_did_a_prefix_of_the_order_and_a_repeated_round_is_rejected():
    assert happens_before([rounds(0, 1, 2), rounds(0, 1)]).ok  # rank 1 died after round 1
    bad = happens_before([rounds(0, 1, 2), rounds(0, 1, 1)])  # rank 1 logs round 1 twice
    assert any("rank 1 enters rounds [1] twice" in p for p in bad.problems), bad.problems
    stray = happens_before([rounds(0, 1), [ev("post", 0), ev("collect", 1)]])
    assert "happens-before: rank 1 event 1 leaves round 1 but the last all-gather it entered was round 0" in \
        stray.problems


def test_a_collect_logged_before_its_own_post_is_a_cycle():
    swapped = [ev("collect", 0), ev("post", 0)]
    bad = happens_before([rounds(0), swapped])
    assert bad.problems and bad.problems[0].startswith("happens-before cycle through rounds [0] on ranks [1]")
    assert "rank 1 event 1 (post round 0) => rank 1 event 0 (collect round 0)" in bad.problems[0]


def test_the_critical_path_follows_the_rank_with_the_most_rows_before_each_collective():
    a = [local()] * 5 + rounds(0) + [local()] + rounds(1) + [local("emit_group")] * 3
    b = [local()] + rounds(0) + [local()] * 4 + rounds(1)
    hb = happens_before([a, b])
    assert hb.ok and hb.critical_collectives == 2 and hb.critical_ranks == [0, 1, 0]
    # rank 0's 5 fills and post; rank 1's collect, 4 fills and post; rank 0's collect and 3 emits
    assert hb.critical_events == 6 + 6 + 4


def test_without_networkx_the_happens_before_check_fails_it_is_not_skipped(three_rank_traces, monkeypatch):
    monkeypatch.setitem(sys.modules, "networkx", None)  # import networkx now raises ImportError
    (report,) = check_dir(str(three_rank_traces))
    assert not report.ok and any("happens-before check did not run" in p for p in report.problems)


def test_odb_imports_no_networkx():
    code = "import sys, odb, odb.protocol, odb.batching, odb.core, proofs.conformance; print('networkx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


# -- waits-for graphs of deadlocks ----------------------------------------------------------------------------------
def test_a_deadlock_prints_the_waits_for_chain_that_ends_at_the_rank_that_left():
    bad = DGAP.replace_row("see_exhausted", phase_to=DONE)
    r = explore(3, 2, 2, PAD, table=bad)
    text = counterexample(r, r.deadlocks[0], deadlock=True, title="DEADLOCK")
    assert text.splitlines()[-1] == ("WAITS-FOR chain: r2 -> r0 (r0 is DONE: it has left the protocol); "
                                     "other waits: r2 -> r1 (DONE)")


def with_rank(s: SysState, i: int, **fields) -> SysState:
    row = list(s.ranks[i])
    for name, v in fields.items():
        row[s._index(name)] = v
    return SysState(s.table_fields, s.ranks[:i] + (tuple(row),) + s.ranks[i + 1:], s.k, s.mb, s.cfg_items)


def test_ranks_that_wait_for_each_other_in_different_collectives_print_the_waits_for_cycle():
    r = explore(2, 1, 2, PAD)
    both_wait = next(r.sys(i) for i in range(r.states) if all(
        r.sys(i).rank_value(j, "ph") == WAIT and r.sys(i).rank_value(j, "posted") for j in (0, 1)))
    s = with_rank(both_wait, 1, rd=both_wait.rank_value(1, "rd") + 1)  # rank 1 is a collective ahead
    assert sorted(waits_for_graph(s).edges) == [(0, 1), (1, 0)]
    assert waits_for_chain(s).startswith("WAITS-FOR cycle: r0 -> r1 -> r0 (each waits for the next to post")
    assert waits_for_chain(both_wait) == "WAITS-FOR: no rank waits in a collective for another"


# -- the explorer's graph analyses against networkx -----------------------------------------------------------------
def min_for_max_longest_path(res, succs, init_idx):
    """The seeded bug: the longest-path DP takes min for max over the successors (a shortest path)."""
    @lru_cache(maxsize=None)
    def lp(x):
        return 1 + min(lp(j) for j in succs[x]) if succs[x] else 0
    res.longest_path = max(lp(i) for i in init_idx)


def test_the_explorers_answers_equal_networkx_on_the_table_with_and_without_quits():
    for n, d, q in ((2, 2, 0), (3, 1, 0), (2, 1, 1)):
        c = cross_check(explore(n, d, 2, PAD, quits=q, keep_succs=True))
        assert c.ok and c.ours == c.networkx and c.ours["acyclic"] and c.states > 20, c.diffs


def test_a_seeded_longest_path_bug_in_analyse_is_caught_by_the_cross_check(monkeypatch):
    real = EXPLORE._analyse

    def buggy(res, succs, init_idx):
        real(res, succs, init_idx)
        min_for_max_longest_path(res, succs, init_idx)
    monkeypatch.setattr(EXPLORE, "_analyse", buggy)
    c = cross_check(explore(2, 2, 2, PAD, keep_succs=True))
    assert not c.ok and c.ours["longest_path"] < c.networkx["longest_path"] == 29
    assert c.diffs == [f"pad N=2, D<=2, W=2: longest path from the initial states: _analyse "
                       f"{c.ours['longest_path']}, networkx dag_longest_path_length 29"]
    res = check_scope(Scope(n_max=2, d_max=2, w=2, modes=(PAD,)), cross_check_n_max=2)
    (v,) = [v for v in res.verdicts if v.property == "graph_analyses_match_networkx"]
    assert v.result == "failed" and "longest path" in v.detail  # make verify fails on it


def test_a_missing_trap_and_a_missed_cycle_are_caught_naming_the_states():
    (_, _, build, _), = [m for m in CROSS_CHECK_MUTANTS if m[0] == "leave_when_source_exhausted"]
    r = explore(2, 2, 2, PAD, table=build(), keep_succs=True)
    assert r.num_traps > 1
    gone = r.trap_list.pop(0)  # _analyse "forgets" one trap
    r.num_traps -= 1
    (diff,) = cross_check(r).diffs
    assert f"only networkx: [{gone}]" in diff and f"first: state {gone} (k=" in diff
    (_, _, build, _), = [m for m in CROSS_CHECK_MUTANTS if m[0] == "filler_without_progress"]
    r = explore(2, 1, 2, PAD, table=build(), keep_succs=True, round_bound=ROUNDS_CLOSED_FORM[PAD][1])
    assert r.cycle is not None and cross_check(r).ok
    r.cycle = None  # _analyse "misses" the cycle
    assert "_analyse says acyclic, networkx is_directed_acyclic_graph says False" in cross_check(r).diffs[0]


def test_the_mutant_graphs_have_cycles_and_traps_and_both_engines_agree_on_them():
    verdicts, figures = mutant_cross_checks(Scope(n_max=2, d_max=2, w=2))
    assert [v.result for v in verdicts] == ["holds"] * len(CROSS_CHECK_MUTANTS), [v.detail for v in verdicts]
    assert any(not f["ours"]["acyclic"] for f in figures) and sum(f["ours"]["traps"] for f in figures) > 100


def test_the_committed_report_carries_the_cross_check_of_every_mode_and_of_the_mutant_graphs():
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "proofs"
    rep = json.loads((root / "report.json").read_text())
    vs = [v for v in rep["verdicts"] if v["property"].startswith("graph_analyses_match_networkx")]
    assert {v["mode"] for v in vs if v["property"] == "graph_analyses_match_networkx"} == {"pad", "join", "quota"}
    assert {v["property"] for v in vs} >= {f"graph_analyses_match_networkx[{m[0]}]" for m in CROSS_CHECK_MUTANTS}
    assert all(v["result"] == "holds" for v in vs)
    assert max(r["n"] for r in rep["runs"] if "cross_check" in r) == 4
    assert "## Engines agree" in (root / "REPORT.md").read_text()
