"""A small pure-torch LoRA: y = W x + (alpha / r) * B A x, with W frozen.

`apply_lora(net, r)` freezes every parameter of `net` and replaces each
`nn.Linear` whose qualified name matches `targets` by a `LoRALinear` (B starts
at zero, so the wrapped net computes the same function at step 0).  peft is an
alternative on the same nets; this one keeps the harness dependency-free.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["LoRALinear", "apply_lora", "num_trainable"]


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, r: int = 8, alpha: float = 16.0):
        super().__init__()
        self.base = base
        self.scale = alpha / r
        self.a = nn.Parameter(torch.empty(r, base.in_features))
        self.b = nn.Parameter(torch.zeros(base.out_features, r))
        nn.init.kaiming_uniform_(self.a, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.t() @ self.b.t()) * self.scale


def apply_lora(net: nn.Module, r: int = 8, alpha: float = 16.0,
               targets: tuple[str, ...] = ("qkv", "proj", "up", "down")) -> nn.Module:
    """Freeze `net` and wrap the matching Linear layers in place; returns `net`.

    Raises ValueError when no layer matches (a silent no-op LoRA would train nothing).
    """
    for p in net.parameters():
        p.requires_grad_(False)
    hits = []
    for name, mod in list(net.named_modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, nn.Linear) and child_name in targets:
                setattr(mod, child_name, LoRALinear(child, r, alpha))
                hits.append(f"{name}.{child_name}")
    if not hits:
        raise ValueError(f"apply_lora matched no nn.Linear named one of {targets}; nothing would train")
    return net


def num_trainable(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters() if p.requires_grad)
