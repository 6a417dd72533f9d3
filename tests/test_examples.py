"""Every runnable example in examples/, launched as its docstring says: torchrun with 2 gloo ranks, and with python.

The scripts are discovered from the folder (every ``*.py`` not starting with ``_``), so a new example
is run without being listed here; `FLAGS` adds the runs of the flags that change the code path.
``--standalone`` rendezvouses on a free port, so runs never collide on a fixed one.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.name for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_"))
FLAGS = {  # script -> extra runs, each a list of flags
    "plain_ddp.py": [["--mode", "join"], ["--pool-size", "2"], ["--exchange"]],
    "trl_sft.py": [["--lora", "--padding-free"]],
    "fsdp2_loop.py": [["--accum", "3", "--uneven"]],
    "vlm_packed.py": [["--packed"], ["--fsdp"]],
}
RUNS = [(s, []) for s in SCRIPTS] + [(s, f) for s, runs in FLAGS.items() for f in runs]
# every example ends with one line per rank "rank <r>: <n> samples, ..."; matched anywhere, since the
# two ranks share stdout and one rank's line can run into the other's
SUMMARY = re.compile(r"rank (\d+): \d+ samples")
# these print one summary, on the main process (accelerator.print), without a rank
MAIN_ONLY = {"accelerate_loop.py"}


def test_the_examples_are_discovered_from_the_folder_and_every_flagged_one_exists():
    assert SCRIPTS, f"no example script found in {ROOT / 'examples'}"
    gone = sorted((set(FLAGS) | MAIN_ONLY) - set(SCRIPTS))
    assert not gone, f"FLAGS or MAIN_ONLY name scripts that are gone: {gone}"


@pytest.mark.slow  # two torchrun ranks per run, most of it importing the frameworks (about 5-25 s each on 2 cores)
@pytest.mark.adapters
@pytest.mark.parametrize("script,flags", RUNS, ids=[" ".join([s, *f]) for s, f in RUNS])
def test_every_example_runs_on_two_gloo_ranks_and_each_rank_prints_its_summary(script, flags):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "examples" / script), *flags]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    log = proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, log
    if script in MAIN_ONLY:
        assert len(re.findall(r"\d+ samples, \d+ optimizer steps", proc.stdout)) == 1, log
    else:
        assert sorted(SUMMARY.findall(proc.stdout)) == ["0", "1"], log


@pytest.mark.slow  # one process each, most of it importing the frameworks (about 4-7 s each on 2 cores)
@pytest.mark.adapters
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_example_runs_with_python_on_one_process(script):
    # as the getting-started page presents them: `python examples/x.py` as well as under torchrun
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script)], env=dict(env, OMP_NUM_THREADS="1"),
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    log = proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, log
    if script in MAIN_ONLY:
        assert len(re.findall(r"\d+ samples, \d+ optimizer steps", proc.stdout)) == 1, log
    else:
        assert SUMMARY.findall(proc.stdout) == ["0"], log
