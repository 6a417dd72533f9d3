"""The trace checker has teeth: a real 2-rank trace passes, and every tampering is rejected."""

import json
import shutil

import pytest

from mp_harness import make_lengths, run_ranks, scenario
from proofs.conformance import assert_conformant, check_dir


@pytest.fixture(scope="module")
def real_traces(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("conf")
    spec = {"lengths": make_lengths(40, 9, lo=2), "shards": [list(range(28)), list(range(28, 36))], "W": 4,
            "trace_dir": str(tmp / "traces")}
    res = run_ranks(scenario, 2, tmp, args=(spec,), timeout_s=60)
    assert all(r.status == "ok" for r in res), [r.error for r in res]
    return tmp / "traces"


@pytest.fixture(scope="module")
def abort_traces(tmp_path_factory):
    """Rank 0 breaks out after its second batch; rank 1 ends by return_abort with RankFailure."""
    tmp = tmp_path_factory.mktemp("conf_abort")
    spec = {"lengths": make_lengths(40, 9, lo=2), "W": 4, "break_at": 1, "break_rank": 0,
            "trace_dir": str(tmp / "traces")}
    res = run_ranks(scenario, 2, tmp, args=(spec,), timeout_s=60)
    assert [r.error_type for r in res] == [None, "RankFailure"], [r.error for r in res]
    return tmp / "traces"


def trace_file(d, rank):
    (path,) = d.glob(f"L*_it0_rank{rank}.jsonl")  # the loader id depends on loaders made before the fork
    return path


def load(d, rank):
    return [json.loads(x) for x in trace_file(d, rank).read_text().splitlines()]


def save(d, rank, lines):
    trace_file(d, rank).write_text("".join(json.dumps(x) + "\n" for x in lines))


def first(lines, row):
    return next(i for i, x in enumerate(lines) if x.get("row") == row)


def tamper_after(lines):
    lines[first(lines, "take_sample")]["after"]["buf"] += 1


def tamper_proposal(lines):
    i = first(lines, "return_go")
    lines[i]["collective"]["inputs"]["proposal"] += 1


def tamper_posted_n(lines):
    lines[first(lines, "post_header")]["payload"]["n"] -= 1


def tamper_truncate(lines):
    del lines[-1]


def tamper_drop_middle(lines):
    del lines[len(lines) // 2]


def tamper_row_name(lines):
    lines[first(lines, "emit_filler")]["row"] = "emit_group"


def tamper_choice(lines):
    i = first(lines, "emit_group")
    lines[i]["params"]["take"] += 5
    lines[i]["count"] += 5


def tamper_table_hash(lines):
    lines[0]["meta"]["table"] = "0" * 64


def tamper_received_header(lines):
    i = first(lines, "return_go")
    lines[i]["collective"]["headers"][1]["n"] += 1


def tamper_extra_row_after_done(lines):
    lines.append(dict(lines[-1]))


def tamper_ignore_local_error(lines):
    """A local error is recorded but the rank goes on fetching (quit stays 0)."""
    lines.insert(first(lines, "take_sample"), {"local_error": "SampleError: injected"})


def tamper_row_after_failure(lines):
    lines.insert(len(lines) // 2, {"failure": "RankFailure: injected"})


def last(lines, row):
    return max(i for i, x in enumerate(lines) if x.get("row") == row)


def skip_abort_round(lines):
    """The rank never posts the abort round: its last post_header and return_abort are gone."""
    del lines[last(lines, "return_abort")]
    del lines[last(lines, "post_header")]


def tamper_posted_st(lines):
    lines[last(lines, "post_header")]["payload"]["st"] = 0


def tamper_received_st(lines):
    lines[last(lines, "return_abort")]["collective"]["headers"][0]["st"] = 0


def tamper_max_st(lines):
    i = last(lines, "return_abort")
    lines[i]["collective"]["inputs"]["max_st"] = 0


def tamper_quit_read(lines):
    """The stopping rank claims it never stopped: quit=0 where it posted st=1."""
    i = last(lines, "post_header")
    lines[i]["inputs"]["quit"] = 0


def tamper_read_input(lines):
    """A rank read max_n = 1 more than the collective gave, where that changes none of its rows
    (PAD: hi = max_n and the target is the smaller proposal), so only the read-vs-collective check sees it."""
    i = next(i for i, x in enumerate(lines) if x.get("row") == "return_go"
             and x["inputs"]["proposal"] < x["inputs"]["max_n"])
    lines[i]["inputs"]["max_n"] += 1


def tamper_summary(lines):
    lines[first(lines, "post_header")]["summary"][3] += 1


def tamper_replicated(lines):
    lines[last(lines, "post_header")]["replicated"][1] ^= 1  # this rank's dealer digest


def tamper_replicated_target(lines):
    lines[last(lines, "post_header")]["replicated"][2] += 1  # the previous round's target as this rank posted it


def tamper_replicated_proposal(lines):
    lines[last(lines, "post_header")]["replicated"][3] += 1  # the previous round's proposal as this rank posted it


TAMPERS = [  # (rank to tamper, function, words the report must contain)
    (0, tamper_after, "table gives"),
    (1, tamper_proposal, "proposal"),
    (1, tamper_posted_n, "posted"),
    (0, tamper_truncate, "TraceMatched"),
    (0, tamper_drop_middle, "before"),
    (1, tamper_row_name, "enables"),
    (0, tamper_choice, "contract"),
    (0, tamper_table_hash, "table hash"),
    (0, tamper_received_header, "received headers"),
    (1, tamper_extra_row_after_done, "before"),
    (0, tamper_ignore_local_error, "after a local error"),
    (1, tamper_row_after_failure, "after the failure"),
    (0, tamper_read_input, "read input max_n"),
    (1, tamper_summary, "received summaries"),
    (0, tamper_replicated, "different 'deal'"),
    (1, tamper_replicated_target, "which decided"),  # recomputed: not the target this rank decided
    (0, tamper_replicated_proposal, "different 'proposal'"),
]


ABORT_TAMPERS = [  # on the abort run: rank 0 stopped (st=1), rank 1 was healthy
    (1, skip_abort_round, "never posted"),
    (0, skip_abort_round, "TraceMatched"),
    (0, tamper_posted_st, "table gives"),
    (1, tamper_received_st, "received headers"),
    (1, tamper_max_st, "collective inputs"),
    # With quit=0 the guards would have asked the source ("does not record") -- unless the window was
    # full when the rank stopped, in which case post_header still fires and its payload's st differs
    # ("table gives"); which one depends on timing, and either is a rejection.
    (0, tamper_quit_read, ("does not record", "table gives")),
]


def test_the_untampered_real_trace_conforms_and_fires_every_row(real_traces):
    (report,) = check_dir(str(real_traces))
    assert report.ok, report.problems
    assert report.world_size == 2 and report.rounds > 3 and not report.aborted
    assert set(report.rows) == {"take_sample", "see_exhausted", "post_header", "return_go", "return_stop",
                                "emit_group", "emit_filler", "end_round"}


def test_the_untampered_abort_trace_conforms_with_the_abort_as_a_table_row(abort_traces):
    (report,) = check_dir(str(abort_traces))
    assert report.ok, report.problems
    assert report.aborted and report.rows["return_abort"] == 2 and "return_stop" not in report.rows
    assert [f.split(":")[0] for f in report.failures] == ["rank 1"]  # the healthy rank's RankFailure
    with pytest.raises(AssertionError, match="aborted=True"):
        assert_conformant(str(abort_traces))
    assert assert_conformant(str(abort_traces), allow_abort=True)["return_abort"] == 2


def assert_tamper_rejected(traces, tmp_path, rank, tamper, words):
    """Copy `traces`, apply `tamper` to `rank`'s trace, and require a report naming one of `words`."""
    d = tmp_path / "t"
    shutil.copytree(traces, d)
    lines = load(d, rank)
    tamper(lines)
    save(d, rank, lines)
    (report,) = check_dir(str(d))
    assert not report.ok
    alternatives = (words,) if isinstance(words, str) else words
    assert any(w in p for p in report.problems for w in alternatives), report.problems


@pytest.mark.parametrize("rank, tamper, words", ABORT_TAMPERS,
                         ids=[f"{t[1].__name__}_rank{t[0]}" for t in ABORT_TAMPERS])
def test_a_tampered_abort_trace_is_rejected(abort_traces, tmp_path, rank, tamper, words):
    assert_tamper_rejected(abort_traces, tmp_path, rank, tamper, words)


@pytest.mark.parametrize("rank, tamper, words", TAMPERS, ids=[t[1].__name__ for t in TAMPERS])
def test_a_tampered_trace_is_rejected(real_traces, tmp_path, rank, tamper, words):
    assert_tamper_rejected(real_traces, tmp_path, rank, tamper, words)


def test_a_missing_rank_trace_is_rejected(real_traces, tmp_path):
    d = tmp_path / "t"
    shutil.copytree(real_traces, d)
    trace_file(d, 1).unlink()
    (report,) = check_dir(str(d))
    assert not report.ok and "world size 2" in report.problems[0]


def _other_rule(rank, world_size, trace_dir, name="BalancedPolicy"):
    """Ranks that all run another proposal rule, in a policy class called `name`: under the default's name
    ("BalancedPolicy") the checker recomputes the real one; under another its proposals stand."""
    import odb
    from odb.batching import policy as pol

    class Other(pol.BalancedPolicy):
        def propose(self, summaries, window):
            return max(1, super().propose(summaries, window) - 1)
    Other.__name__ = name
    from mp_harness import Samples, id_collate

    loader = odb.ODBDataLoader(Samples(make_lengths(60, 9, lo=2)), 128, id_collate, buffer_size=8,
                               policy=Other(), trace_dir=trace_dir, timeout_s=30)
    n = sum(1 for _ in map(odb.pop_step_info, loader))
    loader.close()
    return n


def test_proposals_from_another_rule_agreed_by_every_rank_are_caught_by_recomputing_the_policy(tmp_path):
    # every record is consistent (ranks agree, rows replay, digests match): only recomputing
    # policy.propose on the posted summaries can see that the ranks decided by another rule
    d = str(tmp_path / "traces")
    res = run_ranks(_other_rule, 2, tmp_path, args=(d,), timeout_s=60)
    assert all(r.status == "ok" for r in res), [r.error for r in res]
    (report,) = check_dir(d)
    assert report.problems and all("the policy's proposal" in p for p in report.problems), report.problems


# -- the round exchange (condition 5): a 3-rank run with exchange=True --------------------------------------
@pytest.fixture(scope="module")
def exchange_traces(tmp_path_factory):
    from test_runtime_exchange import _run

    tmp = tmp_path_factory.mktemp("conf_xchg")
    res = run_ranks(_run, 3, tmp, args=({"W": 8, "mode": "pad", "trace_dir": str(tmp / "traces")},), timeout_s=90)
    assert all(r.status == "ok" and r.value["error"] is None for r in res), [(r.error, r.value) for r in res]
    return tmp / "traces"


def _moving(d):
    """(rank, line index) of the first collect whose transfer sent a batch."""
    for rank in range(3):
        for i, x in enumerate(load(d, rank)):
            if x.get("exchange", {}).get("send"):
                return rank, i
    raise AssertionError("no batch moved")


def _xchg_send_elsewhere(x):
    s = x["exchange"]["send"][0]
    s[0] = next(q for q in range(3) if q not in (s[0], s[1]))


def _xchg_send_positions(x):
    x["exchange"]["send"][0][3] = x["exchange"]["send"][0][3][:-1] + [10**6]


def _xchg_forget_moves(x):
    del x["exchange"]


def _xchg_planned(x):
    x["collective"]["planned"] += 1


def _xchg_received_fills(x):
    x["collective"]["fills"][0][0] += 7


def _xchg_lost_without_abort(x):
    s = x["exchange"]["send"].pop(0)
    x["exchange"]["lost"] = [[s[1], s[2]]]
    x["exchange"]["send"] = []  # a receiver's record, on the sender's line: fails either way


XCHG_TAMPERS = [(_xchg_send_elsewhere, "the plan of the received fills sends"),
                (_xchg_send_positions, "left rank"), (_xchg_forget_moves, "the plan of the received fills"),
                (_xchg_planned, "planned a round of target"), (_xchg_received_fills, "received fills"),
                (_xchg_lost_without_abort, "did not abort")]


def test_the_untampered_exchange_trace_conforms_with_its_moves(exchange_traces):
    (report,) = check_dir(str(exchange_traces))
    assert report.ok, report.problems
    assert report.rows["return_flush"] == 3 and not report.aborted
    moved = sum(len(x.get("exchange", {}).get("send", ())) for r in range(3) for x in load(exchange_traces, r))
    assert moved > 0


@pytest.mark.parametrize("tamper, words", XCHG_TAMPERS, ids=[t[0].__name__ for t in XCHG_TAMPERS])
def test_a_tampered_exchange_trace_is_rejected(exchange_traces, tmp_path, tamper, words):
    d = tmp_path / "t"
    shutil.copytree(exchange_traces, d)
    rank, i = _moving(d)
    lines = load(d, rank)
    tamper(lines[i])
    save(d, rank, lines)
    (report,) = check_dir(str(d))
    assert any(words in p for p in report.problems), report.problems


def test_a_posted_fill_the_others_did_not_receive_is_rejected(exchange_traces, tmp_path):
    d = tmp_path / "t"
    shutil.copytree(exchange_traces, d)
    lines = load(d, 0)
    i = next(i for i, x in enumerate(lines) if x.get("row") == "post_header" and x.get("round") == 2)
    lines[i]["fills"][0] += 1
    save(d, 0, lines)
    (report,) = check_dir(str(d))
    assert any("received fills" in p for p in report.problems), report.problems


def test_a_trace_written_without_the_lanes_field_is_read_as_unpooled(exchange_traces, tmp_path):
    d = tmp_path / "t"  # traces from before pools: 3 ranks, no "lanes" in the meta record
    shutil.copytree(exchange_traces, d)
    for rank in range(3):
        lines = load(d, rank)
        del lines[0]["meta"]["lanes"]
        save(d, rank, lines)
    (report,) = check_dir(str(d))
    assert report.ok, report.problems


def test_a_run_with_the_users_own_policy_conforms_without_the_defaults_proposals(tmp_path):
    d = str(tmp_path / "traces")
    res = run_ranks(_other_rule, 2, tmp_path, args=(d, "AltPolicy"), timeout_s=60)  # sorts before the default
    assert all(r.status == "ok" for r in res), [r.error for r in res]
    (report,) = check_dir(d)
    assert report.ok, report.problems  # the same rule under the default's name is caught (the test above)


# -- pools (cfg lanes > 1): 4 ranks in 2 pools of 2 --------------------------------------------------------
@pytest.fixture(scope="module")
def pooled_traces(tmp_path_factory):
    from test_pool import _loader_run

    tmp = tmp_path_factory.mktemp("conf_pool")
    res = run_ranks(_loader_run, 4, tmp, args=({"lanes": 2, "W": 8, "trace_dir": str(tmp / "traces")},),
                    timeout_s=120)
    assert all(r.status == "ok" for r in res), [r.error for r in res]
    return tmp / "traces"


def test_the_untampered_pooled_trace_conforms(pooled_traces):
    (report,) = check_dir(str(pooled_traces))
    assert report.ok, report.problems
    assert report.world_size == 4 and report.rounds > 2


@pytest.mark.parametrize("rank, field", [(1, "summary"), (3, "summary"), (3, "replicated")])
def test_a_lane_that_posted_other_than_its_pool_is_rejected(pooled_traces, tmp_path, rank, field):
    d = tmp_path / "t"
    shutil.copytree(pooled_traces, d)
    lines = load(d, rank)
    i = next(i for i, x in enumerate(lines) if x.get("row") == "post_header" and x["payload"]["st"] == 0
             and x.get(field))
    lines[i][field] = {"tampered": lines[i][field]}
    save(d, rank, lines)
    (report,) = check_dir(str(d))
    head = rank // 2 * 2
    assert any(f"rank {rank} posted" in p and f"other than rank {head} of its pool" in p for p in report.problems), \
        report.problems
