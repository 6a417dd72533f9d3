"""A byte-level BPE trained locally on `load_corpus()` text (the `tokenizers` package).

Cached as JSON under paper_repro/results/_scratch/ (gitignored), keyed by the
vocabulary size and a hash of the corpus, so a rerun skips training.  Training
is deterministic for one corpus.  Special tokens: ``<pad>`` (id 0), ``<|user|>``,
``<|assistant|>``, ``<|end|>``, ``<image>``.
"""

from __future__ import annotations

import hashlib
import os

from .corpus import load_corpus

__all__ = ["get_tokenizer", "SPECIALS", "SCRATCH"]

SPECIALS = ["<pad>", "<|user|>", "<|assistant|>", "<|end|>", "<image>"]
SCRATCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "_scratch")
_CACHE: dict = {}


def get_tokenizer(vocab_size: int = 2048, cache_dir: str | None = SCRATCH):
    """Return a trained `tokenizers.Tokenizer` (train once, then load from cache).

    A concurrent writer is harmless: the file is written to a temporary name
    and renamed atomically.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    docs = load_corpus()
    h = hashlib.sha256()
    for t, d in docs:
        h.update(t.encode())
        h.update(d.encode())
    key = f"bpe{vocab_size}_{h.hexdigest()[:12]}"
    if key in _CACHE:
        return _CACHE[key]
    path = os.path.join(cache_dir, key + ".json") if cache_dir else None
    if path and os.path.exists(path):
        tok = Tokenizer.from_file(path)
    else:
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator((d for _, d in docs), trainer=trainer)
        if path:
            os.makedirs(cache_dir, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            tok.save(tmp)
            os.replace(tmp, path)
    _CACHE[key] = tok
    return tok
