"""The first rounds' smaller windows (``first_window``, the table's cfg ``W0`` and field ``cap``): a pass's
round r holds ``min(W, first_window 2^r)`` samples per rank, so its first batch waits for a few small windows.

What is checked here, at the API a user touches: the setting's validation and its comparison across ranks,
how many samples the first batch waits for on a real loader, the windows real ranks post (from their traces,
checked against the table), and a checkpoint taken during the ramp resuming with every sample once.  The
table side (the invariant, the exhaustive scopes with W0 < W, the mutants) is in `proofs/`; the loader against
the simulation with W0 < W in `tests/test_differential.py`.
"""

import json
import threading

import pytest
import torch

import odb
from mp_harness import build_and_run, make_lengths, run_ranks, scenario
from odb.errors import ConfigError
from odb.runtime import merge_states
from proofs.conformance import assert_conformant

LENGTHS = make_lengths(300, seed=53, lo=2, hi=60)


@pytest.mark.parametrize("bad", [0, -4, 2.5, True, "32"])
def test_first_window_must_be_none_or_a_positive_int(bad):
    with pytest.raises(ConfigError, match="first_window"):
        odb.LoaderSettings(token_budget=64, first_window=bad)


def test_the_table_runs_first_window_times_the_pool_capped_by_its_window():
    s = odb.LoaderSettings(token_budget=64, buffer_size=16, first_window=4, placement=odb.Pooled(2))
    assert s.table_first_window == 8 and s.buffer_size * s.lanes == 32
    assert odb.LoaderSettings(token_budget=64, buffer_size=16, first_window=64).table_first_window == 16
    assert odb.LoaderSettings(token_budget=64, buffer_size=16, first_window=None).table_first_window == 16
    assert odb.LoaderSettings(token_budget=64).first_window == 32  # the documented default


def load_traces(d):
    """rank -> the trace lines of its one pass."""
    out = {}
    for path in sorted(d.glob("*.jsonl")):
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        out[int(path.stem.rsplit("rank", 1)[1])] = lines
    return out


class Gated(torch.utils.data.Dataset):
    """Map-style; counts the samples preprocessed, and holds every read past the first `most` until the test
    opens `gate` (after its first batch): a loader that needs more for its first batch waits out the gate."""

    def __init__(self, n, most, patience_s=5.0):
        self.n, self.most, self.read, self.waited_out, self.patience_s = n, most, 0, 0, patience_s
        self.gate = threading.Event()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.read += 1
        if self.read > self.most and not self.gate.wait(self.patience_s):
            self.waited_out += 1
            self.gate.set()  # one wait is enough to fail the test
        return {"input_ids": torch.ones(2 + (i * 7919) % 50, dtype=torch.long)}


@pytest.mark.parametrize("first_window, most, least", [(8, 8 + 16, 8), (1, 1 + 2, 1), (None, 2 * 256, 256)])
def test_the_first_batch_waits_for_the_first_rounds_windows_not_the_whole_window(first_window, most, least):
    """One rank: a round's batches are released after the next round's collective, so the first batch has read
    round 0's window and round 1's (less round 0's carry), and no more."""
    data = Gated(2048, most)
    loader = odb.ODBDataLoader(data, 256, buffer_size=256, first_window=first_window)
    it = iter(loader)
    odb.pop_step_info(next(it))
    assert data.read >= least and data.waited_out == 0, (data.read, data.waited_out)
    data.gate.set()
    rest = sum(1 for b in it if odb.pop_step_info(b) is not None)
    assert rest > 0 and loader.stats.as_dict()["samples"] == 2048
    loader.close()


@pytest.mark.slow
def test_ranks_that_set_first_window_differently_stop_with_a_config_error_naming_it(tmp_path):
    res = run_ranks(build_and_run, 2, tmp_path, args=([{"first_window": 4}, {"first_window": 8}],), timeout_s=60)
    assert [r.error_type for r in res] == ["ConfigError", "ConfigError"], [r.error for r in res]
    assert all("first_window" in r.error for r in res), [r.error for r in res]


@pytest.mark.slow
@pytest.mark.parametrize("mode, exchange", [("pad", True), ("join", False), ("quota", False)])
def test_real_ranks_post_the_ramps_windows_and_their_traces_conform(tmp_path, mode, exchange):
    spec = {"lengths": LENGTHS, "budget": 160, "W": 16, "first_window": 2, "mode": mode, "exchange": exchange,
            "sharding": "dealt", "trace_dir": str(tmp_path / "traces")}
    res = run_ranks(scenario, 2, tmp_path, args=(spec,), timeout_s=90)
    assert all(r.status == "ok" for r in res), [(r.status, (r.error or "")[:800]) for r in res]
    assert_conformant(str(tmp_path / "traces"))
    if mode != "quota":
        ids = sorted(i for r in res for s in r.value["steps"] for i in s["ids"])
        assert ids == list(range(len(LENGTHS)))
    for rank, lines in load_traces(tmp_path / "traces").items():
        posts = [x for x in lines if x.get("row") == "post_header"]
        full = [x["before"]["buf"] for x in posts if not x["before"]["exhausted"]]
        assert full[:5] == [2, 4, 8, 16, 16], (rank, full[:8])  # min(W, W0 2^r) until the source runs dry


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["dealt", "fixed"])
def test_a_checkpoint_taken_during_the_ramp_resumes_with_every_sample_once(tmp_path, sharding):
    spec = {"lengths": LENGTHS, "budget": 160, "W": 32, "first_window": 2, "sharding": sharding}
    first = run_ranks(scenario, 2, tmp_path / "a", args=({**spec, "save_at": 1},), timeout_s=90)
    assert all(r.status == "ok" for r in first), [(r.status, (r.error or "")[:800]) for r in first]
    merged = merge_states([r.value["state"] for r in first])
    second = run_ranks(scenario, 3, tmp_path / "b", args=({**spec, "state": merged,
                                                          "trace_dir": str(tmp_path / "traces")},), timeout_s=90)
    assert all(r.status == "ok" for r in second), [(r.status, (r.error or "")[:800]) for r in second]
    before = [i for r in first for s in r.value["steps"] for i in s["ids"]]
    after = [i for r in second for s in r.value["steps"] for i in s["ids"]]
    assert sorted(before + after) == list(range(len(LENGTHS))) and not set(before) & set(after)
    assert_conformant(str(tmp_path / "traces"))


@pytest.mark.parametrize("first_window", [8, None])
def test_the_simulations_first_wait_is_what_the_loader_reads_before_its_first_batch(first_window):
    """`SimResult.first_wait` (the planner's first_batch_s) is exact: a loader gated at that many reads hands
    out its first batch, one gated a read earlier cannot (it waits out the gate)."""
    from odb.core.sim import simulate

    n = 1024
    lengths = [2 + (i * 7919) % 50 for i in range(n)]
    settings = odb.LoaderSettings(token_budget=256, buffer_size=128, first_window=first_window, shuffle=False,
                                  loss_basis="tokens")
    (wait,) = simulate([[((x,), 0) for x in lengths]], settings).first_wait
    assert wait < 128 if first_window else wait >= 128
    for most, short in ((wait, 0), (wait - 1, 1)):
        data = Gated(n, most, patience_s=2)
        loader = odb.ODBDataLoader(data, 256, buffer_size=128, first_window=first_window, shuffle=False,
                                   loss_basis="tokens")
        it = iter(loader)  # kept: dropping it stops the pass, which waits for the read the gate holds
        odb.pop_step_info(next(it))
        assert data.waited_out == short, (most, data.read)
        data.gate.set()
        loader.close()
