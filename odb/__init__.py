"""ODB: online dynamic batching with a verified cross-rank alignment protocol.

``import odb`` is cheap: the runtime (which imports torch) loads on first use
of one of its names.
"""

from __future__ import annotations

from .errors import ConfigError, ODBError, ProtocolError, RankFailure, SampleError

__version__ = "0.1.0"

_RUNTIME = {"ODBDataLoader", "StepInfo", "pop_step_info"}

__all__ = ["ODBError", "ConfigError", "ProtocolError", "RankFailure", "SampleError", *sorted(_RUNTIME)]


def __getattr__(name: str):
    if name in _RUNTIME:
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'odb' has no attribute {name!r}")
