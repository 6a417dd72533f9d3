"""paper_repro.nets: forward/backward, dynamic-resolution visual tokens, LoRA."""

import pytest
import torch

from paper_repro.data.collate import collate_pad
from paper_repro.nets import LMConfig, TinyLM, TinyVLM, VLMConfig, apply_lora, num_trainable, num_visual_tokens

CFG = LMConfig(vocab_size=64, dim=16, num_layers=1, num_heads=2, max_len=256)


def _text(n, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 64, (n,), generator=g).tolist()
    return {"input_ids": ids, "labels": [-100] * 2 + ids[2:]}


def test_lm_forward_backward_gives_finite_loss_and_grads_on_every_parameter():
    net = TinyLM(CFG)
    batch = collate_pad([_text(7, 0), _text(12, 1)])
    loss, n = net(batch)
    assert n == (7 - 2) + (12 - 2)  # label positions (each predicted from the one before)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


def test_padding_does_not_change_a_samples_loss():
    # Invariant: a right-padded row gives the same loss as the row alone (mask is right).
    torch.manual_seed(0)
    net = TinyLM(CFG).eval()
    a, b = _text(5, 2), _text(20, 3)
    alone, _ = net(collate_pad([a]))
    together = net(collate_pad([a, b]))[0] - net(collate_pad([b]))[0]
    assert torch.allclose(alone, together, atol=1e-4)


def test_visual_token_count_depends_on_the_augmented_resolution():
    assert num_visual_tokens(28, 28) == 1
    assert num_visual_tokens(448, 448) == 256
    assert num_visual_tokens(448, 224) == 128
    assert num_visual_tokens(29, 28) == 2  # rounded up: padded to whole 28-pixel cells
    net = TinyVLM(VLMConfig(lm=CFG))
    for h, w in ((56, 84), (100, 30), (448, 448)):
        assert net.encode_image(torch.rand(3, h, w)).shape[0] == num_visual_tokens(h, w)


def test_vlm_forward_backward_with_images_of_different_sizes():
    net = TinyVLM(VLMConfig(lm=CFG))
    items = []
    for i, (h, w) in enumerate(((56, 56), (84, 140))):
        x = _text(6 + i, i)
        x["pixel_values"] = torch.rand(3, h, w)
        x["num_visual"] = num_visual_tokens(h, w)
        items.append(x)
    loss, n = net(collate_pad(items))
    loss.backward()
    assert n > 0 and net.patch_embed.weight.grad is not None


def test_vlm_rejects_a_collate_that_reserved_the_wrong_number_of_visual_positions():
    net = TinyVLM(VLMConfig(lm=CFG))
    x = _text(6, 0)
    x["pixel_values"] = torch.rand(3, 56, 56)
    x["num_visual"] = 3  # the image gives 4
    with pytest.raises(ValueError, match="reserved 3 visual positions"):
        net(collate_pad([x]))


def test_lora_starts_as_the_same_function_and_trains_only_adapters():
    torch.manual_seed(0)
    net = TinyLM(CFG).eval()
    batch = collate_pad([_text(9, 4)])
    before = net(batch)[0].detach()
    full = num_trainable(net)
    apply_lora(net, r=2)
    assert torch.allclose(net(batch)[0], before, atol=1e-5)
    assert 0 < num_trainable(net) < full
    net(batch)[0].backward()
    assert all((p.grad is None) != p.requires_grad for p in net.parameters())


def test_lora_refuses_to_match_nothing():
    with pytest.raises(ValueError, match="matched no nn.Linear"):
        apply_lora(TinyLM(CFG), targets=("nope",))
