"""The README's quickstart (a test keeps the two identical): a plain DDP loop with ODB.

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/quickstart.py
    python examples/quickstart.py   # one process
"""
import os

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import odb
from odb.integrations import weighted_loss


class Tokens(torch.utils.data.Dataset):  # your data: templating and tokenizing happen in __getitem__
    def __len__(self):
        return 400

    def __getitem__(self, i):
        ids = torch.randint(3, 1000, (16 + i * 37 % 300,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


if "WORLD_SIZE" in os.environ:  # under torchrun: the process group first, then the loader
    dist.init_process_group("gloo")  # "nccl" on GPUs
model = LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=4))
ddp = torch.nn.parallel.DistributedDataParallel(model) if dist.is_initialized() else model
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = odb.ODBDataLoader(Tokens(), token_budget=2048)  # each batch: rows x longest sample <= 2048
for epoch in range(2):  # each pass over the loader is the next epoch, in a new order
    for batch in loader:
        info = odb.pop_step_info(batch)  # the batch's weight, its dataset indices, filler or not
        loss = weighted_loss(ddp(**batch), info.loss_scale)  # after DDP: the global per-token mean
        loss.backward()
        opt.step()
        opt.zero_grad()
print(f"rank {loader.rank}: {loader.stats.samples} samples, {loader.stats.fillers} fillers, {loader.epoch + 1} epochs")
loader.close()
if dist.is_initialized():
    dist.destroy_process_group()
