"""Real data pipelines for the reproduction harness (no download, deterministic per seed).

Pipeline, in order (each stage a function or class of this package):

1. source text (`corpus.load_corpus`): docstrings of the Python standard library
   sources installed with the interpreter (read with `ast`, never imported) and
   the license texts in /usr/share/common-licenses when present;
2. tokenizer (`tokenizer.get_tokenizer`): a byte-level BPE trained here on that
   text with the `tokenizers` package, cached under paper_repro/results/_scratch/;
3. chat template + tokenization + truncation at a cutoff (`text.ChatDataset`);
4. multimodal (`mm.ImageChatDataset`): real images shipped by matplotlib, a
   random resize per (seed, epoch, index), and visual-token expansion, so a
   sample's cost is known only after preprocessing;
5. synthetic lengths (`text.LengthDataset`): real corpus tokens cut to lengths
   drawn from `paper_repro.distributions` (matched to the paper's CVs);
6. collate (`collate.collate_pad`): right-padded batch for `paper_repro.nets`.

Every dataset item is a dict with ``input_ids`` (list[int]), ``labels``
(list[int], -100 = no loss), and optionally ``pixel_values`` (3, H, W) and
``num_visual``; ``sample_len(item)`` is its post-pipeline length.
"""

from .collate import collate_pad, sample_len
from .corpus import load_corpus
from .mm import ImageChatDataset, load_images
from .text import ChatDataset, LengthDataset, chat_pairs
from .tokenizer import get_tokenizer

__all__ = ["collate_pad", "sample_len", "load_corpus", "ImageChatDataset", "load_images",
           "ChatDataset", "LengthDataset", "chat_pairs", "get_tokenizer"]
