"""The mechanical mutation tool's own parts (tests/quality/mutation.py): what it applies is what it reports."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "quality"))
import mutation  # noqa: E402


def test_node_ids_are_read_from_pytests_failure_lines():
    got = mutation._node_ids("FAILED tests/a.py::test_x[1-True] - AssertionError: no; ERROR tests/b.py::test_y")
    assert got == ["tests/a.py::test_x[1-True]", "tests/b.py::test_y"]
    assert mutation._node_ids("timeout after 300 s") == []


DIFF = """--- mutation diff ---
--- a/pkg/m.py
+++ b/pkg/m.py
@@ -1,3 +1,3 @@
 def f(x):
-    return x + 1
+    return x - 1
 """


def test_a_stored_diff_is_applied_for_the_block_then_reverted_and_a_stale_one_is_refused(tmp_path):
    (tmp_path / "pkg").mkdir()
    src = tmp_path / "pkg" / "m.py"
    src.write_text("def f(x):\n    return x + 1\n\n")
    mutant = {"key": "pkg/m.py:core/ReplaceBinaryOperator_Add_Sub:return x + 1", "module": "pkg/m.py", "diff": DIFF}
    with mutation._Applied(tmp_path, mutant):
        assert "return x - 1" in src.read_text()
    assert src.read_text() == "def f(x):\n    return x + 1\n\n"
    src.write_text("def f(x):\n    return x * 2\n\n")  # the module changed since the sample was drawn
    with pytest.raises(RuntimeError, match="no longer applies"):
        with mutation._Applied(tmp_path, mutant):
            pass
