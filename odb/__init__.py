"""ODB: online dynamic batching with a verified cross-rank alignment protocol.

``import odb`` is cheap: the runtime (which imports torch) loads on first use of one of its names.
The distribution is ``odb-verified``; the paper's own package, ``online-dynamic-batching``, uses the same
import name ``odb``, and installing both in one environment mixes their files (`_identity` says so).
"""

from __future__ import annotations

from .errors import ConfigError, ODBError, ProtocolError, RankFailure, SampleError

__version__ = "0.1.0"
DISTRIBUTION = "odb-verified"  # `odb._identity.check` looks for it: a package of another origin lacks it

_LAZY = {"ODBDataLoader": "runtime", "LoaderSettings": "settings", "merge_states": "runtime",
         "StepInfo": "core.info", "pop_step_info": "core.info", "LoaderStats": "core.info",
         "Pooled": "core.placement", "Exchanged": "core.placement"}

__all__ = ["ODBError", "ConfigError", "ProtocolError", "RankFailure", "SampleError", *sorted(_LAZY)]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'odb' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


from . import _identity  # noqa: E402 - after the names it checks

_identity.warn_if_shadowed()
