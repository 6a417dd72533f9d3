"""Padding-free batches cannot cross-contaminate: a packed batch's loss equals the per-sample losses.

A tiny random ``LlamaForCausalLM`` (no download): the loss of one `packed_collate` row of several
samples, times its target count, equals the sum of the samples' own summed losses, for the sdpa and the
eager attention, with the loader's label count equal to the targets the model averaged over.  The trap
it guards: with a KV cache (``use_cache=True``, the model's default) the packed samples attend to each
other; `packed_collate` turns it off in the batch itself.
"""

import pytest
import torch

import odb
from odb.batching import packed_collate

pytestmark = pytest.mark.adapters

LENGTHS = [7, 3, 12, 5]


def _model(attn: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation=attn)
    return LlamaForCausalLM(cfg).eval()


def _samples():
    g = torch.Generator().manual_seed(1)
    out = []
    for n in LENGTHS:
        ids = torch.randint(1, 50, (n,), generator=g)
        labels = ids.clone()
        labels[: n // 3] = -100  # a prompt part without targets
        out.append({"input_ids": ids.tolist(), "labels": labels.tolist()})
    return out


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_packed_row_has_the_loss_of_its_samples_computed_apart(attn):
    model, samples = _model(attn), _samples()
    with torch.no_grad():
        total, targets = 0.0, 0
        for s in samples:  # each sample alone
            ids, lab = torch.tensor([s["input_ids"]]), torch.tensor([s["labels"]])
            n = int((lab[:, 1:] != -100).sum())
            total += model(input_ids=ids, labels=lab).loss.item() * n
            targets += n
        batch = packed_collate(samples)
        packed = model(**batch).loss.item()
        mixed = model(**{**batch, "use_cache": True}).loss.item()  # what the cache does to packed samples
    assert packed * targets == pytest.approx(total, rel=1e-5, abs=1e-5)
    assert abs(mixed * targets - total) > 1e-3  # the trap is real: without use_cache=False the samples mix


def test_the_loader_counts_the_targets_the_packed_loss_averages_over():
    samples = _samples()

    class Ds(torch.utils.data.Dataset):
        def __len__(self):
            return len(samples)

        def __getitem__(self, i):
            return samples[i]
    with odb.ODBDataLoader(Ds(), 64, packed_collate, buffer_size=4, cost="packed") as loader:
        for batch in loader:
            info = odb.pop_step_info(batch)
            # the model shifts labels: the targets are every non-masked label but the row's first position
            assert info.local_label_tokens == int((batch["labels"][:, 1:] != -100).sum())
