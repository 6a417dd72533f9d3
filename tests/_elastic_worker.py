"""A plain training loop under torch's elastic agent, for tests/test_elastic_agent.py.

``python -m torch.distributed.run ... tests/_elastic_worker.py <folder> <seconds per step>``: the loop
trains a `TrainStream` (accumulation 2) over one epoch and, after every optimizer step, writes this rank's
``stream.state_dict()`` and the dataset indices it trained in that step to
``<folder>/ckpt_<run>_<step>_<rank>of<world>.json`` (atomically).  At start it resumes from the newest
step that every rank of one run wrote, merged with `odb.merge_states` (the checkpoints guide's recipe),
so a restart on another number of ranks continues the epoch.  ``run_<run>.json`` (rank 0) records the
world size and the checkpoint the run resumed from; ``pid_<run>_<rank>.json`` this worker's and its
agent's process ids (the test kills a node's agent and its worker: the agent starts workers in their own
session); ``done_<run>_<rank>.json`` marks the epoch's end.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import odb  # noqa: E402
from mp_harness import Samples, id_collate  # noqa: E402
from odb.integrations import TrainStream, grad_sync  # noqa: E402

NUM_SAMPLES, DROPS = 240, (5, 90, 201)
LENGTHS = [2 + (i * 37) % 60 for i in range(NUM_SAMPLES)]
EXPECTED = sorted(set(range(NUM_SAMPLES)) - set(DROPS))


def write_json(path: str, obj) -> None:
    """Write `obj` to `path` atomically: a reader sees the whole file or none."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def checkpoints(folder: str) -> dict:
    """``(step, run, world) -> {rank: path}`` of every checkpoint file in `folder`."""
    out: dict = {}
    for name in os.listdir(folder):
        if name.startswith("ckpt_") and name.endswith(".json"):
            run, step, where = name[len("ckpt_"):-len(".json")].split("_")
            rank, world = (int(v) for v in where.split("of"))
            out.setdefault((int(step), int(run), world), {})[rank] = os.path.join(folder, name)
    return out


def newest_complete(folder: str):
    """The newest ``(step, run, world)`` that every rank of its run wrote, with the files in rank order."""
    done = {key: files for key, files in checkpoints(folder).items() if set(files) == set(range(key[2]))}
    if not done:
        return None, []
    key = max(done)
    return key, [done[key][r] for r in range(key[2])]


def main(folder: str, pause_s: float) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    key, files = newest_complete(folder)  # every old worker is gone: every rank sees the same files
    run = [len([n for n in os.listdir(folder) if n.startswith("run_")])]
    dist.broadcast_object_list(run, src=0)  # rank 0's count names the run on every rank
    run = run[0]
    write_json(os.path.join(folder, f"pid_{run}_{rank}.json"), {"pid": os.getpid(), "agent": os.getppid()})
    if rank == 0:
        write_json(os.path.join(folder, f"run_{run}.json"), {"world": world, "resumed_from": key})
    loader = odb.ODBDataLoader(Samples(LENGTHS, drop=DROPS), 160, id_collate, buffer_size=8, timeout_s=30,
                               sharding="fixed")
    stream = TrainStream(loader, 2)
    if files:
        stream.load_state_dict(odb.merge_states([json.load(open(p))["state"] for p in files]))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids: list = []
    if stream.progress.epoch == 0:  # a checkpoint at the epoch's last step has nothing left to train
        for ms in stream.epoch():
            x = torch.tensor([[float(len(ms.info.indices))]])
            with grad_sync(model, ms.sync):
                (model(x).sum() * ms.loss_weight).backward()
            ids += ms.info.indices
            if ms.sync:
                opt.step()
                opt.zero_grad()
                step = stream.progress.optimizer_steps
                write_json(os.path.join(folder, f"ckpt_{run}_{step}_{rank}of{world}.json"),
                           {"state": stream.state_dict(), "ids": ids})
                ids = []
                time.sleep(pause_s)  # a slow consumer: the test's kill or join lands mid-epoch
    loader.close()
    write_json(os.path.join(folder, f"done_{run}_{rank}.json"), {"progress": stream.progress.state_dict()})
    dist.barrier()  # tear down together: a peer gone mid-teardown can abort gloo
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
