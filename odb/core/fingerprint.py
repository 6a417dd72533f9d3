"""Content digests of samples, for the checks that ranks read different data (`odb.runtime.group`'s probe of
a map-style dataset at construction, `odb.core.rank`'s first samples of a stream or a sampler's order).

A digest covers every value of a sample (keys sorted): arrays and tensors by their bytes, dtype and shape,
anything else by its ``repr``.  0 means "nothing to compare" and is never a digest.  Pure: no torch (a CPU
tensor is read through ``numpy``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = ["content_digest", "equal_groups"]


def _update(h, v: Any) -> None:
    if hasattr(v, "shape") and hasattr(v, "dtype"):  # a numpy array or a tensor
        try:
            a = np.ascontiguousarray(np.asarray(v.detach().cpu() if hasattr(v, "detach") else v))
            h.update(f"{a.dtype}{a.shape}".encode())
            h.update(a.tobytes())
            return
        except Exception:  # noqa: BLE001 - an exotic tensor: its repr still tells samples apart
            pass
    h.update(repr(v).encode())


def content_digest(samples: Iterable[Any]) -> int:
    """One non-zero 62-bit digest of `samples` (in order)."""
    h = hashlib.blake2b(digest_size=8)
    for s in samples:
        h.update(b"\x00sample")
        if isinstance(s, Mapping):
            for k in sorted(s, key=str):
                h.update(str(k).encode())
                _update(h, s[k])
        else:
            _update(h, s)
    return (int.from_bytes(h.digest(), "little") >> 2) | 1


def equal_groups(values: Sequence[int]) -> list[list[int]]:
    """The groups (rank lists, two or more) of non-zero `values` that are equal."""
    by: dict[int, list[int]] = {}
    for r, v in enumerate(values):
        if v:
            by.setdefault(int(v), []).append(r)
    return [rs for rs in by.values() if len(rs) > 1]
