"""The layering the README promises: the protocol, the policies, the core and the models import neither torch
nor z3 nor networkx (the proofs' extras)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["odb", "odb.protocol", "odb.batching", "odb.core", "models.env", "models.properties"])
def test_module_imports_neither_torch_nor_z3_nor_networkx(module):
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'z3', 'networkx') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", f"{module} pulled in {out.stdout.strip()}"


def test_odb_exposes_the_runtime_lazily():
    code = "import odb, sys; assert 'torch' not in sys.modules; odb.ODBDataLoader; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "True"
