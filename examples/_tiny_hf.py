"""A tiny word-level tokenizer and Hugging Face ``datasets`` built from `_tiny.TinyDataset` (no download).

Shared by the TRL and datasets examples and by tests/test_integrations_{trl,datasets}.py.  Token ids
are the ones of `_tiny` (vocabulary `_tiny.VOCAB`; 0 is the pad token, 1 the eos token).
"""

from __future__ import annotations

from _tiny import VOCAB, TinyDataset


def tiny_tokenizer():
    """A `transformers.PreTrainedTokenizerFast` over the words ``t2 .. t63`` (id = the number), with
    ``<pad>`` = 0 and ``</s>`` = 1 (what SFTTrainer needs as a ``processing_class``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>")


def tiny_hf_dataset(n: int = 48, *, labels: bool = False, ids: bool = False):
    """`TinyDataset(n)` as a ``datasets.Dataset`` of lists: ``input_ids``, with ``labels`` (position 0
    masked, as in `TinyDataset`) if `labels`, and the sample's index as ``id`` if `ids`."""
    import datasets

    src = TinyDataset(n)
    cols = {"input_ids": [src[i]["input_ids"].tolist() for i in range(n)]}
    if labels:
        cols["labels"] = [src[i]["labels"].tolist() for i in range(n)]
    if ids:
        cols["id"] = list(range(n))
    return datasets.Dataset.from_dict(cols)
