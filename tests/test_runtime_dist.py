"""ODBDataLoader on 2-4 gloo ranks: exactly-once audits, modes, faults, resume, traces.

Slow tier (each test starts processes; about 2-5 s each on 2 cores).  Every
test that writes traces runs the conformance checker on them.
"""

import os
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

from mp_harness import build_and_run, make_lengths, run_ranks, scenario
from odb.protocol import DGAP
from proofs.conformance import assert_conformant

pytestmark = pytest.mark.slow

LENGTHS = make_lengths(80, seed=5, lo=2, hi=60)
COVERAGE: Counter = Counter()


def run(tmp_path, world_size, proc_timeout=60, **spec):
    spec.setdefault("trace_dir", str(tmp_path / "traces"))
    spec.setdefault("lengths", LENGTHS)
    start = spec.pop("start_method", "fork")
    env = spec.pop("env", None)
    return run_ranks(scenario, world_size, tmp_path, args=(spec,), timeout_s=proc_timeout, start_method=start,
                     env=env)


def ok_values(res):
    assert all(r.status == "ok" for r in res), [(r.status, r.error_type, (r.error or "")[:1500]) for r in res]
    return [r.value for r in res]


def conform(tmp_path, allow_abort=False, died=()):
    rows = assert_conformant(str(tmp_path / "traces"), allow_abort=allow_abort, died=frozenset(died))
    COVERAGE.update(rows)
    return rows


def emitted(values, key="ids"):
    return sorted(i for v in values for s in v["steps"] for i in s[key])


def check_step_counts_agree(values):
    n = len(values[0]["steps"])
    assert all(len(v["steps"]) == n for v in values)
    for k in range(n):
        per_rank = [v["steps"][k] for v in values]
        assert len({(s["gs"], s["gt"], s["gl"]) for s in per_rank}) == 1
        assert per_rank[0]["gs"] == sum(s["ls"] for s in per_rank)
        assert per_rank[0]["gl"] == sum(s["ll"] for s in per_rank)
        if per_rank[0]["gl"]:
            assert sum(s["scale"] for s in per_rank) == pytest.approx(len(values))


def _transport_rounds(rank, world_size, rounds, mode):
    import random as _random

    import torch.distributed as dist

    from odb.core.header import Post
    from odb.runtime.transport import HeaderGather

    gather = HeaderGather(dist.new_group(backend="gloo"), world_size, mode)
    got = []
    for k in range(rounds):
        rng = _random.Random(1000 * k + rank)  # each rank's own post, another every round
        gather.post(Post([rank, k] + [rng.randint(-9, 9) for _ in range(5)], [rng.randint(0, 99) for _ in range(12)]))
        got.append(gather.collect(10))
    gather.release()
    return got


@pytest.mark.parametrize("mode", ["gather", "reduce"])
def test_the_transport_gathers_the_headers_and_reduces_the_counts_as_reduce_posts_does(tmp_path, mode):
    import random as _random

    from odb.core.header import Post, reduce_posts

    res = run_ranks(_transport_rounds, 3, tmp_path, args=(4, mode), timeout_s=60)
    assert all(o.status == "ok" for o in res), res
    for k in range(4):
        posts = []
        for r in range(3):
            rng = _random.Random(1000 * k + r)
            posts.append(Post([r, k] + [rng.randint(-9, 9) for _ in range(5)], [rng.randint(0, 99) for _ in range(12)]))
        want = reduce_posts(posts)
        for o in res:  # every rank alike: the headers in rank order, the counts summed, the tokens' max
            g = o.value[k]
            assert (g.rows.tolist(), list(g.totals), list(g.tokens_max)) == (want.rows, want.totals, want.tokens_max)


def test_pad_with_uneven_custom_shards_and_drops_emits_every_sample_once(tmp_path):
    shards = [list(range(0, 50)), list(range(50, 66))]
    values = ok_values(run(tmp_path, 2, shards=shards, drop=[3, 55], W=8))
    assert emitted(values) == sorted(set(range(66)) - {3, 55}) == emitted(values, "indices")
    check_step_counts_agree(values)
    assert values[1]["stats"]["fillers"] > 0 and values[0]["stats"]["fillers"] == 0
    assert [v["stats"]["dropped"] for v in values] == [1, 1]
    assert all(s["scale"] == 0 for v in values for s in v["steps"] if s["filler"])
    rows = conform(tmp_path)
    assert set(rows) == {r.name for r in DGAP.rows} - {"return_abort", "return_flush"}  # the loader runs xchg = 0


def test_join_with_an_iterable_dataset_and_an_empty_rank_emits_every_sample_once(tmp_path):
    shards = [list(range(0, 40)), list(range(40, 52)), []]
    values = ok_values(run(tmp_path, 3, shards=shards, iterable=True, mode="join", W=6))
    assert emitted(values) == list(range(52))
    counts = [len(v["steps"]) for v in values]
    assert counts[0] > counts[1] > counts[2] == 0
    assert not any(s["filler"] for v in values for s in v["steps"])
    rows = conform(tmp_path)
    assert "emit_filler" not in rows and rows["return_stop"] == 3


def test_quota_stops_all_ranks_together_and_reports_the_unemitted(tmp_path):
    shards = [list(range(0, 50)), list(range(50, 62))]
    res = run(tmp_path, 2, shards=shards, mode="quota", W=8)
    values = ok_values(res)
    check_step_counts_agree(values)
    out, left = emitted(values), sorted(i for v in values for i in v["stats"]["unemitted_indices"])
    assert sum(v["stats"]["unemitted"] for v in values) == len(left) > 0
    assert sorted(out + left) == list(range(62))
    conform(tmp_path)


@pytest.mark.parametrize("differs, name", [({"sharding": "fixed"}, "sharding"), ({"buffer_size": 4}, "buffer_size"),
                                            ({"seed": 7}, "seed"), ({"mode": "join"}, "mode")])
def test_ranks_that_build_their_loaders_differently_all_get_a_config_error(tmp_path, differs, name):
    base = {"buffer_size": 8, "sharding": "dealt"}
    res = run_ranks(build_and_run, 2, tmp_path, args=([base, {**base, **differs}],), timeout_s=60)
    assert [r.error_type for r in res] == ["ConfigError", "ConfigError"], [(r.status, r.error) for r in res]
    assert all(name in r.error for r in res)


def test_four_ranks_pad_with_a_window_of_two(tmp_path):
    shards = [list(range(0, 9)), list(range(9, 12)), [], list(range(12, 30))]
    values = ok_values(run(tmp_path, 4, shards=shards, W=2))
    assert emitted(values) == list(range(30))
    check_step_counts_agree(values)
    conform(tmp_path)


def test_getitem_exception_fails_its_rank_with_the_index_and_the_others_with_rank_failure(tmp_path):
    res = run(tmp_path, 2, raise_at=[21], W=4, seed=1)
    by_type = sorted((r.error_type, r.error.splitlines()[0]) for r in res)
    assert [t for t, _ in by_type] == ["RankFailure", "SampleError"], by_type
    assert "index 21 failed in preprocessing" in by_type[1][1]
    assert "round" in by_type[0][1] and "local error" in by_type[0][1]
    rows = conform(tmp_path, allow_abort=True)
    assert rows["return_abort"] == 2  # the abort went through the table on both ranks


def test_collate_exception_fails_its_rank_and_the_others_with_rank_failure(tmp_path):
    res = run(tmp_path, 2, collate="bad", W=4)
    types = sorted(r.error_type for r in res)
    assert types == ["RankFailure", "SampleError"], [(r.status, r.error) for r in res]
    failing = next(r for r in res if r.error_type == "SampleError")
    assert "collate_fn raised ValueError" in failing.error and "7" in failing.error
    assert conform(tmp_path, allow_abort=True)["return_abort"] == 2


def test_a_dead_rank_makes_the_others_raise_rank_failure_within_the_timeout(tmp_path):
    t0 = time.monotonic()
    res = run(tmp_path, 3, die_at=2, die_rank=0, W=4, timeout_s=4, proc_timeout=40)
    assert res[0].status == "died"
    for r in res[1:]:
        assert r.error_type == "RankFailure", (r.status, r.error)
        assert "round" in r.error
    assert time.monotonic() - t0 < 30
    conform(tmp_path, allow_abort=True, died={0})


def test_a_stalled_rank_makes_the_others_raise_rank_failure_within_the_timeout(tmp_path):
    # Slow by design (about 6 s): rank 0's consumer sleeps 6 s, longer than timeout_s=2; its engine fills
    # its queue and stops posting, so rank 1's header collective times out (the gloo timeout path).
    res = run(tmp_path, 2, W=2, stall_at=0, stall_rank=0, stall_s=6, timeout_s=2, proc_timeout=40)
    assert res[1].error_type == "RankFailure", (res[1].status, res[1].error)
    assert "did not complete within timeout_s=2" in res[1].error and res[1].seconds < 5.5
    assert res[0].error_type == "RankFailure", (res[0].status, res[0].error)  # its peer is gone when it wakes
    conform(tmp_path, allow_abort=True)


def test_one_rank_breaking_early_is_not_hidden_from_the_others(tmp_path):
    res = run(tmp_path, 2, W=4, break_at=1, break_rank=0)
    assert sorted(r.status for r in res) == ["error", "ok"], [(r.status, r.error) for r in res]
    err = next(r for r in res if r.status == "error")
    assert err.error_type == "RankFailure" and "stopped iterating" in err.error
    assert "rank 0 stopped iterating" in err.error and "round" in err.error
    rows = conform(tmp_path, allow_abort=True)
    assert rows["return_abort"] == 2 and "return_stop" not in rows


def test_ranks_that_stop_at_the_same_step_never_raise_even_if_one_consumer_lags(tmp_path):
    # Rank 1's consumer sleeps after its first batch, so rank 0 breaks at step 3 and posts its stop
    # while rank 1 still has steps 1..3 queued.  Those batches are valid on every rank: rank 1 must
    # get them, break at the same step, and see no error (the abort's RankFailure queues behind them).
    values = ok_values(run(tmp_path, 2, W=4, break_at=3, stall_at=0, stall_rank=1, stall_s=1.0))
    assert [len(v["steps"]) for v in values] == [4, 4]
    conform(tmp_path, allow_abort=True)


def test_a_fetch_error_on_one_rank_ends_both_ranks_through_the_table_without_a_timeout(tmp_path):
    # oversize="error" on one rank's sample: the fetch raises on rank 1 only; rank 0 keeps
    # emitting until the abort round, and both ranks end there (no timeout involved).
    lengths = list(LENGTHS)
    lengths[60] = 1000
    shards = [list(range(0, 40)), list(range(40, 80))]
    t0 = time.monotonic()
    res = run(tmp_path, 2, lengths=lengths, shards=shards, oversize="error", W=4, timeout_s=20)
    assert [r.error_type for r in res] == ["RankFailure", "SampleError"], [(r.status, r.error) for r in res]
    assert "index 60 has sizes" in res[1].error and "rank 1 failed with a local error" in res[0].error
    assert time.monotonic() - t0 < 15  # well under timeout_s: the abort came through the collective
    assert conform(tmp_path, allow_abort=True)["return_abort"] == 2


def test_all_ranks_breaking_at_the_same_step_shut_down_cleanly(tmp_path):
    res = run(tmp_path, 2, W=4, break_at=2)
    values = ok_values(res)
    assert [len(v["steps"]) for v in values] == [3, 3]
    assert conform(tmp_path, allow_abort=True)["return_abort"] == 2


def test_resume_round_trip_emits_every_sample_exactly_once(tmp_path):
    shards = [list(range(0, 45)), list(range(45, 70))]
    first = ok_values(run(tmp_path / "a", 2, shards=shards, W=8, save_at=3))
    states = [v["state"] for v in first]
    second = ok_values(run(tmp_path / "b", 2, shards=shards, W=8, state=states))
    assert emitted(first + second) == list(range(70))
    conform(tmp_path / "b")


def test_spawned_ranks_align_and_scale_losses(tmp_path):
    values = ok_values(run(tmp_path, 2, W=8, start_method="spawn", proc_timeout=120))
    assert emitted(values) == list(range(80))
    check_step_counts_agree(values)
    conform(tmp_path)


def test_detail_debug_mode_checks_every_collective(tmp_path):
    values = ok_values(run(tmp_path, 2, W=8, shards=[list(range(30)), list(range(30, 41))],
                           env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}))
    assert emitted(values) == list(range(41))
    conform(tmp_path)


TORCHRUN_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from mp_harness import scenario, make_lengths
    dist.init_process_group("gloo")
    out = scenario(dist.get_rank(), dist.get_world_size(),
                   {{"lengths": make_lengths(40, 2, lo=2), "W": 8, "trace_dir": {traces!r}, "timeout_s": 20}})
    with open(os.path.join({out!r}, f"r{{dist.get_rank()}}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()  # tear down together: a peer gone mid-teardown can abort gloo
    dist.destroy_process_group()
""")


def _torchrun_job(tmp_path) -> str:
    """Write the torchrun job script (40 samples, W=8, traces under tmp_path) and return its path."""
    script = tmp_path / "job.py"
    script.write_text(TORCHRUN_SCRIPT.format(tests=os.path.dirname(__file__), traces=str(tmp_path / "traces"),
                                             out=str(tmp_path)))
    return str(script)


def _check_torchrun_job(tmp_path) -> None:
    import json

    values = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    assert emitted(values) == list(range(40))
    conform(tmp_path)


def test_torchrun_two_processes_on_loopback(tmp_path):
    script = _torchrun_job(tmp_path)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_torchrun_job(tmp_path)


def test_torchrun_two_nodes_on_loopback(tmp_path):
    """``--nnodes 2`` (one process per node, static rendezvous on 127.0.0.1): every sample exactly once."""
    import socket

    script = _torchrun_job(tmp_path)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank",
                               str(n), "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port",
                               str(port), script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for n in range(2)]
    try:
        outs = [p.communicate(timeout=120) for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert all(p.returncode == 0 for p in nodes), [o[1][-2000:] for o in outs]
    _check_torchrun_job(tmp_path)


def test_real_runs_fire_every_table_row(tmp_path):
    """Across this module's runs every row fired (run alone, the PAD and the early-break scenarios cover them),
    but the round exchange's flush round: the loader does not exchange (cfg xchg = 0), so it must never fire."""
    rows = {r.name for r in DGAP.rows} - {"return_flush"}
    if set(COVERAGE) - {"return_abort"} != rows - {"return_abort"}:
        test_pad_with_uneven_custom_shards_and_drops_emits_every_sample_once(tmp_path / "pad")
    if "return_abort" not in COVERAGE:
        test_one_rank_breaking_early_is_not_hidden_from_the_others(tmp_path / "abort")
    assert set(COVERAGE) == rows, COVERAGE
    assert all(COVERAGE[r] > 0 for r in rows)
