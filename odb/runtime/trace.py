"""JSONL traces of the engine's steps, for `proofs.conformance`.

One file per (loader, iteration, rank): ``L<loader>_it<iteration>_rank<rank>.jsonl``.
The first line is ``{"meta": {...}}`` (table hash, cfg, rank, world size,
epoch); then one line per fired row, written after the row's effect completed
(for ``post`` rows: after the header was handed to the collective; for
``collect`` rows: after the collective returned), flushed per line so a rank
that dies leaves every step it completed.  Aborts are ordinary rows
(``post_header`` with ``st > 0``, ``return_abort``).  A ``local_error`` line
records a rank-local error (the rank goes on to the abort round); a
``failure`` line the error that ended the rank's thread (nothing follows it).
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["TraceWriter", "trace_path"]


def trace_path(trace_dir: str, loader_id: int, iteration: int, rank: int) -> str:
    return os.path.join(trace_dir, f"L{loader_id}_it{iteration}_rank{rank}.jsonl")


class TraceWriter:
    """Append-only JSONL writer, one JSON object per line, flushed per line."""

    def __init__(self, path: str, meta: dict):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path
        self._f = open(path, "w", encoding="ascii")
        self.write({"meta": meta})

    def write(self, obj: dict[str, Any]) -> None:
        if self._f is None:
            return
        self._f.write(json.dumps(obj, separators=(",", ":"), default=_plain) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _plain(x):
    if isinstance(x, bool):
        return x
    try:
        return int(x)
    except (TypeError, ValueError):
        return repr(x)
