"""Lightning with ODB: ODBDataModule + pop_loss_weight (CPU, DDP over gloo).

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/lightning_fit.py
    python examples/lightning_fit.py   # one process
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from _tiny import TinyDataset, tiny_llama  # noqa: E402

from odb.integrations.lightning import ODBDataModule, pop_loss_weight  # noqa: E402


class TinyLM(pl.LightningModule):
    def __init__(self, dm: ODBDataModule):
        super().__init__()
        self.net, self.dm = tiny_llama(0), dm

    def training_step(self, batch, batch_idx):
        weight, info = pop_loss_weight(batch)  # once per batch: loss weight and odb.StepInfo
        loss = self.net(**batch).loss
        self.log("loss", loss, prog_bar=False)
        return loss * weight

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.net.parameters(), lr=3e-3)
        sched = self.dm.scheduler(opt, lambda s: max(0.0, 1 - s / self.dm.max_samples))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    ds = TinyDataset(64)
    dm = ODBDataModule(ds, odb_loader_kwargs={"token_budget": 64, "buffer_size": 8, "timeout_s": 60},
                       max_samples=2 * len(ds))
    world = int(os.environ.get("WORLD_SIZE", 1))
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto",
                         accumulate_grad_batches=2, max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(TinyLM(dm), datamodule=dm)
    p = dm.progress
    print(f"rank {trainer.global_rank}: {p.samples} samples, {p.optimizer_steps} optimizer steps, {p.epoch} epochs")


if __name__ == "__main__":
    main()
