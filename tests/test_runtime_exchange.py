"""The round exchange in the loader (``placement=odb.Exchanged()``): its batches moved between gloo ranks as the plan
says, batch for batch the simulation's, every sample once, exact counts, conformant traces; and its failures: a
batch that cannot be pickled stops every rank through the table, a dead or hung peer is a RankFailure within
``timeout_s``.  Slow tier (gloo processes)."""

from __future__ import annotations

import os
import time

import pytest

from mp_harness import Samples, make_lengths, run_ranks, scenario
from odb.batching import make_cost_model
from odb.core.sim import simulate
from odb.runtime.source import shard_order

BUDGET = 160
LENGTHS = make_lengths(260, seed=11, lo=2, hi=150)
DROPS = {5, 77}


def _collate(samples):
    import torch

    n = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), n, dtype=torch.long)
    for k, s in enumerate(samples):
        ids[k, :len(s["input_ids"])] = torch.tensor(s["input_ids"])
    return {"input_ids": ids, "id": [s["id"][0] for s in samples]}


class _Odd(Samples):
    """Sample i carries an object pickle refuses (a lambda) when i is in `odd`."""

    def __init__(self, lengths, odd):
        super().__init__(lengths, drop=DROPS)
        self.odd = set(odd)

    def __getitem__(self, i):
        s = super().__getitem__(i)
        if s is not None and i in self.odd:
            s["hook"] = lambda: i
        return s


def _run(rank, world_size, spec):
    import odb

    odd = spec.get("odd_rank") == rank  # that rank's process reads samples pickle refuses
    data = _Odd(LENGTHS, range(len(LENGTHS))) if odd else Samples(LENGTHS, drop=DROPS)
    loader = odb.ODBDataLoader(data, BUDGET, _collate, buffer_size=spec["W"], mode=spec["mode"], sharding="dealt",
                               seed=5, timeout_s=spec.get("timeout_s", 30), placement=_placement(spec),
                               trace_dir=spec.get("trace_dir"))
    steps, error = [], None
    try:
        for batch in loader:
            info = odb.pop_step_info(batch)
            assert info.filler or batch["id"] == list(info.indices), (batch["id"], info.indices)
            steps.append((None if info.filler else list(info.indices), info.loss_scale, info.global_samples,
                          info.local_samples, info.global_tokens, info.local_tokens, info.round, info.step))
    except Exception as e:  # noqa: BLE001 - reported to the test
        error = (type(e).__name__, str(e))
    st = loader.stats
    out = {"steps": steps, "error": error, "done": sorted(loader.ledger.done), "sent": st.exchange_sent,
           "received": st.exchange_received, "bytes": st.exchange_bytes}
    loader.close()
    return out


def _placement(spec):
    import odb

    pool = spec.get("pool", 1)
    if spec.get("exchange", True):
        return odb.Exchanged(pool=pool, slack=spec.get("slack", 0.0))
    return odb.Pooled(pool) if pool > 1 else None


def _simulated(world_size, spec):
    import odb

    order = shard_order(len(LENGTHS), 0, 1, True, 5, 0)
    deal = [None if i in DROPS else ((LENGTHS[i],), LENGTHS[i] - 1) for i in order]
    settings = odb.LoaderSettings(token_budget=None, cost=make_cost_model("padded", BUDGET), buffer_size=spec["W"],
                                  mode=spec["mode"], placement=_placement(spec))
    sim = simulate([[] for _ in range(world_size)], settings, deal=deal, replicas=True)
    return [[None if b is None else [order[p] for p in b] for b in row] for row in sim.batches]


@pytest.mark.slow
@pytest.mark.parametrize("world, mode, W, pool, slack", [(4, "pad", 8, 1, 0.0), (3, "quota", 10, 1, 0.0),
                                                         (4, "pad", 6, 2, 0.0), (4, "pad", 8, 1, 0.05)])
def test_the_loader_exchanges_on_gloo_ranks_as_simulated_and_its_traces_conform(tmp_path, world, mode, W, pool,
                                                                                 slack):
    from proofs.conformance.check import assert_conformant

    trace = str(tmp_path / "trace")
    spec = {"W": W, "mode": mode, "pool": pool, "trace_dir": trace, "slack": slack}
    res = run_ranks(_run, world, tmp_path, args=(spec,), timeout_s=120)
    assert all(r.status == "ok" for r in res), [(r.status, r.error_type, (r.error or "")[:800]) for r in res]
    got = [r.value for r in res]
    assert all(g["error"] is None for g in got), [g["error"] for g in got]
    batches = [[s[0] for s in g["steps"]] for g in got]
    assert batches == _simulated(world, spec)  # the simulated code is the code that runs, moves included
    assert batches != _simulated(world, {**spec, "exchange": False})  # and batches did move
    if slack:  # budget balance changed the plan somewhere (and the traces conform with it, below)
        assert batches != _simulated(world, {**spec, "slack": 0.0})
    sent, received = sum(g["sent"] for g in got), sum(g["received"] for g in got)
    assert sent == received > 0 and all(g["bytes"] > 0 for g in got if g["sent"] or g["received"])
    steps = len(got[0]["steps"])
    assert all(len(g["steps"]) == steps for g in got)
    emitted = sorted(i for row in batches for b in row if b for i in b)
    assert len(emitted) == len(set(emitted))
    if mode == "pad":
        assert emitted == sorted(set(range(len(LENGTHS))) - DROPS)
    # the ledger records what each rank ran (moved batches included): disjoint, and every emitted position once
    order = shard_order(len(LENGTHS), 0, 1, True, 5, 0)
    done = [set(g["done"]) for g in got]
    assert sum(map(len, done)) == len(set().union(*done)) == len(emitted)
    assert sorted(order[p] for d in done for p in d) == emitted
    for j in range(steps):  # exact counts at every step, wherever its batches were formed
        step = [g["steps"][j] for g in got]
        assert len({s[2] for s in step}) == 1 and step[0][2] == sum(s[3] for s in step)
        assert len({s[4] for s in step}) == 1 and step[0][4] == sum(s[5] for s in step)
        assert len({(s[6], s[7]) for s in step}) == 1
        if step[0][2]:
            assert sum(s[1] for s in step) == pytest.approx(world)
    rows = assert_conformant(trace)
    assert rows["return_flush"] == world  # one pass: one flush round on every rank


def _scenario(tmp_path, world, **spec):
    spec = {"lengths": LENGTHS, "budget": BUDGET, "sharding": "dealt", "exchange": True, "seed": 5,
            "trace_dir": str(tmp_path / "trace"), **spec}
    res = run_ranks(scenario, world, tmp_path, args=(spec,), timeout_s=120)
    assert all(r.status == "ok" for r in res), [(r.status, r.error_type, (r.error or "")[:800]) for r in res]
    return [r.value for r in res]


@pytest.mark.slow
@pytest.mark.parametrize("n, m, mode, W, pool, k", [(4, 4, "pad", 8, 1, 5), (4, 2, "pad", 6, 2, 11),
                                                    (3, 2, "quota", 10, 1, 4)])
def test_a_checkpoint_taken_mid_pass_with_batches_in_flight_resumes_every_sample_exactly_once(tmp_path, n, m, mode,
                                                                                                W, pool, k):
    """Every rank saves after step k, with batches formed, moved and not yet run: those are in no rank's ledger
    and are dealt again.  Resumed on the same ranks (per-rank states) or on others (merged)."""
    from odb.runtime import merge_states
    from proofs.conformance.check import assert_conformant

    first = _scenario(tmp_path / "a", n, W=W, pool=pool, mode=mode, save_at=k)
    assert sum(v["stats"]["exchange_received"] for v in first) > 0  # batches had moved before the save
    states = [v["state"] for v in first]
    second = _scenario(tmp_path / "b", m, W=W, pool=pool, mode=mode,
                       state=states if m == n else merge_states(states))
    ids = [[i for v in run for s in v["steps"] for i in s["ids"]] for run in (first, second)]
    assert not set(ids[0]) & set(ids[1]) and len(set(ids[1])) == len(ids[1])
    left = [i for v in second for i in v["stats"]["unemitted_indices"]]  # QUOTA: counted, not emitted
    assert sorted(ids[0] + ids[1] + left) == list(range(len(LENGTHS))), (len(ids[0]), len(ids[1]))
    assert_conformant(str(tmp_path / "b" / "trace"))


@pytest.mark.slow
def test_a_batch_that_cannot_be_pickled_stops_every_rank_through_the_table(tmp_path):
    # rank 1's samples are unpicklable: its first moved batch fails; it and its receiver raise SampleError
    # naming it, the others a RankFailure behind their released batches, all after the same step
    spec = {"W": 8, "mode": "pad", "odd_rank": 1, "trace_dir": str(tmp_path / "trace"), "timeout_s": 20}
    t0 = time.monotonic()
    res = run_ranks(_run, 4, tmp_path, args=(spec,), timeout_s=90)
    assert time.monotonic() - t0 < 60
    assert all(r.status == "ok" for r in res), [(r.status, r.error_type, (r.error or "")[:800]) for r in res]
    errors = [r.value["error"] for r in res]
    assert all(e is not None for e in errors), errors
    kinds = {e[0] for e in errors}
    assert "SampleError" in kinds and kinds <= {"SampleError", "RankFailure"}, errors
    assert "cannot send dataset indices" in errors[1][1] and "pickl" in errors[1][1], errors
    assert "or pass placement=None" in errors[1][1], errors  # the way out, now that the exchange is the default
    assert "(placement=odb.Exchanged(pool=1, slack=0.0))" in errors[1][1], errors  # as passed, not "the default"
    assert [e[0] for e in errors].count("SampleError") == 2, errors
    assert any("lost the batches of rank 1" in e[1] for e in errors), errors
    steps = {len(r.value["steps"]) for r in res}
    assert len(steps) == 1, steps  # every rank stopped after the same step
    from proofs.conformance.check import assert_conformant

    assert_conformant(spec["trace_dir"], allow_abort=True)


def _transfer(rank, world_size, how):
    from datetime import timedelta

    import torch.distributed as dist

    from odb.core.types import Batch
    from odb.runtime.transport import BatchTransfer

    g = dist.new_group(backend="gloo", timeout=timedelta(seconds=30))
    tr = BatchTransfer(g)
    dist.barrier(group=g)  # the group's connections are up: a death now is one in the transfer, not in new_group
    if rank == 1:
        if how == "dies":
            os._exit(3)
        time.sleep(4)  # hangs: never sends
        return None
    t0 = time.monotonic()
    try:
        tr.move([(1, (0, 0), Batch([{"x": 1}], (0,), (0,), (1,), (1, 1, 1)))], [(1, (1, 0))], timeout_s=1.5)
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, str(e), time.monotonic() - t0
    return "returned", "", time.monotonic() - t0


@pytest.mark.slow
@pytest.mark.parametrize("how", ["hangs", "dies"])
def test_a_peer_that_hangs_or_dies_in_a_transfer_is_an_error_within_the_timeout(tmp_path, how):
    res = run_ranks(_transfer, 2, tmp_path, args=(how,), timeout_s=60)
    assert res[0].status == "ok", (res[0].error_type, res[0].error)
    kind, text, seconds = res[0].value
    assert kind == "RuntimeError" and seconds < 10, res[0].value


def _engine_transfer_fails(rank, world_size):
    """The engine's side: a transfer that gloo fails becomes a RankFailure naming the exchange."""
    import odb

    data = Samples(LENGTHS, drop=DROPS)
    loader = odb.ODBDataLoader(data, BUDGET, _collate, buffer_size=8, mode="pad", sharding="dealt", seed=5,
                               timeout_s=3, placement=odb.Exchanged())
    it = iter(loader)
    if rank == 1:
        next(it)
        os._exit(3)  # dies with batches formed and planned
    try:
        for _ in it:
            pass
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, str(e)
    return "returned", ""


@pytest.mark.slow
def test_a_dead_peer_is_a_rank_failure_on_every_other_rank_within_the_timeout(tmp_path):
    t0 = time.monotonic()
    res = run_ranks(_engine_transfer_fails, 3, tmp_path, timeout_s=60)
    assert time.monotonic() - t0 < 40
    for r in (0, 2):
        assert res[r].status == "ok", (res[r].error_type, res[r].error)
        assert res[r].value[0] == "RankFailure", res[r].value


def test_the_exchange_setting_is_refused_where_ranks_run_different_steps_or_bring_their_own_samples():
    import odb
    from mp_harness import ListSampler
    from odb.errors import ConfigError

    data = Samples(LENGTHS)
    for kw in ({"mode": "join"}, {"sharding": "fixed"}, {"sampler": ListSampler(range(10))}):
        with pytest.raises(ConfigError, match=r"odb.Exchanged\(...\) needs mode 'pad' or 'quota'"):
            odb.ODBDataLoader(data, BUDGET, _collate, placement=odb.Exchanged(), **kw)
    for bad in (True, "exchanged", {"kind": "exchange"}, {"kind": "exchanged", "slak": 0.01}):
        with pytest.raises(ConfigError, match="placement"):
            odb.ODBDataLoader(data, BUDGET, _collate, placement=bad)
    for bad in (-0.01, 0.2, True, "0.01"):
        with pytest.raises(ConfigError, match="slack"):
            odb.Exchanged(slack=bad)
    for moved in ({"exchange": True}, {"exchange_slack": 0.01}, {"pool_size": 2}, {"prefetch_factor": 4}):
        with pytest.raises(ConfigError, match="moved.*now (placement|dataloader)"):
            odb.ODBDataLoader(data, BUDGET, _collate, **moved)
    assert odb.LoaderSettings(token_budget=64, placement={"kind": "exchanged", "pool": 1, "slack": 0.0125}).placement \
        == odb.Exchanged(slack=0.0125)  # the JSON form `odb plan --json` prints
    loader = odb.ODBDataLoader(data, BUDGET, _collate, placement=odb.Exchanged(slack=0.0125))
    try:  # compared in the construction check, and what the core's plan reads
        assert loader.shared.exchange_slack == loader.layout.slack == 125
    finally:
        loader.close()


def test_on_one_rank_the_exchange_moves_nothing_and_emits_the_simulations_batches():
    spec = {"W": 8, "mode": "pad"}
    got = _run(0, 1, spec)
    assert got["error"] is None and got["sent"] == got["received"] == 0
    assert [[s[0] for s in got["steps"]]] == _simulated(1, spec)


def test_a_moved_samples_tensors_arrive_with_their_values_dtypes_and_shapes():
    import pickle

    import numpy as np
    import torch

    from odb.runtime.transport import _dumps

    base = torch.arange(20)
    x = {"view": base[3:9], "bf16": torch.ones(2, 3, dtype=torch.bfloat16), "grad": torch.zeros(3, requires_grad=True),
         "t": torch.arange(12.0).view(3, 4).t(), "bool": torch.tensor(True), "text": "a", "list": [1, torch.ones(1)],
         "np": np.arange(3)}
    y = pickle.loads(_dumps(x))
    for k in ("view", "bf16", "grad", "t", "bool"):
        assert type(y[k]) is torch.Tensor and y[k].dtype == x[k].dtype and y[k].shape == x[k].shape
        assert torch.equal(y[k].detach(), x[k].detach()), k
    assert y["grad"].requires_grad and y["text"] == "a" and torch.equal(y["list"][1], torch.ones(1))
    assert (y["np"] == np.arange(3)).all()
    y["view"] += 1  # writable, and its own memory: a view's storage is not sent whole
    assert y["view"].untyped_storage().nbytes() == 6 * 8 and torch.equal(base[3:9], torch.arange(3, 9))
