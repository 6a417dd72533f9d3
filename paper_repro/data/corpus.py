"""Text that exists on every machine with Python: stdlib docstrings (+ licenses).

Source, stated: the ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` of
the running interpreter (parsed with `ast`; module, class and function
docstrings), plus /usr/share/common-licenses/* where that directory exists.
Files are visited in sorted order, so the corpus is deterministic for one
interpreter install.  Nothing is downloaded.
"""

from __future__ import annotations

import ast
import functools
import os
import sysconfig

__all__ = ["load_corpus", "LICENSE_DIR"]

LICENSE_DIR = "/usr/share/common-licenses"
# A fixed, sorted module list keeps the corpus small (fast to tokenize) and stable.
_STDLIB_DIRS = ("asyncio", "email", "json", "logging", "multiprocessing", "unittest",
                "concurrent", "importlib", "http", "xml", "urllib", "sqlite3")
_STDLIB_FILES = ("argparse.py", "collections/__init__.py", "dataclasses.py", "functools.py",
                 "inspect.py", "pathlib.py", "subprocess.py", "threading.py", "typing.py",
                 "shutil.py", "tarfile.py", "zipfile.py", "difflib.py", "textwrap.py",
                 "statistics.py", "fractions.py", "decimal.py", "random.py", "heapq.py",
                 "bisect.py", "string.py", "calendar.py", "datetime.py", "socket.py", "ssl.py",
                 "pickle.py", "copy.py", "enum.py", "abc.py", "contextlib.py", "tempfile.py")


def _docstrings(path: str) -> list[tuple[str, str]]:
    """(qualified name, docstring) pairs of one source file; [] if unparsable."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    out = []
    mod = os.path.basename(path)[:-3]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 40:
                name = getattr(node, "name", mod)
                out.append((name, doc))
    return out


@functools.lru_cache(maxsize=1)
def load_corpus() -> tuple[tuple[str, str], ...]:
    """All (title, text) documents, deterministic order.

    Raises RuntimeError if no text is found (a broken interpreter install):
    the pipelines would otherwise train on nothing.
    """
    root = sysconfig.get_paths()["stdlib"]
    paths = [os.path.join(root, f) for f in _STDLIB_FILES]
    for d in _STDLIB_DIRS:
        for dirpath, dirnames, files in os.walk(os.path.join(root, d)):
            dirnames[:] = sorted(x for x in dirnames if x not in ("test", "tests", "__pycache__"))
            paths += [os.path.join(dirpath, f) for f in sorted(files) if f.endswith(".py")]
    docs: list[tuple[str, str]] = []
    for p in paths:
        docs += _docstrings(p)
    if os.path.isdir(LICENSE_DIR):
        for name in sorted(os.listdir(LICENSE_DIR)):
            full = os.path.join(LICENSE_DIR, name)
            if os.path.isfile(full) and not os.path.islink(full):
                with open(full, encoding="utf-8", errors="replace") as f:
                    # licenses are long: cut into paragraphs so they become many documents
                    paras = [x.strip() for x in f.read().split("\n\n") if len(x.strip()) > 80]
                docs += [(f"{name} license", x) for x in paras]
    if not docs:
        raise RuntimeError(f"no text found under {root} or {LICENSE_DIR}; the repro pipelines need "
                           "the interpreter's standard library sources")
    return tuple(docs)
