"""A plain FSDP2 (``fully_shard``) loop with ODB (CPU, gloo).

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/fsdp2_loop.py [--accum 3] [--uneven]
    python examples/fsdp2_loop.py   # one process

PAD mode (the default) gives every rank the same number of micro-steps, so the accumulation windows and
FSDP2's reduce-scatters line up with no Join; ``odb.integrations.grad_sync`` defers the gradient sync to
the window's last micro-step (``set_requires_gradient_sync``).  ``--uneven`` gives rank 0 three times the
samples of the others, so they train on zero-weight fillers.  FSDP1 on CPU: wrap with
``FullyShardedDataParallel(model, device_id=torch.device("cpu"))``; ``grad_sync`` then uses its ``no_sync``.
"""

import argparse
import gc
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _tiny import TinyDataset, init_gloo, tiny_llama  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from odb import ODBDataLoader  # noqa: E402
from odb.integrations import TrainStream, grad_sync, sample_scheduler, weighted_loss  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--uneven", action="store_true")
    a = ap.parse_args()
    init_gloo()  # under torchrun, or one process; ODB takes the default group
    rank, world = dist.get_rank(), dist.get_world_size()
    net = tiny_llama(0)
    mesh = init_device_mesh("cpu", (world,))
    for layer in net.model.layers:  # shard each block, then the root (embeddings, norm, head)
        fully_shard(layer, mesh=mesh)
    model = fully_shard(net, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ds = TinyDataset(64)
    shard = None
    if a.uneven:  # rank 0: 3 shares, every other rank: 1 share (a sampler yields this rank's own indices)
        cut = [0] + [len(ds) * (3 + r) // (world + 2) for r in range(world)]
        shard = list(range(cut[rank], cut[rank + 1]))
    loader = ODBDataLoader(ds, token_budget=64, buffer_size=8, timeout_s=60, sampler=shard)
    budget = a.epochs * len(ds)
    stream = TrainStream(loader, a.accum, max_samples=budget)
    sched = sample_scheduler(opt, stream.progress, lambda s: max(0.0, 1 - s / budget))
    while not stream.done and stream.progress.epoch < a.epochs:
        for ms in stream.epoch():
            with grad_sync(model, ms.sync):  # reduce-scatter only on the window's last micro-step
                out = model(**ms.batch)
                weighted_loss(out, ms.loss_weight).backward()  # a filler: a zero through every parameter
            if ms.sync:
                opt.step()
                sched.step()
                opt.zero_grad()
                if stream.done:
                    break
    p = stream.progress
    print(f"rank {rank}: {p.samples} samples, {p.optimizer_steps} optimizer steps, "
          f"{p.samples / len(ds):.2f} epochs, "
          f"fillers {loader.stats.fillers}, last loss {out.loss.item():.3f}")
    loader.close()
    del model, net, opt
    gc.collect()  # free what holds the group before it goes (a gloo work freed at exit aborts)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
