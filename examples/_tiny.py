"""A tiny randomly initialised causal LM and a tiny variable-length dataset (no download).

Shared by the examples and by tests/test_integrations_*.py.  Every sample has
``labels[0] = -100`` (a causal LM never predicts position 0; the loader counts
``labels[1:]`` anyway, so this changes no count).
"""

from __future__ import annotations

import torch

VOCAB = 64


class TinyDataset(torch.utils.data.Dataset):
    """``n`` samples; sample i has length 3 + (i * 7) % max_extra and its index as token 1."""

    def __init__(self, n: int = 48, max_extra: int = 29, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.samples = []
        for i in range(n):
            length = 3 + (i * 7) % max_extra
            ids = torch.randint(2, VOCAB, (length,), generator=g)
            labels = ids.clone()
            labels[0] = -100
            self.samples.append({"input_ids": ids, "labels": labels})

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        s = self.samples[i]
        return {"input_ids": s["input_ids"].clone(), "labels": s["labels"].clone()}


def tiny_llama(seed: int = 0):
    """A 2-layer, 32-wide LlamaForCausalLM with random weights (about 40k parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, bos_token_id=1, eos_token_id=1, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def init_gloo() -> None:
    """The process group under torchrun, or a group of one process when run with ``python`` (FSDP2 needs one)."""
    import os
    import socket

    import torch.distributed as dist

    if "WORLD_SIZE" not in os.environ:  # one process: a free port on this host
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
