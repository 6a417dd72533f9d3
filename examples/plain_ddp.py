"""Plain PyTorch DDP loop with ODB (CPU, gloo).

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/plain_ddp.py [--mode join] [--accum 2]
        [--pool-size 2] [--exchange]
    python examples/plain_ddp.py   # one process

Gradient accumulation needs mode "pad" (the default); mode "join" wraps the loop in DDP Join.
``--pool-size G`` pools the windows of G consecutive ranks (a host's, under torchrun: its
``--nproc_per_node``): each of them preprocesses the pool's samples and trains on its share of the pool's
batches (``placement=odb.Pooled(G)``; mode "pad").  ``--exchange`` turns on the round exchange: each round's batches
are re-dealt across the ranks by fill and moved between them (``placement=odb.Exchanged(pool=G)``; mode "pad" or
"quota").
"""

import argparse
import contextlib
import gc
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _tiny import TinyDataset, tiny_llama  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from odb import Exchanged, ODBDataLoader, Pooled  # noqa: E402
from odb.integrations import TrainStream, join_context, sample_scheduler, weighted_loss  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="pad", choices=["pad", "join", "quota"])
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--pool-size", type=int, default=1, help="ranks sharing one window (e.g. a host's)")
    ap.add_argument("--exchange", action="store_true", help="re-deal each round's batches across the ranks by fill")
    a = ap.parse_args()
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")  # the entry point reads the launcher's env; ODB takes the group
    world = dist.get_world_size() if dist.is_initialized() else 1
    net = tiny_llama(0)
    model = DDP(net) if world > 1 else net
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    ds = TinyDataset(64)
    placement = Exchanged(pool=a.pool_size) if a.exchange else Pooled(a.pool_size) if a.pool_size > 1 else None
    loader = ODBDataLoader(ds, token_budget=64, buffer_size=8, mode=a.mode, placement=placement, timeout_s=60)
    budget = a.epochs * len(ds)
    # mode "join": whole epochs, no accumulation and no sample budget (ranks end epochs at different steps)
    join = a.mode == "join"
    stream = TrainStream(loader, 1 if join else a.accum, max_samples=None if join else budget)
    sched = sample_scheduler(opt, stream.progress, lambda s: min(1.0, (s + 1) / 16) * max(0.0, 1 - s / budget))
    while not stream.done and stream.progress.epoch < a.epochs:
        with join_context(model, loader):  # DDP Join in mode "join"; nothing otherwise
            for ms in stream.epoch():
                no_sync = model.no_sync() if (world > 1 and not ms.sync) else contextlib.nullcontext()
                with no_sync:
                    out = model(**ms.batch)  # out.loss: the mean over this rank's label tokens
                    loss = weighted_loss(out, ms.loss_weight)  # finite also with no label token (weight 0)
                    loss.backward()
                if ms.sync:
                    opt.step()
                    sched.step()
                    opt.zero_grad()
                    if stream.done:
                        break
    p = stream.progress
    print(f"rank {loader.rank}: {p.samples} samples, {p.optimizer_steps} optimizer steps, {p.epoch} epochs, "
          f"fillers {loader.stats.fillers}, last loss {out.loss.item():.3f}"
          + (f", batches moved out/in {loader.stats.exchange_sent}/{loader.stats.exchange_received}"
             if a.exchange else ""))
    loader.close()
    if dist.is_initialized():
        del model  # DDP holds the group; free it before the group goes (a gloo work freed at exit aborts)
        gc.collect()
        dist.barrier()  # tear down together: a peer that exits mid-teardown can abort gloo
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
