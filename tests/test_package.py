"""The installed package: its names, and the import-name collision with the paper's package.

The paper's ``online-dynamic-batching`` also installs as ``odb``; installed over ours, its ``__init__``
replaces ours while our subpackages stay.  That must fail at import with a message that says so.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import odb

ROOT = Path(__file__).resolve().parents[1]


def test_public_names_are_listed_and_resolve():
    assert {"ODBDataLoader", "LoaderSettings", "merge_states", "StepInfo", "ConfigError"} <= set(dir(odb))
    for name in odb.__all__:
        assert getattr(odb, name) is not None, name
    assert odb.DISTRIBUTION == "odb-verified"


def _foreign_odb(tmp_path):
    """A folder holding an ``odb`` whose ``__init__`` is another package's and whose subpackages are ours."""
    fake = tmp_path / "odb"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "0.1.2"  # the paper\'s __init__: no DISTRIBUTION marker\n')
    for sub in ("batching", "core", "runtime", "protocol"):
        os.symlink(ROOT / "odb" / sub, fake / sub)
    for mod in ("_identity.py", "errors.py"):
        os.symlink(ROOT / "odb" / mod, fake / mod)
    return tmp_path


def test_a_foreign_odb_init_is_named_at_import(tmp_path):
    where = _foreign_odb(tmp_path)
    for sub in ("odb.batching", "odb.core", "odb.runtime"):
        code = (f"import sys; sys.path.insert(0, {str(where)!r}); import odb; "
                f"assert odb.__file__.startswith({str(where)!r}); import {sub}")
        out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60, cwd=where)
        assert out.returncode != 0 and "AssertionError" not in out.stderr, (sub, out.stderr)
        assert "is not ODB (odb-verified)" in out.stderr and "online-dynamic-batching" in out.stderr, out.stderr


def test_our_own_init_passes_the_identity_check(tmp_path):
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(ROOT)!r})
        import odb, odb.batching, odb.core
        assert odb.__file__.startswith({str(ROOT)!r}), odb.__file__
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
