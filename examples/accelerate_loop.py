"""Accelerate loop with ODB: the loader is not prepared (it shards itself) (CPU, gloo).

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/accelerate_loop.py
    python examples/accelerate_loop.py   # one process
"""

import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from _tiny import TinyDataset, tiny_llama  # noqa: E402
from accelerate import Accelerator  # noqa: E402

from odb import ODBDataLoader  # noqa: E402
from odb.integrations.accelerate import ODBAccelerate  # noqa: E402


def main() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    net = tiny_llama(0)
    model, opt = accelerator.prepare(net, torch.optim.AdamW(net.parameters(), lr=3e-3))
    ds = TinyDataset(64)
    budget = 2 * len(ds)
    odb_acc = ODBAccelerate(accelerator, ODBDataLoader(ds, token_budget=64, buffer_size=8, timeout_s=60),
                            max_samples=budget)  # also registers itself for save_state/load_state
    sched = accelerator.prepare(odb_acc.scheduler(opt, lambda s: max(0.0, 1 - s / budget)))
    ckpt = os.path.join(tempfile.gettempdir(), "odb_accelerate_example")
    while not odb_acc.done:
        with odb_acc.join(model):
            for ms in odb_acc.micro_steps():
                with odb_acc.sync(model, ms):
                    out = model(**ms.batch)
                    odb_acc.backward(out, ms)  # the output, not out.loss: finite when a batch has no label
                if ms.sync:
                    opt.step()
                    sched.step()
                    opt.zero_grad()
                    if odb_acc.progress.optimizer_steps == 5:
                        accelerator.save_state(ckpt)  # loader position of every rank + progress
                    if odb_acc.done:
                        break
    p = odb_acc.progress
    accelerator.print(f"{p.samples} samples, {p.optimizer_steps} optimizer steps, last loss {out.loss.item():.3f}")
    odb_acc.loader.close()


if __name__ == "__main__":
    main()
