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
    assert out["cu_seqlens"].tolist() == [0, 3, 5] and out["cu_seqlens"].dtype == torch.int32
    assert out["max_seqlen"] == 3


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
