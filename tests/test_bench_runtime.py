"""`make bench`'s runtime part measures the code that runs: the loader figure's timed policy is the default's path."""

import odb
from odb import pop_step_info
from paper_repro import bench_runtime as br


def _batches(policy):
    ds = br._Prebuilt(br._lengths(3000, 1))
    loader = odb.ODBDataLoader(ds, 8192, br._noop_collate, buffer_size=256, policy=policy, loss_basis="tokens")
    try:
        return [pop_step_info(b).indices for b in loader]
    finally:
        loader.close()


def test_the_loader_figures_timed_policy_emits_the_default_policys_batches():
    timed = br._TimedPolicy()
    got = _batches(timed)
    assert got == _batches(None) and len(got) > 100
    assert timed.seconds > 0
