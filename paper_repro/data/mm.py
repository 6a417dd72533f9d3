"""Image + text samples: real images, random-resize augmentation, visual-token expansion.

Images, stated: the raster files matplotlib ships in ``mpl-data/sample_data``
(grace_hopper.jpg, Minduka_Present_Blue_Pack.png, logo2.png) and two of its
elevation grids (jacksboro_fault_dem.npz, topobathy.npz) rendered as
grey-scale images.  They are held encoded (the files' bytes) and every sample
decodes its image, as a dataset of image files does (0.1-1.3 ms per image
here), so a pass over the split pays decode, resize and visual-token expansion.
Augmentation: sample i of epoch e is resized so that its
long side is uniform in [min_side, max_side] pixels (aspect kept), seeded by
(seed, epoch, i); its visual-token count is then
`paper_repro.nets.num_visual_tokens(H, W)`.  So the cost of a sample is known
only after `__getitem__` ran: an offline length cache built at one epoch is
wrong at the next.
"""

from __future__ import annotations

import functools
import io
import os
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..nets.vlm import num_visual_tokens
from .text import encode_chat

__all__ = ["load_images", "load_image_files", "decode_image", "ImageChatDataset"]


_FILES = (("grace_hopper.jpg", None), ("Minduka_Present_Blue_Pack.png", None), ("logo2.png", None),
          ("jacksboro_fault_dem.npz", "elevation"), ("topobathy.npz", "topo"))


@functools.lru_cache(maxsize=1)
def load_image_files() -> tuple[tuple[str, str | None, bytes], ...]:
    """The sample images as (file name, npz key or None, encoded bytes)."""
    import matplotlib

    root = os.path.join(matplotlib.get_data_path(), "sample_data")
    out = []
    for name, key in _FILES:
        with open(os.path.join(root, name), "rb") as f:
            out.append((name, key, f.read()))
    return tuple(out)


def decode_image(name: str, key: str | None, raw: bytes) -> torch.Tensor:
    """Decode one file's bytes to a (3, H, W) float tensor in [0, 1] (grids: min-max, grey-scale)."""
    if key is not None:
        with np.load(io.BytesIO(raw)) as z:
            g = np.asarray(z[key], dtype=np.float32)
        g = (g - g.min()) / max(1e-6, float(g.max() - g.min()))
        return torch.from_numpy(g)[None].repeat(3, 1, 1).contiguous()
    from matplotlib import image as mpimg

    a = np.asarray(mpimg.imread(io.BytesIO(raw), format=name.rsplit(".", 1)[-1]), dtype=np.float32)
    if a.max() > 1.0:
        a = a / 255.0
    if a.ndim == 2:
        a = np.stack([a] * 3, -1)
    return torch.from_numpy(np.ascontiguousarray(a[..., :3])).permute(2, 0, 1).contiguous()


def load_images() -> tuple[torch.Tensor, ...]:
    """The sample images, decoded, as (3, H, W) float tensors in [0, 1]."""
    return tuple(decode_image(*f) for f in load_image_files())


class ImageChatDataset:
    """One image + one chat turn per sample; the image's visual tokens come first.

    :param tok: tokenizer; :param pairs: (question, answer) pairs; :param indices: which pairs.
    :param min_side, max_side: range of the augmented long side in pixels.
    :param cutoff: text truncation in tokens (visual tokens are not truncated).
    Call `set_epoch(e)` to change the augmentation draw (as a DataLoader sampler would).
    """

    def __init__(self, tok, pairs: Sequence[tuple[str, str]], indices: Sequence[int], *, seed: int = 0,
                 min_side: int = 56, max_side: int = 448, cutoff: int = 256, patch: int = 14, merge: int = 2):
        self.tok, self.pairs, self.indices = tok, pairs, list(indices)
        self.seed, self.epoch = seed, 0
        self.min_side, self.max_side, self.cutoff = min_side, max_side, cutoff
        self.patch, self.merge = patch, merge
        self.files = load_image_files()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        rng = np.random.default_rng([self.seed, self.epoch, i])
        img = decode_image(*self.files[int(rng.integers(len(self.files)))])
        side = int(rng.integers(self.min_side, self.max_side + 1))
        h, w = img.shape[-2:]
        s = side / max(h, w)
        nh, nw = max(self.patch, round(h * s)), max(self.patch, round(w * s))
        px = F.interpolate(img[None], size=(nh, nw), mode="bilinear", align_corners=False)[0]
        q, a = self.pairs[self.indices[i]]
        item = encode_chat(self.tok, "<image> " + q, a, self.cutoff)
        item["pixel_values"] = px
        item["num_visual"] = num_visual_tokens(nh, nw, self.patch, self.merge)
        return item
