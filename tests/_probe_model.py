"""A tiny causal LM for `odb plan --probe` tests (module:callable, built locally: nothing is downloaded)."""

import torch


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 16):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(vocab, dim), torch.nn.Linear(dim, vocab)
        self.config = type("Config", (), {"vocab_size": vocab})()

    def forward(self, input_ids):
        return self.head(self.emb(input_ids))


def tiny_lm() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM()
