"""Elastic resume of a plain `TrainStream` loop under torch's own elastic agent (issue 61).

Two ``torch.distributed.run`` agents (``--nnodes 1:2``, c10d rendezvous, one worker each) run
``tests/_elastic_worker.py``, which writes every rank's ``stream.state_dict()`` after each optimizer step and
resumes from the newest step that every rank of one run wrote, merged with `odb.merge_states`.  A node is
lost (its agent and its worker killed with SIGKILL mid-epoch: the agent starts its workers in their own
session, so killing the agent's process group alone leaves the worker training) and the survivor's agent
restarts its worker at world size 1; or a second node joins mid-epoch and the first agent restarts its
worker at world size 2.  The audit: the samples each run trained up to the checkpoint the next run resumed
from, plus everything the last run trained, are every sample of the epoch exactly once (what a killed run
trained after its last complete checkpoint counts as not trained).

The agents run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with torch 2.13's shared TCP store a
scale-up deadlocks in the rendezvous, and a restart at 2+ ranks after losing the node of rank 0 reads its
stale address (docs/guide/checkpoints.md).  Slow tier: each case starts 3 or 4 workers, about 20 s.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _elastic_worker import EXPECTED

WORKER = str(Path(__file__).parent / "_elastic_worker.py")
# a slow consumer, seconds per optimizer step: the kill, or the join of a second agent (a few seconds to start),
# lands mid-epoch (an epoch is about 36 steps on one rank, 18 on two)
PAUSE_LOSS_S, PAUSE_JOIN_S = 0.3, 0.4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Agents:
    """The agents this test starts, each in a session of its own, and their workers; `close` kills what is
    left of them (found by this test's own folder in their command lines), never anything else."""

    def __init__(self, folder: Path, pause_s: float):
        self.folder, self.pause_s, self.port, self.procs = folder, pause_s, _free_port(), {}
        self.env = dict(os.environ, OMP_NUM_THREADS="1", LOGLEVEL="INFO", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")

    def start(self, name: str, *, host: bool) -> None:
        conf = f"is_host={int(host)},last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc_per_node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", "odb-elastic",
               "--rdzv-conf", conf, "--max-restarts", "3", "--monitor-interval", "1",
               WORKER, str(self.folder), str(self.pause_s)]
        log = open(self.folder / f"agent_{name}.log", "w")
        self.procs[name] = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()

    def logs(self) -> str:
        return "\n".join(f"--- agent {n}:\n" + (self.folder / f"agent_{n}.log").read_text()[-3000:]
                         for n in self.procs)

    def wait_for(self, what: str, found, timeout_s: float = 60.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = found()
            if got is not None:
                return got
            time.sleep(0.1)
        raise AssertionError(f"no {what} within {timeout_s} s\n{self.logs()}")

    def kill_node(self, name: str, run: int) -> None:
        """Node loss: SIGKILL to the agent's process group and to its worker's (a session of its own)."""
        agent = self.procs[name]
        workers = [json.loads(p.read_text()) for p in self.folder.glob(f"pid_{run}_*.json")]
        mine = [w["pid"] for w in workers if w["agent"] == agent.pid]
        assert len(mine) == 1, (workers, agent.pid)
        os.killpg(agent.pid, signal.SIGKILL)
        os.killpg(mine[0], signal.SIGKILL)
        agent.wait(timeout=30)

    def join(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        out = {}
        for name, proc in self.procs.items():
            try:
                out[name] = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                out[name] = None
        return out

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        for pid in _processes_naming(str(self.folder)):  # workers orphaned by a killed agent
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _processes_naming(folder: str) -> list[int]:
    """Worker processes whose command line names `folder` (only this test's)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if WORKER.encode() in args and folder.encode() in args:
                out.append(int(entry.name))
    return out


def _runs(folder: Path) -> dict:
    return {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in folder.glob("run_*.json")}


def _checkpoint_of(folder: Path, world: int, min_step: int):
    """The first ``(run, step)`` of a run of `world` ranks with every rank's checkpoint at a step >= `min_step`."""
    for run, info in sorted(_runs(folder).items()):
        if info["world"] == world:
            for step in range(min_step, 10_000):
                if not (folder / f"ckpt_{run}_{step}_0of{world}.json").exists():
                    break
                if all((folder / f"ckpt_{run}_{step}_{r}of{world}.json").exists() for r in range(world)):
                    return run, step
    return None


def _steps(folder: Path, run: int, lo: int, hi: float) -> dict:
    """Dataset indices trained by `run` in its optimizer steps ``lo < step <= hi``, per step."""
    out: dict = {}
    for p in folder.glob(f"ckpt_{run}_*.json"):
        _, _, step, _ = p.stem.split("_")
        if lo < int(step) <= hi:
            out.setdefault(int(step), []).extend(json.loads(p.read_text())["ids"])
    return out


def _audit(folder: Path) -> list:
    """The runs from the first to the one that ended the epoch, each with the steps that count, and the
    indices trained in them: each run's steps up to the checkpoint the next run resumed from, the last
    run's steps all."""
    runs = _runs(folder)
    last = [run for run in runs if list(folder.glob(f"done_{run}_*.json"))]
    assert len(last) == 1, (runs, last)
    chain, run, upto = [], last[0], float("inf")
    while run is not None:
        start = runs[run]["resumed_from"]  # (step, run, world) of the merged checkpoint, or None
        lo = start[0] if start else 0
        chain.append({"run": run, "world": runs[run]["world"], "from": lo, "steps": _steps(folder, run, lo, upto)})
        run, upto = (start[1], start[0]) if start else (None, None)
    return chain[::-1]


def _trained(chain) -> list:
    return sorted(i for link in chain for ids in link["steps"].values() for i in ids)


@pytest.mark.slow
def test_a_node_lost_mid_epoch_the_survivor_restarts_alone_and_every_sample_is_trained_once(tmp_path):
    agents = _Agents(tmp_path, PAUSE_LOSS_S)
    try:
        agents.start("A", host=True)  # hosts the rendezvous store: the node that survives
        agents.start("B", host=False)
        run, step = agents.wait_for("checkpoint of 2 ranks at step 3", lambda: _checkpoint_of(tmp_path, 2, 3))
        agents.kill_node("B", run)
        codes = agents.join(timeout_s=60)
        assert codes == {"A": 0, "B": -signal.SIGKILL}, (codes, agents.logs())
    finally:
        agents.close()
    chain = _audit(tmp_path)
    assert [link["world"] for link in chain][-2:] == [2, 1], chain
    assert chain[-1]["from"] >= step and chain[-1]["steps"], chain  # resumed mid-epoch, after the kill's checkpoint
    assert _trained(chain) == EXPECTED


@pytest.mark.slow
def test_a_node_that_joins_mid_epoch_restarts_the_first_and_both_resume_from_the_merged_checkpoint(tmp_path):
    agents = _Agents(tmp_path, PAUSE_JOIN_S)
    try:
        agents.start("A", host=True)
        agents.wait_for("checkpoint of 1 rank at step 2", lambda: _checkpoint_of(tmp_path, 1, 2))
        agents.start("B", host=False)
        codes = agents.join(timeout_s=60)
        assert codes == {"A": 0, "B": 0}, (codes, agents.logs())
    finally:
        agents.close()
    chain = _audit(tmp_path)
    assert [link["world"] for link in chain] == [1, 2], chain
    assert chain[-1]["from"] >= 2 and chain[-1]["steps"], chain  # resumed mid-epoch from the world-1 checkpoint
    assert _trained(chain) == EXPECTED
