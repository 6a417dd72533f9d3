"""`python -m paper_repro.gpu` (issue 54): ready for a GPU, tested without one.

The toy configuration runs the same entry point, sources and training loop as the CUDA run, on CPU, at one and
two gloo ranks; only the device, memory and NCCL lines stay unexecuted here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from paper_repro import gpu

ROOT = Path(__file__).resolve().parent.parent


def test_the_plan_of_the_full_run_fits_the_few_minutes_a_gpu_is_lent(capsys):
    p = gpu.plan(gpu.FULL)
    assert 4e8 <= p["params"] <= 6e8 and p["estimated_s"] <= 8 * 60
    assert p["method_runs"] == len(gpu.FULL.workloads) * len(gpu.METHODS) * gpu.FULL.rounds
    assert gpu.main(["--plan-only"]) == 0
    out = capsys.readouterr().out
    assert "444.7M parameters" in out and "expected about" in out


def test_the_full_run_says_so_and_exits_2_without_cuda(monkeypatch, capsys):
    monkeypatch.setattr(gpu.torch.cuda, "is_available", lambda: False)
    assert gpu.main([]) == 2
    assert "no CUDA device here" in capsys.readouterr().err


def test_the_gpu_path_imports_neither_z3_nor_the_proofs():
    code = ("import sys, paper_repro.gpu, paper_repro.sources, paper_repro.data, odb.baselines.peers, odb.batching; "
            "bad = [m for m in sys.modules "
            "if m.split('.')[0] in ('z3', 'proofs', 'models', 'networkx', 'hypothesis')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


@pytest.mark.slow  # every method on 4 workloads at 1 and 2 gloo ranks (about 25 s)
def test_the_toy_run_trains_every_method_once_per_sample_on_one_and_two_ranks(tmp_path):
    assert gpu.main(["--toy", "--world-sizes", "1,2", "--out", str(tmp_path)]) == 0
    (md,) = tmp_path.glob("gpu_cpu_toy_*.md")
    data = json.loads(md.with_suffix(".json").read_text())
    assert [r["meta"]["world_size"] for r in data["results"]] == [1, 2]
    for res in data["results"]:
        runs = res["runs"]
        assert {(r["workload"], r["method"]) for r in runs} == {(w, m) for w in gpu.TOY.workloads
                                                                for m in gpu.METHODS}
        assert all(r["exactly_once"] and r["samples"] == gpu.TOY.num_train and r["val_loss"] > 0 for r in runs)
        assert all(r["padding"] == 0 for r in runs if r["method"] == "odb_packed")
        std = [r for r in runs if r["method"] == "standard1"]
        assert all(r["accum"] > 1 for r in std)  # Standard's effective batch matched to ODB's
    text = md.read_text()
    assert "The paper (NVIDIA H20" in text and "| sharegpt4o | odb_pad |" in text
    assert md.with_suffix(".png").stat().st_size > 5_000
