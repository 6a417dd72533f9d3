"""TRL's SFTTrainer with ODB: ODBSFTTrainer replaces the train loader (CPU, gloo; tiny random Llama, no download).

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/trl_sft.py [--lora] [--padding-free]
    python examples/trl_sft.py   # one process

The dataset is text; SFTTrainer tokenizes it (with a tiny word-level tokenizer) as usual.  ``--padding-free``
flattens each batch into one row, and the loader's budget then counts tokens (cost "packed", the default here).
"""

import argparse
import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

import datasets  # noqa: E402
from _tiny import TinyDataset, tiny_llama  # noqa: E402
from _tiny_hf import tiny_tokenizer  # noqa: E402
from trl import SFTConfig  # noqa: E402

from odb.integrations.trl import ODBSFTTrainer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lora", action="store_true", help="train a LoRA adapter (peft_config) instead of every weight")
    ap.add_argument("--padding-free", action="store_true")
    a = ap.parse_args()
    src = TinyDataset(64)
    text = datasets.Dataset.from_dict({"text": [" ".join(f"t{int(t)}" for t in src[i]["input_ids"])
                                                for i in range(len(src))]})
    peft_config = None
    if a.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = SFTConfig(output_dir=os.path.join(tempfile.gettempdir(), "odb_trl_example"), num_train_epochs=2,
                     learning_rate=3e-3, warmup_steps=0.1, gradient_accumulation_steps=2, use_cpu=True, bf16=False,
                     activation_checkpointing=False, max_length=None, padding_free=a.padding_free,
                     report_to=[], save_strategy="no", logging_steps=5, disable_tqdm=True,
                     ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None)  # torchrun, or one process
    trainer = ODBSFTTrainer(model=tiny_llama(0), args=args, train_dataset=text, processing_class=tiny_tokenizer(),
                            peft_config=peft_config,
                            odb_loader_kwargs={"token_budget": 64, "buffer_size": 8, "timeout_s": 60})
    trainer.train()
    p, s = trainer.odb_progress, trainer.odb_loader.stats
    print(f"rank {trainer.odb_loader.rank}: {p.samples} samples, {p.optimizer_steps} optimizer steps, "
          f"cost {trainer.odb_loader.settings.cost}, fillers {s.fillers}")


if __name__ == "__main__":
    main()
