"""Replicated decisions on 2 gloo ranks (issue 12): rank-local values never reach them, divergence is loud.

Slow tier: each test starts processes (about 2-6 s each on 2 cores).  Every traced run is checked
by the conformance checker.
"""

import os
import random
import time

import pytest
import torch

from mp_harness import ListSampler, Samples, id_collate, make_lengths, run_ranks, scenario
from proofs.conformance import assert_conformant, check_dir

pytestmark = pytest.mark.slow

_rng = random.Random(12)
LONG_TAIL = [_rng.randint(40, 120) if _rng.random() < 0.125 else _rng.randint(2, 12) for _ in range(600)]


def ok(res):
    assert all(r.status == "ok" for r in res), [(r.status, r.error_type, (r.error or "")[:1500]) for r in res]
    return [r.value for r in res]


def emitted(values):
    return sorted(i for v in values for s in v["steps"] for i in s["ids"])


# -- rank-local settings never reach a replicated decision -----------------------------------------------------
def _with_kwargs(rank, world_size, spec, per_rank):
    import odb

    loader = odb.ODBDataLoader(Samples(spec["lengths"]), spec.get("budget", 160), id_collate,
                               buffer_size=spec.get("W", 8), timeout_s=30, trace_dir=spec.get("trace_dir"),
                               **per_rank[rank])
    out = []
    for batch in loader:
        info = odb.pop_step_info(batch)
        out.extend(batch["id"][:, 0].tolist() if not info.filler else [])
    stats = loader.stats.as_dict()
    loader.close()
    return {"ids": out, "stats": stats}


@pytest.mark.parametrize("per_rank", [
    [{"num_workers": 0}, {"num_workers": 2}],                                      # per-node workers
    [{"num_workers": 2, "dataloader": {"prefetch_factor": 2}},
     {"num_workers": 2, "dataloader": {"prefetch_factor": 6}}],                    # prefetch alone
])
def test_dealt_ranks_with_different_workers_emit_every_sample_exactly_once(tmp_path, per_rank):
    # defect: the dealer's replicas read each rank's own num_workers * prefetch_factor: 134 of 600
    # indices emitted twice and 138 never, silently
    spec = {"lengths": LONG_TAIL, "trace_dir": str(tmp_path / "traces")}
    values = ok(run_ranks(_with_kwargs, 2, tmp_path, args=(spec, per_rank), timeout_s=120))
    ids = sorted(i for v in values for i in v["ids"])
    assert ids == list(range(len(LONG_TAIL)))
    assert sum(v["stats"]["dealt"] + v["stats"]["reserve_taken"] for v in values) == len(LONG_TAIL)
    assert_conformant(str(tmp_path / "traces"))


def _epochs(rank, world_size, sharding):
    import odb

    loader = odb.ODBDataLoader(Samples(make_lengths(60, 2, 2, 20)), 64, id_collate, buffer_size=8,
                               sharding=sharding, timeout_s=30)
    loader.set_epoch(rank)  # rank 0 at epoch 0, rank 1 at epoch 1: different orders
    got = 0
    try:
        for _ in map(odb.pop_step_info, loader):
            got += 1
    finally:
        loader.close()
    return got


@pytest.mark.parametrize("sharding", ["dealt", "fixed"])
def test_ranks_on_different_epochs_all_get_a_config_error_before_any_batch(tmp_path, sharding):
    # defect: not detected; 69-81 samples duplicated and as many missing
    res = run_ranks(_epochs, 2, tmp_path, args=(sharding,), timeout_s=60)
    assert [r.error_type for r in res] == ["ConfigError", "ConfigError"], [(r.status, r.error) for r in res]
    assert all("different epochs" in r.error and "round 0" in r.error for r in res)


class _LocalProposal:
    """A seeded bug: a policy whose proposal reads a rank-local value from its second round on."""

    def __new__(cls, rank):
        from odb.batching import BalancedPolicy

        class Local(BalancedPolicy):
            def propose(self, summaries, window):
                self._calls = getattr(self, "_calls", 0) + 1
                p = super().propose(summaries, window)
                return max(1, p - rank) if self._calls >= 2 else p
        Local.__qualname__ = "Local"
        return Local()


def _diverge(rank, world_size, spec):
    import odb

    kw = {}
    if spec["what"] == "proposal":
        kw["policy"] = _LocalProposal(rank)
    loader = odb.ODBDataLoader(Samples(LONG_TAIL[:300]), 160, id_collate, buffer_size=8, timeout_s=30,
                               trace_dir=spec["trace_dir"], **kw)
    if spec["what"] == "deal" and rank == 1:
        loader.aheads = (loader.aheads[0] + 5,) + loader.aheads[1:]  # a seeded rank-local perturbation
    steps = 0
    try:
        for _ in map(odb.pop_step_info, loader):
            steps += 1
    finally:
        loader.close()
    return steps


@pytest.mark.parametrize("what, field", [("proposal", "'target'"), ("deal", "'deal'")])
def test_replicas_that_diverge_fail_every_rank_in_the_same_round_naming_the_field(tmp_path, what, field):
    spec = {"what": what, "trace_dir": str(tmp_path / "traces")}
    res = run_ranks(_diverge, 2, tmp_path, args=(spec,), timeout_s=60)
    assert [r.error_type for r in res] == ["ProtocolError", "ProtocolError"], [(r.status, r.error) for r in res]
    first = [r.error.splitlines()[0] for r in res]
    assert all("replicated state diverged" in m and field in m and "ranks [0]" in m and "ranks [1]" in m
               for m in first), first
    rounds = {m.split("before round ")[1].split(":")[0] for m in first}
    assert len(rounds) == 1, first  # the same round on every rank
    # the conformance checker sees the same divergence in the traces, and names the same field
    problems = [p for rep in check_dir(spec["trace_dir"]) for p in rep.problems]
    assert any(f"different {field}" in p for p in problems) and all("different" in p for p in problems), problems


# -- fillers, labels and loss scales ------------------------------------------------------------------------------
def _filler_sizes(rank, world_size, lengths, shards, budget):
    import odb

    loader = odb.ODBDataLoader(Samples(lengths), budget, id_collate, buffer_size=4, timeout_s=30,
                               sampler=ListSampler(shards[rank]))
    out = []
    for batch in loader:
        info = odb.pop_step_info(batch)
        if info.filler:
            out.append(int(batch["input_ids"].shape[0] * batch["input_ids"].shape[1]))
    loader.close()
    return out


def test_fillers_replay_the_cheapest_sample_within_the_budget_never_an_oversize_one(tmp_path):
    # defect: fillers replayed the rank's first sample even when over budget (23 steps of 2000 vs 512)
    lengths = [2000, 40, 300, 300] + [100] * 60
    shards = [list(range(4, 64)), [0, 1, 2, 3]]
    fills = ok(run_ranks(_filler_sizes, 2, tmp_path, args=(lengths, shards, 512), timeout_s=60))
    assert fills[0] == [] and len(fills[1]) >= 3
    assert set(fills[1]) == {40}, fills[1]


def _scales(rank, world_size, basis, lengths):
    import odb

    loader = odb.ODBDataLoader(Samples(lengths), 96, id_collate, buffer_size=6, timeout_s=30, loss_basis=basis,
                               sampler=ListSampler(range(rank, len(lengths) if rank == 0 else 40, world_size)))
    out = []
    for batch in loader:
        i = odb.pop_step_info(batch)
        out.append((i.loss_scale, i.local_tokens, i.global_tokens, i.local_label_tokens, i.global_label_tokens,
                    i.local_samples, i.global_samples, i.filler))
    loader.close()
    return out


@pytest.mark.parametrize("basis, slot", [("label_tokens", 3), ("tokens", 1), ("samples", 5)])
def test_loss_scale_equals_its_definition_at_every_step_on_every_rank(tmp_path, basis, slot):
    # defect class: the tokens and label_tokens slots of loss_scale swapped (scales still summed to N)
    lengths = make_lengths(90, 8, 2, 40)  # labels: [-100] + ones, so tokens != label tokens
    per_rank = ok(run_ranks(_scales, 2, tmp_path, args=(basis, lengths), timeout_s=60))
    assert len(per_rank[0]) == len(per_rank[1]) > 0
    for k, steps in enumerate(zip(*per_rank)):
        for j in (2, 4, 6):  # every global count is the sum of the ranks' local counts
            assert steps[0][j] == steps[1][j] == steps[0][j - 1] + steps[1][j - 1], (k, steps)
        for s in steps:
            want = 0.0 if s[7] or s[slot + 1] == 0 else 2 * s[slot] / s[slot + 1]
            assert s[0] == pytest.approx(want), (k, basis, s)


def _masked(rank, world_size):
    import odb

    class NoLabels(torch.utils.data.Dataset):
        def __len__(self):
            return 200

        def __getitem__(self, i):
            return {"input_ids": [1] * (3 + i % 5), "labels": [-100] * (3 + i % 5), "id": [i]}
    loader = odb.ODBDataLoader(NoLabels(), 64, id_collate, buffer_size=8, timeout_s=30)
    steps = 0
    try:
        for _ in map(odb.pop_step_info, loader):
            steps += 1
    except odb.SampleError as e:
        return steps, str(e)
    finally:
        loader.close()
    return steps, None


def test_labels_all_masked_raise_on_every_rank_after_the_same_step(tmp_path):
    values = ok(run_ranks(_masked, 2, tmp_path, timeout_s=60))
    assert all(err and "not one label token" in err for _, err in values), values
    assert values[0][0] == values[1][0]


# -- failures: fast, clear, through the table -------------------------------------------------------------------
def _only_rank0_constructs(rank, world_size):
    import odb

    if rank == 1:
        time.sleep(6)
        return "absent"
    t0 = time.monotonic()
    try:
        odb.ODBDataLoader(Samples([5] * 10), 64, id_collate, timeout_s=3)
    except odb.RankFailure as e:
        return ("RankFailure", time.monotonic() - t0, str(e))
    return "constructed"


def test_a_rank_missing_at_construction_gives_rank_failure_within_timeout_s(tmp_path):
    # defect: a bare RuntimeError "Wait timeout" from new_group
    res = run_ranks(_only_rank0_constructs, 2, tmp_path, timeout_s=60)
    kind, secs, msg = res[0].value
    assert kind == "RankFailure" and secs < 10 and "did not construct its loader" in msg


class _DiesOnRank0(torch.utils.data.Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, i):
        import torch.distributed as dist

        if i == 100 and dist.get_rank() == 0:  # rank 0's fixed shard holds the even indices
            os._exit(3)
        return {"input_ids": [1] * (2 + i % 9), "id": [i]}


def _dead_worker(rank, world_size):
    import odb

    loader = odb.ODBDataLoader(_DiesOnRank0(), 64, id_collate, buffer_size=8, num_workers=2 if rank == 0 else 0,
                               timeout_s=120, sharding="fixed", shuffle=False)
    t0 = time.monotonic()
    try:
        for _ in map(odb.pop_step_info, loader):
            pass
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, time.monotonic() - t0, str(e)[:300]
    finally:
        loader.close()
    return "ok", time.monotonic() - t0, ""


def test_a_dead_worker_fails_its_rank_at_once_and_the_peer_through_the_abort(tmp_path):
    # defect: noticed after timeout_s (300 s) as a raw RuntimeError; the peer saw a timeout
    res = ok(run_ranks(_dead_worker, 2, tmp_path, timeout_s=100, start_method="fork"))
    (k0, s0, m0), (k1, s1, m1) = res
    assert k0 == "RuntimeError" and "DataLoader worker" in m0 and s0 < 30, res
    assert k1 == "RankFailure" and "failed with a local error" in m1 and s1 < 30, res


def test_a_dead_peer_is_seen_within_seconds_even_with_a_long_timeout(tmp_path):
    # the long default timeout_s waits for a slow peer; a dead one is seen by the transport at once
    t0 = time.monotonic()
    res = run_ranks(scenario, 2, tmp_path, args=({"lengths": LONG_TAIL[:200], "W": 8, "die_at": 3, "die_rank": 1,
                                                  "timeout_s": 600},), timeout_s=120)
    assert res[1].status == "died" and res[0].error_type == "RankFailure", res
    assert time.monotonic() - t0 < 60 and "timeout_s=600" in res[0].error


def _failing_policy(rank: int, method: str):
    """The default policy, except that on rank 1 its third call of `method` raises: ``summarize`` (the
    header's summary) or ``groups`` (read for the dealt intake bound while the rank prepares its header)."""
    from odb.batching import BalancedPolicy

    calls = [0]

    def failing(self, *args):
        calls[0] += 1
        if rank == 1 and calls[0] == 3:
            raise ZeroDivisionError(f"injected {method} bug")
        return getattr(BalancedPolicy, method)(self, *args)
    return type("Bug", (BalancedPolicy,), {method: failing})()


def _policy_bug(rank, world_size, trace_dir, method):
    import odb

    loader = odb.ODBDataLoader(Samples(LONG_TAIL[:200]), 160, id_collate, buffer_size=8, timeout_s=30,
                               policy=_failing_policy(rank, method), trace_dir=trace_dir)
    assert loader.sharding == "dealt"  # the intake bound is posted only when dealing
    try:
        for _ in map(odb.pop_step_info, loader):
            pass
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, str(e).splitlines()[0]
    finally:
        loader.close()
    return "ok", ""


@pytest.mark.parametrize("method, message", [
    # defect: the neutral summary failed the tag check: every rank raised "use the same alignment policy"
    ("summarize", "failed to summarize"),
    # its second cause: the dealt intake bound is computed with the summary
    ("groups", "injected groups bug"),
], ids=["summarize", "intake"])
def test_a_policy_failure_on_one_rank_takes_every_rank_out_through_the_abort_row(tmp_path, method, message):
    trace_dir = str(tmp_path / "traces")
    res = ok(run_ranks(_policy_bug, 2, tmp_path, args=(trace_dir, method), timeout_s=60))
    assert res[1][0] == "ProtocolError" and message in res[1][1], res
    assert res[0][0] == "RankFailure" and "rank 1 failed with a local error" in res[0][1], res
    rows = assert_conformant(trace_dir, allow_abort=True)
    assert rows["return_abort"] == 2


def _cost_of(rank, world_size, kind):
    import odb

    if kind == "budget":
        kw = {"cost": "padded", "token_budget": 128 if rank == 0 else 256}
    else:
        fns = [lambda b: sum(s[0] for s in b), lambda b: len(b) * max(s[0] for s in b)]
        kw = {"cost": fns[rank], "token_budget": 128}
    budget = kw.pop("token_budget")
    try:
        odb.ODBDataLoader(Samples([5] * 10), budget, id_collate, timeout_s=10, **kw).close()
    except odb.ConfigError as e:
        return str(e)
    return ""


@pytest.mark.parametrize("kind, shown", [("budget", ["<=128", "<=256"]), ("callable", ["code="])])
def test_the_construction_check_compares_costs_by_value_and_prints_them(tmp_path, kind, shown):
    # defect: a callable cost compared by type name only; a budget mismatch printed two CRCs
    res = ok(run_ranks(_cost_of, 2, tmp_path, args=(kind,), timeout_s=60))
    assert all("cost (cost, token_budget)" in m and all(s in m for s in shown) for m in res), res


def test_a_traced_run_at_window_256_conforms_with_the_proposal_recomputed(tmp_path):
    # teeth: the checker recomputes policy.propose(summaries, W); with W >= 256 the reservoir depends on W,
    # so an engine calling propose with another window (e.g. the world size) is caught here
    lengths = make_lengths(1200, 21, 2, 30)
    spec = {"lengths": lengths, "W": 256, "budget": 64, "trace_dir": str(tmp_path / "traces")}
    values = ok(run_ranks(scenario, 2, tmp_path, args=(spec,), timeout_s=120))
    assert emitted(values) == list(range(len(lengths)))
    rows = assert_conformant(spec["trace_dir"])
    assert rows["return_go"] >= 4
