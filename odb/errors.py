"""Every exception ODB raises.

``ODBError`` is the base.  User mistakes are ``ConfigError`` (also a
``ValueError``); a broken protocol invariant or a collective mismatch is
``ProtocolError``; a peer rank that died or stalled past ``timeout_s`` is
``RankFailure``; a sample or batch the pipeline cannot use is ``SampleError``.
"""

from __future__ import annotations

__all__ = ["ODBError", "ConfigError", "ProtocolError", "RankFailure", "SampleError"]


class ODBError(Exception):
    """Base class of every ODB error."""


class ConfigError(ODBError, ValueError):
    """A setting or argument is invalid; the message names it, the observed value and the fix."""


class ProtocolError(ODBError, RuntimeError):
    """The protocol table was violated (no or several rows enabled, a choice out of
    bounds, a collective mismatch).  Always a bug in ODB or in a custom policy."""


class RankFailure(ODBError, RuntimeError):
    """Another rank failed, died or did not reach a collective within ``timeout_s``.

    The message names the round and, where known, the failing rank and its error.
    """


class SampleError(ODBError, ValueError):
    """A sample or a batch cannot be used (no length, empty, over budget with
    ``oversize="error"``, an exception in ``__getitem__`` or ``collate_fn``).
    The message names the dataset index."""
