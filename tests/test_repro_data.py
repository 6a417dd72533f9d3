"""paper_repro.data: deterministic, offline pipelines whose cost is known after preprocessing."""

import socket

import numpy as np
import pytest

from paper_repro.data import ChatDataset, ImageChatDataset, LengthDataset, chat_pairs, get_tokenizer, sample_len


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return get_tokenizer(vocab_size=512, cache_dir=str(tmp_path_factory.mktemp("tok")))


@pytest.fixture()
def no_network(monkeypatch):
    # Invariant: the pipeline never opens a socket (no hub, no download).
    def refuse(*a, **k):
        raise AssertionError("the pipeline tried to open a network connection")
    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_tokenizer_training_is_deterministic_and_offline(tmp_path, no_network):
    from paper_repro.data import tokenizer as tk
    tk._CACHE.clear()
    a = get_tokenizer(vocab_size=512, cache_dir=str(tmp_path / "a"))
    tk._CACHE.clear()
    b = get_tokenizer(vocab_size=512, cache_dir=str(tmp_path / "b"))
    text = "Return the number of items in a container."
    assert a.encode(text).ids == b.encode(text).ids
    assert a.get_vocab_size() == 512 and a.token_to_id("<pad>") == 0


def test_chat_pipeline_is_deterministic_for_a_seed_and_truncates(tok, no_network):
    p1, p2 = chat_pairs(3), chat_pairs(3)
    assert p1 == p2 and chat_pairs(4) != p1
    ds = ChatDataset(tok, p1, range(200), cutoff=64)
    items = [ds[i] for i in range(200)]
    assert items == [ChatDataset(tok, p2, range(200), cutoff=64)[i] for i in range(200)]
    assert max(len(x["input_ids"]) for x in items) == 64
    assert all(any(lab != -100 for lab in x["labels"]) for x in items)
    assert all(len(x["input_ids"]) == len(x["labels"]) for x in items)


def test_image_sample_cost_depends_on_the_augmentation_epoch(tok, no_network):
    ds = ImageChatDataset(tok, chat_pairs(0), range(30), seed=1)
    e0 = [sample_len(ds[i]) for i in range(30)]
    assert e0 == [sample_len(ds[i]) for i in range(30)]  # same epoch: same draw
    ds.set_epoch(1)
    e1 = [sample_len(ds[i]) for i in range(30)]
    assert e0 != e1  # a length cache from epoch 0 is stale at epoch 1
    x = ds[0]
    assert x["pixel_values"].shape[0] == 3 and max(x["pixel_values"].shape[1:]) <= 448


def test_length_dataset_gives_exactly_the_requested_lengths(tok):
    lengths = np.array([4, 10, 77, 300])
    ds = LengthDataset(tok, lengths, seed=0)
    assert [len(ds[i]["input_ids"]) for i in range(4)] == lengths.tolist()
    assert all(sum(v != -100 for v in ds[i]["labels"]) > 0 for i in range(4))
