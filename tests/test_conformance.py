"""The trace checker has teeth: a real 2-rank trace passes, and every tampering is rejected."""

import json
import shutil

import pytest

from proofs.conformance import assert_conformant, check_dir

from mp_harness import make_lengths, run_ranks, scenario


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


@pytest.mark.parametrize("rank, tamper, words", ABORT_TAMPERS, ids=[f"{t[1].__name__}_rank{t[0]}" for t in ABORT_TAMPERS])
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


def _other_rule(rank, world_size, trace_dir):
    """Ranks that all run another proposal rule while their traces say "BalancedPolicy"."""
    import odb
    from odb.batching import policy as pol

    class BalancedPolicy(pol.BalancedPolicy):  # the checker recomputes the real BalancedPolicy
        def propose(self, summaries, window):
            return max(1, super().propose(summaries, window) - 1)
    from mp_harness import Samples, id_collate

    loader = odb.ODBDataLoader(Samples(make_lengths(60, 9, lo=2)), 128, id_collate, buffer_size=8,
                               policy=BalancedPolicy(), trace_dir=trace_dir, timeout_s=30)
    n = sum(1 for _ in loader)
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
