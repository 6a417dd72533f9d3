"""Which package answers to ``import odb``: ours (``odb-verified``) or the paper's (``online-dynamic-batching``).

Both use the import name ``odb``.  Installed into one environment, the second install overwrites the
first one's files (``odb/__init__.py`` among them), and uninstalling either removes files the other
still needs, while ``pip list`` shows both.  `check` runs when a subpackage of ours is imported: if
``odb`` is not ours (the paper's ``__init__`` replaced ours) it raises ImportError saying what happened
and how to repair it, instead of failing later in a confusing way.  `warn_if_shadowed` warns when our
``odb`` loads while the paper's distribution is also installed.
"""

from __future__ import annotations

import sys
import warnings

__all__ = ["check", "warn_if_shadowed", "OTHER"]

OTHER = "online-dynamic-batching"
_FIX = (f"uninstall both (`pip uninstall -y {OTHER} odb-verified`), then reinstall odb-verified; the paper's "
        "package needs an environment of its own (it shares the import name odb)")


def check() -> None:
    """Raise ImportError unless the ``odb`` package in `sys.modules` is ours."""
    mod = sys.modules.get("odb")
    if mod is not None and getattr(mod, "DISTRIBUTION", None) != "odb-verified":
        where = getattr(mod, "__file__", "?")
        raise ImportError(f"the package 'odb' loaded from {where} is not ODB (odb-verified): its __init__ is another "
                          f"package's, most likely the paper's {OTHER}, installed into the same environment over "
                          f"ours (both use the import name odb); {_FIX}")


def warn_if_shadowed() -> None:
    """Warn if the paper's distribution is installed beside ours (its files and ours share ``odb/``)."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        distribution(OTHER)
    except PackageNotFoundError:
        return
    except Exception:  # noqa: BLE001 - metadata trouble is no reason to fail an import
        return
    warnings.warn(f"{OTHER} (the paper's package) is installed in this environment beside ODB; both use the import "
                  f"name odb, so whichever was installed last owns odb/__init__.py; {_FIX}", stacklevel=3)
