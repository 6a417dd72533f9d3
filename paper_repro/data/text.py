"""Chat samples: template, tokenize, truncate; and real tokens at synthetic lengths.

Chat template (one turn)::

    <|user|>\n{question}\n<|assistant|>\n{answer}<|end|>

Labels are -100 on the prompt (user turn and the assistant header) and the
token ids on the answer, so the loss is on answer tokens only ("label tokens").
Truncation keeps the first ``cutoff`` tokens; a sample whose answer is cut
away entirely keeps at least one label token (the last position), so no
sample has zero loss weight by accident.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .corpus import load_corpus

__all__ = ["chat_pairs", "ChatDataset", "LengthDataset", "encode_chat"]

_QUESTIONS = ("What does {t} do?", "Explain {t}.", "Summarise the documentation of {t}.",
              "How is {t} used?", "Describe {t} in detail.")


def chat_pairs(seed: int = 0) -> list[tuple[str, str]]:
    """(question, answer) for every corpus document; the question wording is seeded."""
    rng = np.random.default_rng(seed)
    return [(_QUESTIONS[int(rng.integers(len(_QUESTIONS)))].format(t=t), d) for t, d in load_corpus()]


def encode_chat(tok, question: str, answer: str, cutoff: int) -> dict:
    """Template + tokenize + truncate one turn; returns input_ids and labels (lists)."""
    sp = {s: tok.token_to_id(s) for s in ("<|user|>", "<|assistant|>", "<|end|>")}
    q = tok.encode("\n" + question + "\n", add_special_tokens=False).ids
    a = tok.encode("\n" + answer, add_special_tokens=False).ids
    prompt = [sp["<|user|>"], *q, sp["<|assistant|>"]]
    ids = prompt + a + [sp["<|end|>"]]
    labels = [-100] * len(prompt) + a + [sp["<|end|>"]]
    ids, labels = ids[:cutoff], labels[:cutoff]
    if all(x == -100 for x in labels):
        labels[-1] = ids[-1]
    return {"input_ids": ids, "labels": labels}


class ChatDataset:
    """Map-style dataset of templated, tokenized, truncated chat turns.

    :param tok: a `tokenizers.Tokenizer` from `get_tokenizer`.
    :param pairs: (question, answer) pairs; `indices` selects which, in order.
    :param cutoff: truncation length in tokens (the paper's recipes use 16384;
        the CPU harness uses a few hundred).
    The pipeline runs in `__getitem__` (lengths are not known beforehand).
    """

    def __init__(self, tok, pairs: Sequence[tuple[str, str]], indices: Sequence[int], cutoff: int = 512):
        self.tok, self.pairs, self.indices, self.cutoff = tok, pairs, list(indices), cutoff

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        q, a = self.pairs[self.indices[i]]
        return encode_chat(self.tok, q, a, self.cutoff)


class LengthDataset:
    """Real corpus tokens cut to prescribed post-pipeline lengths.

    Sample i is a chat turn whose total length is exactly ``lengths[i]`` (>= 4):
    a prompt of ``max(2, lengths[i] // 8)`` tokens and an answer for the rest,
    both read from the tokenized corpus stream at a seeded offset.  This is how
    the paper's length distributions (matched by CV, from
    `paper_repro.distributions`) are fed through real text and a real loss.
    """

    def __init__(self, tok, lengths: Sequence[int], seed: int = 0):
        self.lengths = [max(4, int(x)) for x in lengths]
        stream: list[int] = []
        for _, d in load_corpus()[:800]:
            stream += tok.encode(d, add_special_tokens=False).ids
        self.stream = np.asarray(stream, dtype=np.int64)
        rng = np.random.default_rng(seed)
        span = max(1, len(self.stream) - max(self.lengths))
        self.offsets = rng.integers(0, span, size=len(self.lengths))
        self.user, self.asst, self.end = (tok.token_to_id(s) for s in ("<|user|>", "<|assistant|>", "<|end|>"))
        if max(self.lengths) > len(self.stream):
            raise ValueError(f"longest requested sample ({max(self.lengths)} tokens) exceeds the corpus "
                             f"stream ({len(self.stream)} tokens); lower the cutoff")

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict:
        n, o = self.lengths[i], int(self.offsets[i])
        p = max(2, n // 8)
        body = self.stream[o:o + n - 3].tolist()
        ids = [self.user, *body[:p - 1], self.asst, *body[p - 1:], self.end]
        labels = [-100] * p + ids[p:]
        return {"input_ids": ids, "labels": labels}
