"""The layering the README promises: imports run paper_repro -> proofs -> models -> odb with no cycle (read from
the source), and the protocol, the policies, the core and the models import neither torch
nor z3 nor networkx (the proofs' extras)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["odb", "odb.protocol", "odb.batching", "odb.core", "models.env",
                                    "models.properties"])
def test_module_imports_neither_torch_nor_z3_nor_networkx(module):
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'z3', 'networkx') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", f"{module} pulled in {out.stdout.strip()}"


def test_odb_exposes_the_runtime_lazily():
    code = "import odb, sys; assert 'torch' not in sys.modules; odb.ODBDataLoader; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "True"


# --- the direction of imports and the absence of cycles, read from the source (every import statement, at
# module level or inside a function: a lazy import keeps a cycle alive as well)

import ast  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["odb", "models", "proofs", "paper_repro"]  # each may import only the ones before it


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Our modules `path` imports (absolute and relative), as dotted names."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):  # ``if TYPE_CHECKING:`` imports too: a
        # loop for annotations is still two rooms that must be read together
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[:len(up) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import submodule`
    return {m for m in out if m.split(".")[0] in LAYERS}


def _graph() -> dict[str, set[str]]:
    files = [p for layer in LAYERS for p in (ROOT / layer).rglob("*.py")]
    names = {_module_name(p) for p in files}
    graph = {}
    for p in files:
        deps = set()
        for m in _imports(p):
            while m and m not in names:  # `from pkg import function` names no module: keep the package
                m = m.rpartition(".")[0]
            if m and m != _module_name(p):
                deps.add(m)
        graph[_module_name(p)] = deps
    return graph


def test_imports_run_one_way_paper_repro_proofs_models_odb():
    bad = [(m, d) for m, deps in _graph().items() for d in deps
           if LAYERS.index(d.split(".")[0]) > LAYERS.index(m.split(".")[0])]
    assert not bad, f"imports against the layering {' <- '.join(LAYERS)}: {sorted(bad)}"


def test_no_import_cycle_between_our_modules_a_submodules_own_package_aside():
    import networkx as nx

    g = nx.DiGraph()
    for m, deps in _graph().items():
        for d in deps:
            # Python imports a submodule's packages before it, so an edge from a submodule to its own package
            # adds nothing; a package's __init__ importing its submodules does count (a sibling package
            # importing that package closes a loop through it)
            if not m.startswith(d + "."):
                g.add_edge(m, d)
    cycles = [c for c in nx.simple_cycles(g) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_the_cycle_check_has_teeth(monkeypatch):
    import networkx as nx

    g = nx.DiGraph([("paper_repro.a", "paper_repro.b"), ("paper_repro.b", "paper_repro.a")])
    assert list(nx.simple_cycles(g)), "networkx finds a two-module cycle"
    mods = _graph()
    assert "paper_repro.sources" in mods and "paper_repro.workloads" in mods["paper_repro.sources"]
    assert "odb.core.rank" in mods["odb.core.sim"]


def test_a_pass_reads_its_loader_only_through_the_members_pass_host_names():
    # the loader and its pass talk through `PassHost`: no private attribute, nothing it does not name
    from odb.runtime.epoch_pass import PassHost

    members = set(PassHost.__annotations__)  # the names (their types are for a type checker: not evaluated here)
    named = members | {n for n in vars(PassHost) if not n.startswith("_")}
    read = set()
    for f in ("odb/runtime/epoch_pass.py", "odb/runtime/observe.py"):
        for node in ast.walk(ast.parse((ROOT / f).read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "loader":
                read.add(node.attr)
    assert read and read <= named, f"a pass reads {sorted(read - named)} of its loader outside PassHost"
    from odb import ODBDataLoader
    assert all(hasattr(ODBDataLoader, n) or n in members for n in named)


def test_no_module_of_odb_imports_another_modules_private_name():
    """A name with a leading underscore is its module's own: one another module needs is public (named in its
    ``__all__`` or documented there), so a change to it is seen as a change to an interface."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "odb"
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                found += [f"{path.relative_to(root.parent)}:{node.lineno} {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__") and a.name != "_identity"]
    assert not found, found


def test_only_header_layout_builds_a_header_layout():
    """The loader, the simulation, the planner and the benchmarks build their header layout with one function
    (`odb.core.header.header_layout`): a second construction could drift from the one the loader runs."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    built = []
    for path in sorted([*root.joinpath("odb").rglob("*.py"), *root.joinpath("paper_repro").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "HeaderLayout":
                built.append(f"{path.relative_to(root)}:{node.lineno}")
    assert len(built) == 1 and built[0].startswith("odb/core/header.py:"), built
