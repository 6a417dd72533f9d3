"""Collate helpers: padding with -100 labels, and the flattened varlen layout."""

import subprocess
import sys

import pytest
import torch

from odb.batching import packed_collate, pad_collate
from odb.errors import SampleError


def test_pad_collate_pads_ids_masks_and_ignores_padded_labels():
    out = pad_collate([{"input_ids": [5, 6, 7]}, {"input_ids": [8], "labels": [-100]}], pad_id=1)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 1, 1]]
    assert out["labels"].tolist() == [[5, 6, 7], [-100, -100, -100]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_pad_collate_keeps_other_keys_and_a_given_attention_mask():
    out = pad_collate([{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 0], "id": [3], "w": 0.5, "txt": "a"},
                       {"input_ids": [8], "attention_mask": [1], "id": [4], "w": 1.0, "txt": "b"}])
    assert out["attention_mask"].tolist() == [[1, 1, 0], [1, 0, 0]]
    assert out["id"].tolist() == [[3], [4]] and out["w"].tolist() == [0.5, 1.0] and out["txt"] == ["a", "b"]
    with pytest.raises(SampleError, match="same keys"):
        pad_collate([{"input_ids": [1], "id": [3]}, {"input_ids": [2]}])


def test_packed_collate_matches_the_flattening_layout():
    out = packed_collate([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert out["labels"].tolist() == [[-100, 6, 7, -100, 9]]
    assert out["cu_seq_lens_q"].tolist() == [0, 3, 5] and out["cu_seq_lens_q"].dtype == torch.int32
    assert out["max_length_q"] == out["max_length_k"] == 3 and out["use_cache"] is False
    assert "attention_mask" not in out  # an all-ones mask would turn SDPA's packed-sequence detection off


@pytest.mark.adapters
def test_packed_collate_gives_the_keys_and_values_transformers_flattening_collator_gives():
    from transformers import DataCollatorWithFlattening

    samples = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8, 9, 4, 4], "labels": [8, 9, 4, -100]}]
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(samples)
    ours = packed_collate(samples)
    for key, v in theirs.items():
        assert key in ours, key
        got = ours[key]
        assert (got.tolist() if isinstance(got, torch.Tensor) else got) == \
            (v.tolist() if isinstance(v, torch.Tensor) else v), key


def test_visual_inputs_are_joined_as_vision_towers_read_them():
    patches = [{"input_ids": [1, 2], "pixel_values": torch.ones(4, 6), "image_grid_thw": torch.tensor([[1, 2, 2]])},
               {"input_ids": [3], "pixel_values": torch.ones(16, 6), "image_grid_thw": torch.tensor([[1, 4, 4]])}]
    for fn in (pad_collate, packed_collate):
        out = fn(patches)
        assert out["pixel_values"].shape == (20, 6) and out["image_grid_thw"].tolist() == [[1, 2, 2], [1, 4, 4]]
    images = [{"input_ids": [1], "pixel_values": torch.zeros(3, 8, 8)},
              {"input_ids": [2, 3], "pixel_values": torch.zeros(3, 8, 8)}]
    assert pad_collate(images)["pixel_values"].shape == (2, 3, 8, 8)
    with pytest.raises(SampleError, match="share a shape"):
        pad_collate([images[0], {"input_ids": [2], "pixel_values": torch.zeros(3, 4, 4)}])


@pytest.mark.parametrize("bad,match", [([], "empty batch"), ([{"labels": [1]}], "no 'input_ids'"),
                                       ([{"input_ids": []}], "zero tokens"),
                                       ([{"input_ids": [1, 2], "labels": [1]}], "labels have 1")])
def test_bad_batches_raise_sample_errors(bad, match):
    with pytest.raises(SampleError, match=match):
        pad_collate(bad)


def test_odb_batching_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import odb.batching, odb.baselines\n"
            "c = odb.batching.make_cost_model('packed', 10); p = odb.batching.default_policy()\n"
            "print(p.propose([p.summarize([(3,), (4,)], c, True)], 4))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"
