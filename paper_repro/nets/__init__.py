"""Small trainable networks for the reproduction harness (pure torch).

| name | what |
|---|---|
| `TinyLM` | decoder-only LM (pre-norm, causal SDPA, tied embeddings) |
| `TinyVLM` | `TinyLM` plus a dynamic-resolution image encoder (below) |
| `apply_lora` | freeze a net and add rank-r adapters to its Linear layers (pure torch) |
| `hf_tiny_lm` | the same runs on a randomly initialized tiny `transformers` Llama (no download) |

`TinyVLM`'s image encoder: patches of the (augmented) image, merged 2x2, projected into the LM,
prepended to the text.

Every net takes the batch produced by `paper_repro.data.collate_pad` and returns
the *sum* of token losses over label tokens and the number of label tokens, so
the trainer decides how to normalise (per-rank mean times ODB's loss scale).
"""

from .lm import LMConfig, TinyLM, hf_tiny_lm
from .lora import LoRALinear, apply_lora, num_trainable
from .vlm import TinyVLM, VLMConfig, num_visual_tokens

__all__ = ["LMConfig", "TinyLM", "hf_tiny_lm", "VLMConfig", "TinyVLM", "num_visual_tokens",
           "LoRALinear", "apply_lora", "num_trainable"]
