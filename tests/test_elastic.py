"""Elastic resume: a checkpoint written by N gloo ranks resumes on M, every sample exactly once (issue 16).

Every rank's `state_dict` at one checkpoint is merged (`odb.runtime.merge_states`) and the merged state
loads on any number of ranks.  Audits go through ``info.indices``: the samples yielded before the
checkpoint plus those yielded after it are every sample of the epoch, once (QUOTA: plus the ones it
reports unemitted).  Slow tier: each case starts 2 x (N + M) processes, about 5 s.
"""

import random
from pathlib import Path

import pytest

from mp_harness import run_ranks, scenario
from odb.errors import ConfigError
from odb.runtime import merge_states
from proofs.conformance import assert_conformant

_rng = random.Random(16)
LENGTHS = [_rng.randint(40, 120) if _rng.random() < 0.15 else _rng.randint(2, 14) for _ in range(240)]
for k in (11, 77, 150):
    LENGTHS[k] = 400  # over the budget of 160: emitted alone
DROPS = [5, 6, 90, 201]
EXPECTED = sorted(set(range(len(LENGTHS))) - set(DROPS))


def _run(tmp_path, world_size, **spec):
    spec = {"lengths": LENGTHS, "drop": DROPS, "budget": 160, "W": 8, "trace_dir": str(tmp_path / "traces"), **spec}
    res = run_ranks(scenario, world_size, tmp_path, args=(spec,), timeout_s=90)
    assert all(r.status == "ok" for r in res), [(r.status, r.error_type, (r.error or "")[:1200]) for r in res]
    return [r.value for r in res]


def _ids(values):
    return [i for v in values for s in v["steps"] for i in s["ids"]]


CASES = [  # (N, M, sharding, mode, checkpoint after step k on every rank)
    (2, 3, "fixed", "pad", 2), (2, 3, "dealt", "pad", 5), (3, 2, "fixed", "pad", 0), (3, 2, "dealt", "pad", 3),
    (4, 1, "fixed", "pad", 4), (4, 1, "dealt", "pad", 1), (2, 3, "dealt", "join", 6), (3, 2, "fixed", "join", 9),
    (4, 1, "dealt", "join", 2), (2, 3, "fixed", "join", 1),
]


@pytest.mark.slow
@pytest.mark.parametrize("n, m, sharding, mode, k", CASES, ids=[f"{c[0]}to{c[1]}-{c[2]}-{c[3]}-k{c[4]}" for c in CASES])
def test_a_checkpoint_of_n_ranks_resumes_on_m_and_every_sample_is_emitted_exactly_once(tmp_path, n, m, sharding,
                                                                                        mode, k):
    first = _run(tmp_path / "a", n, sharding=sharding, mode=mode, save_at=k)
    merged = merge_states([v["state"] for v in first])
    assert merged["kind"] == "global" and merged["world_size"] == n
    second = _run(tmp_path / "b", m, sharding=sharding, mode=mode, state=merged)
    before, after = _ids(first), _ids(second)
    assert sorted(before + after) == EXPECTED, (len(before), len(after), len(EXPECTED))
    assert not set(before) & set(after)
    assert_conformant(str(tmp_path / "b" / "traces"))


@pytest.mark.slow
def test_quota_mode_resumed_on_more_ranks_reports_what_it_did_not_emit(tmp_path):
    first = _run(tmp_path / "a", 2, mode="quota", save_at=3)
    second = _run(tmp_path / "b", 3, mode="quota", state=merge_states([v["state"] for v in first]))
    left = [i for v in second for i in v["stats"]["unemitted_indices"]]
    assert sorted(_ids(first) + _ids(second) + left) == EXPECTED
    assert sum(v["stats"]["unemitted"] for v in second) == len(left)


def _states(tmp_path, save_at=3, **spec):
    return [v["state"] for v in _run(tmp_path, 2, save_at=save_at, **spec)]


@pytest.mark.slow
def test_wrong_merges_are_refused_with_a_clear_error(tmp_path):
    states = _states(tmp_path / "a", sharding="fixed")
    with pytest.raises(ConfigError, match=r"ranks \[1\] missing"):
        merge_states(states[:1])  # a missing rank's file
    with pytest.raises(ConfigError, match="two states for rank 0"):
        merge_states([states[0], states[0]])
    merge_states(states)  # the pair as saved merges; with one setting of one rank's state changed it does not
    for key, other in (("world_size", 3), ("seed", 1), ("shuffle", False), ("sharding", "dealt"), ("epoch", 1),
                       ("mode", "join"), ("order", "sampler")):
        assert states[1][key] != other
        with pytest.raises(ConfigError, match=f"the states disagree on '{key}'"):
            merge_states([states[0], {**states[1], key: other}])
    later = _states(tmp_path / "b", sharding="fixed", save_at=5)
    with pytest.raises(ConfigError, match="different checkpoints"):
        merge_states([states[0], later[1]])  # two files from different steps
    sampled = [v["state"] for v in _run(tmp_path / "c", 2, shards=[list(range(0, 120)), list(range(120, 240))],
                                        save_at=2)]
    with pytest.raises(ConfigError, match="sampler or an IterableDataset decides each rank's samples"):
        merge_states(sampled)
    streamed = [v["state"] for v in _run(tmp_path / "d", 2, shards=[list(range(0, 120)), list(range(120, 240))],
                                         iterable=True, save_at=2)]
    with pytest.raises(ConfigError, match="stream"):
        merge_states(streamed)


def test_a_merged_state_is_refused_by_a_loader_that_cannot_reshard_and_per_rank_states_by_another_world():
    import odb
    from mp_harness import ListSampler, Samples, id_collate

    state = {"version": 3, "kind": "global", "world_size": 2, "seed": 0, "sharding": "fixed", "order": "own",
             "mode": "pad", "epoch": 0, "num_positions": len(LENGTHS), "done": [[0, 4]], "complete": False,
             "steps": [2, 2], "samples": 8}
    with odb.ODBDataLoader(Samples(LENGTHS), 160, id_collate, sampler=ListSampler(range(40))) as loader:
        with pytest.raises(ConfigError, match="cannot resume from a merged state"):
            loader.load_state_dict(state)
    with odb.ODBDataLoader(Samples(LENGTHS[:100]), 160, id_collate, sharding="fixed") as loader:
        with pytest.raises(ConfigError, match="this dataset has 100"):
            loader.load_state_dict(state)
    with odb.ODBDataLoader(Samples(LENGTHS), 160, id_collate, sharding="fixed") as loader:
        rank_state = {**loader.state_dict(), "world_size": 2}
        with pytest.raises(ConfigError, match="merge every rank's state"):
            loader.load_state_dict(rank_state)
        loader.load_state_dict(state)  # a merged state of 2 ranks loads on 1
        got = sorted(i for b in loader for i in odb.pop_step_info(b).indices)
    from odb.runtime.source import shard_order

    perm = shard_order(len(LENGTHS), 0, 1, True, 0, 0)  # the global order: positions 0..3 of it were yielded
    assert got == sorted(set(range(len(LENGTHS))) - set(perm[:4]))


def _stream_run(rank, world_size, spec):
    """A TrainStream over the loader (accumulation 2): consume `stop` optimizer steps, then save every
    rank's state the way Accelerate and Lightning checkpoint it (`gather_rank_states`), or with
    ``spec["own"]`` this rank's ``stream.state_dict()`` (the plain loop's checkpoint); or resume from
    `state` (a gathered entry, or a merged state loaded as it is) and run the epoch out."""
    import odb
    from mp_harness import Samples, id_collate
    from odb.integrations import TrainStream, gather_rank_states, own_rank_state

    loader = odb.ODBDataLoader(Samples(LENGTHS, drop=DROPS), 160, id_collate, buffer_size=8, timeout_s=30,
                               sharding=spec["sharding"])
    stream = TrainStream(loader, 2)
    state = spec.get("state")
    if state is not None:
        stream.load_state_dict(own_rank_state(state, rank, world_size) if "ranks" in state else state)
    ids, saved = [], None
    for ms in stream.epoch():
        ids += list(ms.info.indices)
        if ms.sync and stream.progress.optimizer_steps == spec.get("stop"):
            # SYNC: every rank, after the same step
            saved = stream.state_dict() if spec.get("own") else gather_rank_states(stream.state_dict())
            break
    loader.close()
    return {"ids": ids, "saved": saved, "progress": stream.progress.state_dict()}


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["fixed", "dealt"])
def test_the_gathered_checkpoint_of_accelerate_and_lightning_resumes_on_another_world_size(tmp_path, sharding):
    first = run_ranks(_stream_run, 2, tmp_path / "a", args=({"sharding": sharding, "stop": 3},), timeout_s=90)
    assert all(r.status == "ok" for r in first), [(r.status, (r.error or "")[:800]) for r in first]
    saved = first[0].value["saved"]
    second = run_ranks(_stream_run, 3, tmp_path / "b", args=({"sharding": sharding, "state": saved},), timeout_s=90)
    assert all(r.status == "ok" for r in second), [(r.status, (r.error or "")[:800]) for r in second]
    ids = [i for r in first + second for i in r.value["ids"]]
    assert sorted(ids) == EXPECTED
    assert second[0].value["progress"]["optimizer_steps"] > 3  # the progress carried over and went on


def _ok(res):
    assert all(r.status == "ok" for r in res), [(r.status, (r.error or "")[:800]) for r in res]
    return [r.value for r in res]


@pytest.mark.slow
@pytest.mark.parametrize("n, m, sharding", [(2, 3, "fixed"), (3, 1, "dealt")])
def test_every_ranks_train_stream_state_merged_by_merge_states_resumes_a_plain_loop_on_another_world_size(
        tmp_path, n, m, sharding):
    first = _ok(run_ranks(_stream_run, n, tmp_path / "a", args=({"sharding": sharding, "stop": 3, "own": True},),
                          timeout_s=90))
    states = [v["saved"] for v in first]  # what each rank of a plain loop writes: stream.state_dict()
    merged = merge_states(states[::-1])  # any order
    assert merged["kind"] == "global" and merged["loader"]["kind"] == "global" and "rank" not in merged
    assert merge_states({"version": 1, "world_size": n, "ranks": states}) == merged  # a gathered entry alike
    second = _ok(run_ranks(_stream_run, m, tmp_path / "b", args=({"sharding": sharding, "state": merged},),
                           timeout_s=90))
    assert sorted(i for v in first + second for i in v["ids"]) == EXPECTED
    assert all(v["progress"]["optimizer_steps"] > 3 and v["progress"]["epoch"] == 1 for v in second)
    behind = {**states[1], "progress": {**states[1]["progress"], "optimizer_steps": 2}}
    with pytest.raises(ConfigError, match=r"disagree on the training progress.*save every rank's state after the same"):
        merge_states([states[0], behind] + states[2:])
    with pytest.raises(ConfigError,
                       match=rf"written by {n} ranks: ranks \[{', '.join(map(str, range(1, n)))}\] missing"):
        merge_states(states[:1])
    with pytest.raises(ConfigError, match=r"different kinds \(state 0: rank 0's TrainStream.state_dict\(\) of "
                       rf"{n} ranks; state 1: rank 1's ODBDataLoader.state_dict\(\)"):
        merge_states([states[0], states[1]["loader"]])


def _one_rank_stream_state(stop=3):
    """A TrainStream on one rank (no process group) after `stop` optimizer steps: its state and the indices
    it trained."""
    import odb
    from mp_harness import Samples, id_collate
    from odb.integrations import TrainStream

    with odb.ODBDataLoader(Samples(LENGTHS, drop=DROPS), 160, id_collate, buffer_size=8) as loader:
        stream, ids = TrainStream(loader, 2), []
        for ms in stream.epoch():
            ids += ms.info.indices
            if ms.sync and stream.progress.optimizer_steps == stop:
                return stream.state_dict(), ids


def _fresh_stream():
    import odb
    from mp_harness import Samples, id_collate
    from odb.integrations import TrainStream

    return TrainStream(odb.ODBDataLoader(Samples(LENGTHS, drop=DROPS), 160, id_collate, buffer_size=8), 2)


@pytest.mark.filterwarnings("ignore:rank 0, epoch 0")
def test_a_merged_train_stream_state_resumes_the_stream_and_each_wrong_state_is_refused_naming_the_right_call():
    state, before = _one_rank_stream_state()
    merged = merge_states([state])
    stream = _fresh_stream()
    loader = stream.loader
    try:
        for wrong, said in (
                (state["loader"], r"got rank 0's ODBDataLoader.state_dict\(\) of 1 ranks; it takes this rank's "
                                  r"TrainStream.state_dict\(\).*odb.merge_states\(states\)"),
                (merged["loader"], r"got a merged ODBDataLoader state; it takes this rank's TrainStream.state_dict"),
                ({**state, "world_size": 2}, r"rank 0's TrainStream.state_dict\(\) of 2 ranks, this run has 1 "
                                             r"ranks; merge every rank's TrainStream state .* odb.merge_states"),
                ({**state, "rank": 1}, r"rank 1's, this is rank 0; .*odb.merge_states"),
                ({**state, "version": 2}, r"version=2, kind='rank'; this ODB reads version 1")):
            with pytest.raises(ConfigError, match=said) as err:
                stream.load_state_dict(wrong)
            assert "resharded_state" not in str(err.value) and "version that wrote it" not in str(err.value)
        for wrong, what in ((state, "rank 0's TrainStream.state_dict"), (merged, "a merged TrainStream state"),
                            ({"version": 1, "world_size": 1, "ranks": [state]}, "a gather_rank_states entry")):
            with pytest.raises(ConfigError, match=f"ODBDataLoader.load_state_dict got {what}.*load it with "
                                                  "TrainStream.load_state_dict"):
                loader.load_state_dict(wrong)
        with pytest.raises(ConfigError, match=r"takes every rank's state of one checkpoint in a list; got one state"):
            merge_states(state)
        with pytest.raises(ConfigError, match="state 0 is a merged TrainStream state: it loads on any number of "
                                              "ranks as it is"):
            merge_states([merged])
        with pytest.raises(ConfigError, match="state 0 is a merged ODBDataLoader state .*a merged state loads on any "
                                              "number of ranks as it is"):
            merge_states([merged["loader"]])
        stream.load_state_dict(merged)  # the merged state resumes the stream: the epoch's rest, once
        after = [i for ms in stream.epoch() for i in ms.info.indices]
    finally:
        loader.close()
    assert sorted(before + after) == EXPECTED
    assert stream.progress.epoch == 1 and stream.progress.optimizer_steps > 3


@pytest.mark.slow
@pytest.mark.adapters
def test_an_hf_trainer_checkpoint_folder_of_two_ranks_resumes_on_one(tmp_path):
    import torch

    import odb
    from mp_harness import Samples, id_collate
    from odb.integrations import TrainStream
    from odb.integrations.hf import STATE_FILE, _resume_state

    first = run_ranks(_stream_run, 2, tmp_path / "a", args=({"sharding": "dealt", "stop": 2},), timeout_s=90)
    assert all(r.status == "ok" for r in first), [(r.status, (r.error or "")[:800]) for r in first]
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    for r, state in enumerate(first[0].value["saved"]["ranks"]):  # what ODBTrainer writes: one file per rank
        torch.save(state, folder / STATE_FILE.format(rank=r))
    loader = odb.ODBDataLoader(Samples(LENGTHS, drop=DROPS), 160, id_collate, buffer_size=8, sharding="dealt")
    stream = TrainStream(loader, 2)
    stream.load_state_dict(_resume_state(str(folder), loader))
    ids = [i for ms in stream.epoch() for i in ms.info.indices]
    loader.close()
    assert sorted(ids + [i for r in first for i in r.value["ids"]]) == EXPECTED
    (folder / STATE_FILE.format(rank=1)).unlink()  # a missing rank's file is refused, not resumed
    loader = odb.ODBDataLoader(Samples(LENGTHS, drop=DROPS), 160, id_collate, buffer_size=8, sharding="dealt")
    with pytest.raises(ConfigError, match=r"ranks \[1\] missing"):
        TrainStream(loader, 2).load_state_dict(_resume_state(str(folder), loader))
    loader.close()


ELASTIC_JOB = """
import glob, json, os, sys
import torch.distributed as dist
sys.path.insert(0, {tests!r})
from mp_harness import scenario
from odb.runtime import merge_states
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
spec = json.loads({spec!r})
if spec.pop("phase") == "resume":  # every rank reads every state file the first job wrote, and merges them
    spec["state"] = merge_states([json.load(open(p)) for p in sorted(glob.glob(os.path.join({out!r}, "state_*.json")))])
out = scenario(rank, world, spec)
if "state" in out:
    json.dump(out["state"], open(os.path.join({out!r}, f"state_{{rank}}.json"), "w"))
json.dump(out["steps"], open(os.path.join({out!r}, f"steps_{{spec.get('save_at', 'r')}}_{{rank}}.json"), "w"))
dist.barrier()  # tear down together: a peer gone mid-teardown can abort gloo
dist.destroy_process_group()
"""


def _torchrun_nodes(script: str, nodes: int) -> None:
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node_rank",
                               str(n), "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port",
                               str(port), script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in range(nodes)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]


@pytest.mark.slow
def test_torchrun_on_two_nodes_checkpoints_and_a_restart_on_three_nodes_resumes_exactly_once(tmp_path):
    import json

    base = {"lengths": LENGTHS, "drop": DROPS, "budget": 160, "W": 8, "sharding": "dealt", "timeout_s": 30}
    for nodes, phase in ((2, "save"), (3, "resume")):
        spec = {**base, "phase": phase, **({"save_at": 4} if phase == "save" else {})}
        script = tmp_path / f"{phase}.py"
        script.write_text(ELASTIC_JOB.format(tests=str(Path(__file__).parent), spec=json.dumps(spec),
                                             out=str(tmp_path)))
        _torchrun_nodes(str(script), nodes)
    steps = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("steps_*.json"))]
    assert len(steps) == 5  # 2 ranks, then 3
    assert sorted(i for rank_steps in steps for s in rank_steps for i in s["ids"]) == EXPECTED
