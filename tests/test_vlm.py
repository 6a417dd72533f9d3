"""Vision-language batches: a tiny random Qwen2-VL (no download), a two-resource budget, and mRoPE packing.

`pad_collate` joins per-image patches and grids as the vision tower reads them, and `mrope_collate` packs
samples with images into one padding-free row whose mRoPE position ids restart at every sample; both
give the loss of the samples computed apart.  The loader budgets text tokens and image patches apart
(``cost={"tokens": ..., "image_patches": ...}``, ``token_budget=None``).
"""

import pytest
import torch

import odb
from odb.batching import mrope_collate, pad_collate

pytestmark = pytest.mark.adapters

IMAGE, START, END = 70, 72, 73
GRIDS = [(1, 2, 2), None, (1, 4, 2), (1, 2, 4)]  # per sample: its image's (t, h, w) patch grid, or no image
TEXT = [5, 9, 3, 6]


def _model():
    import warnings

    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = Qwen2VLConfig(
            text_config=dict(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                             rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}, bos_token_id=1,
                             eos_token_id=2),
            vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=2,
                               temporal_patch_size=1, spatial_merge_size=2, in_channels=3),
            image_token_id=IMAGE, video_token_id=71, vision_start_token_id=START, vision_end_token_id=END,
            attn_implementation="sdpa")
    return Qwen2VLForConditionalGeneration(cfg).eval()


def _samples():
    """Chat-like samples: an image block (start, merged image tokens, end) then text; labels on the text."""
    g = torch.Generator().manual_seed(2)
    out = []
    for grid, n in zip(GRIDS, TEXT):
        text = torch.randint(3, 60, (n,), generator=g).tolist()
        s = {"input_ids": text, "labels": text}
        if grid is not None:
            t, h, w = grid
            merged = t * h * w // 4  # spatial_merge_size 2: 2 x 2 patches per image token
            ids = [START] + [IMAGE] * merged + [END] + text
            s = {"input_ids": ids, "labels": [-100] * (merged + 2) + text,
                 "mm_token_type_ids": [0] + [1] * merged + [0] * (n + 1),
                 "pixel_values": torch.randn(t * h * w, 3 * 2 * 2, generator=g), "image_grid_thw": [[t, h, w]]}
        out.append(s)
    return out


def _alone(model, s) -> tuple[float, int]:
    kw = {"input_ids": torch.tensor([s["input_ids"]]), "labels": torch.tensor([s["labels"]])}
    if "pixel_values" in s:
        kw.update(pixel_values=s["pixel_values"], image_grid_thw=torch.tensor(s["image_grid_thw"]),
                  mm_token_type_ids=torch.tensor([s["mm_token_type_ids"]]))
    n = int((kw["labels"][:, 1:] != -100).sum())
    return model(**kw).loss.item() * n, n


def test_an_mrope_packed_row_has_the_loss_of_its_samples_computed_apart():
    model, samples = _model(), _samples()
    with torch.no_grad():
        alone = [_alone(model, s) for s in samples]
        total, targets = sum(a for a, _ in alone), sum(n for _, n in alone)
        batch = mrope_collate(model.model.get_rope_index)(samples)
        assert batch["position_ids"].shape == (4, 1, batch["input_ids"].shape[1])
        packed = model(**batch).loss.item()
    assert packed * targets == pytest.approx(total, rel=1e-5, abs=1e-5)


def test_the_default_collate_batches_images_for_the_vision_tower_and_matches_the_samples_apart():
    model, samples = _model(), _samples()  # text-only and image samples in one batch
    with torch.no_grad():
        alone = [_alone(model, s) for s in samples]
        batch = pad_collate(samples)
        assert isinstance(batch["pixel_values"], torch.Tensor) and batch["image_grid_thw"].shape == (3, 3)
        out = model(**batch)  # it used to fail: pixel_values came as a list
    targets = sum(n for _, n in alone)
    assert out.loss.item() * targets == pytest.approx(sum(a for a, _ in alone), rel=1e-5, abs=1e-5)


def test_a_two_resource_budget_is_passed_as_documented_and_bounds_both():
    samples = _samples()

    class Ds(torch.utils.data.Dataset):
        def __len__(self):
            return len(samples)

        def __getitem__(self, i):
            return samples[i]

    def sizes(s):  # tokens, image patches
        return len(s["input_ids"]), (0 if "pixel_values" not in s else int(s["pixel_values"].shape[0]))
    cost = {"tokens": 40, "image_patches": ("packed", 10)}
    with odb.ODBDataLoader(Ds(), None, pad_collate, cost=cost, length_fn=sizes, buffer_size=4) as loader:
        seen = []
        for b in loader:
            info = odb.pop_step_info(b)
            patches = sum(sizes(samples[i])[1] for i in info.indices)
            assert patches <= 10 or len(info.indices) == 1
            seen += info.indices
    assert sorted(seen) == list(range(len(samples)))


# -- visual_stub: the vision tower runs on every rank at every step ------------------------------------------------
STUB = {"input_ids": [START, IMAGE, END], "labels": [-100] * 3, "mm_token_type_ids": [0, 1, 0],
        "pixel_values": torch.zeros(4, 3 * 2 * 2), "image_grid_thw": [[1, 2, 2]]}


def _grads(model, batch) -> tuple[float, dict, int]:
    """Loss, every parameter's gradient (None where none reached it), and the vision tower's calls."""
    calls = []
    hook = model.model.visual.register_forward_hook(lambda *a: calls.append(1))
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    hook.remove()
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    return out.loss.item(), grads, len(calls)


@pytest.mark.parametrize("packed", [False, True])
def test_a_stub_runs_the_vision_tower_on_a_text_only_batch_and_changes_no_loss_or_gradient(packed):
    from odb.batching import visual_stub

    model = _model()
    text = [s for s in _samples() if "pixel_values" not in s]
    text.append({"input_ids": [4, 8, 15, 16], "labels": [4, 8, 15, 16]})
    base = mrope_collate(model.model.get_rope_index) if packed else pad_collate
    loss, grads, calls = _grads(model, base(text))
    stubbed = visual_stub(base, STUB)(text)
    assert stubbed["pixel_values"].shape == (4, 12) and stubbed["input_ids"].shape[0] == (1 if packed else 3)
    loss2, grads2, calls2 = _grads(model, stubbed)
    assert (calls, calls2) == (0, 1)
    assert loss2 == pytest.approx(loss, rel=1e-6, abs=1e-7)
    vision = [n for n in grads2 if ".visual." in n or n.startswith("visual.")]
    assert vision and all(grads[n] is None for n in vision)  # without the stub the tower gets no gradient at all
    assert all(bool((grads2[n] == 0).all()) for n in vision)  # with it: exactly zero, from the stub alone
    for n, g in grads.items():
        if g is not None:
            assert torch.allclose(grads2[n], g, rtol=1e-5, atol=1e-7), n


def test_a_stub_is_added_only_where_the_batch_lacks_its_kind_and_keeps_the_collates_label_rule():
    from odb.batching import packed_collate, visual_stub
    from odb.batching.collate import counts_shifted

    samples = _samples()  # with images: the stub stays out
    with_images = visual_stub(pad_collate, STUB)(samples)
    plain = pad_collate(samples)
    assert with_images.keys() == plain.keys() and all(torch.equal(with_images[k], plain[k]) for k in plain)
    video = {**STUB, "pixel_values_videos": STUB["pixel_values"], "video_grid_thw": [[1, 2, 2]]}
    del video["pixel_values"], video["image_grid_thw"]
    both = visual_stub(pad_collate, STUB, video)
    assert both(samples)["input_ids"].shape[0] == len(samples) + 1  # images present, no video: the video stub
    assert both(samples[1:2])["input_ids"].shape[0] == 3  # text only: both stubs
    assert not counts_shifted(visual_stub(pad_collate, STUB))
    assert counts_shifted(visual_stub(packed_collate, STUB))
    assert counts_shifted(visual_stub(mrope_collate(_model().model.get_rope_index), STUB))


@pytest.mark.parametrize("stub, msg", [
    (None, "at least one stub"),
    ([1, 2], "not a processed sample"),
    ({"input_ids": [1], "labels": [-100]}, "none of"),
    ({**STUB, "labels": None}, "integer sequences"),
    ({k: v for k, v in STUB.items() if k != "labels"}, "needs 'input_ids' and 'labels'"),
    ({**STUB, "labels": [-100, 5, -100]}, "1 label tokens"),
    ({**STUB, "labels": [-100, -100]}, "3 input_ids and 2 labels"),
])
def test_a_stub_that_would_train_or_would_not_run_the_tower_is_refused(stub, msg):
    from odb.batching import visual_stub

    with pytest.raises(odb.ConfigError, match=msg):
        visual_stub(pad_collate) if stub is None else visual_stub(pad_collate, stub)
