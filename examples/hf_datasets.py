"""Hugging Face ``datasets`` with ODB: a shuffled IterableDataset split by node, trained by ODBTrainer
without max_steps (CPU, gloo; tiny random Llama, no download).

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/hf_datasets.py [--max-samples 100]
    python examples/hf_datasets.py   # one process

Without ``--max-samples`` the run is ``num_train_epochs`` whole passes over the stream, with a schedule
that needs no horizon ("constant"); with it, the run stops there and any schedule runs on samples.  The
loader forwards ``set_epoch`` to the dataset, so every epoch has its own shuffled order.  A map-style
``datasets.Dataset`` (``map``, ``set_transform``, ``with_format("torch")``) is passed as it is.
"""

import argparse
import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

from _tiny import tiny_llama  # noqa: E402
from _tiny_hf import tiny_hf_dataset  # noqa: E402
from datasets.distributed import split_dataset_by_node  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

from odb.batching import pad_collate  # noqa: E402
from odb.integrations.hf import ODBTrainer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-samples", type=int, default=None)
    a = ap.parse_args()
    args = TrainingArguments(output_dir=os.path.join(tempfile.gettempdir(), "odb_datasets_example"),
                             num_train_epochs=2, learning_rate=3e-3, gradient_accumulation_steps=2,
                             lr_scheduler_type="linear" if a.max_samples else "constant", use_cpu=True,
                             report_to=[], save_strategy="no", logging_steps=5, disable_tqdm=True,
                             ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None)  # torchrun, or one process
    stream = tiny_hf_dataset(64, labels=True).to_iterable_dataset(num_shards=4).shuffle(seed=0, buffer_size=16)
    stream = split_dataset_by_node(stream, rank=args.process_index, world_size=args.world_size)  # this rank's shards
    trainer = ODBTrainer(model=tiny_llama(0), args=args, train_dataset=stream, data_collator=pad_collate,
                         max_samples=a.max_samples,
                         odb_loader_kwargs={"token_budget": 64, "buffer_size": 8, "timeout_s": 60})
    trainer.train()
    p = trainer.odb_progress
    print(f"rank {trainer.odb_loader.rank}: {p.samples} samples, {p.optimizer_steps} optimizer steps, "
          f"{p.epoch} passes, epoch field {trainer.state.epoch:.3f}, fillers {trainer.odb_loader.stats.fillers}")


if __name__ == "__main__":
    main()
