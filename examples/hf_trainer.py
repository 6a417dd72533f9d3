"""HF Trainer with ODB: ODBTrainer replaces the train loader (CPU, gloo).

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/hf_trainer.py
    python examples/hf_trainer.py   # one process
"""

import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

from _tiny import TinyDataset, tiny_llama  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

from odb.integrations.hf import ODBTrainer  # noqa: E402


def main() -> None:
    out = os.path.join(tempfile.gettempdir(), "odb_hf_example")
    args = TrainingArguments(output_dir=out, num_train_epochs=2, learning_rate=3e-3, warmup_steps=0.1,
                             gradient_accumulation_steps=2, use_cpu=True, report_to=[], save_strategy="no",
                             ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,  # torchrun, or one process
                             logging_steps=5, disable_tqdm=True)
    trainer = ODBTrainer(model=tiny_llama(0), args=args, train_dataset=TinyDataset(64),
                         odb_loader_kwargs={"token_budget": 64, "buffer_size": 8, "timeout_s": 60})
    trainer.train()
    p = trainer.odb_progress
    print(f"rank {trainer.odb_loader.rank}: {p.samples} samples, {p.optimizer_steps} optimizer steps, "
          f"fillers {trainer.odb_loader.stats.fillers}")


if __name__ == "__main__":
    main()
