"""`paper_repro.epoch_end`: the lost balance split between the flowing rounds and the epoch end, its bounds and
the two end-game prototypes."""

import numpy as np
import pytest

from paper_repro.epoch_end import epoch_end, split_loss


def test_split_loss_by_hand():
    # 2 ranks; round 0 (data flows) is 2 steps, round 1 (the end game) 2 steps
    c = np.array([[1.0, 0.8, 0.9, 0.1],
                  [0.8, 0.8, 0.3, 0.3]])
    f = split_loss(c, [2, 2], 1)
    # per-step loss max - mean: 0.1, 0, 0.3, 0.1
    assert f["end_rounds"] == 1
    base = 0.9 + 0.8 + 0.6 + 0.2
    assert f["straggler"] == pytest.approx(base / (1.0 + 0.8 + 0.9 + 0.3))
    assert f["flowing_straggler"] == pytest.approx(1.7 / 1.8)
    assert f["end_straggler"] == pytest.approx(0.8 / 1.2)
    assert f["ceiling"] == pytest.approx(2.5 / 2.8)  # the ranks' totals 2.8 and 2.2: mean / max
    # the end game's totals per rank: 1.0 and 0.6 -> loss at least 0.2 (one round: both bounds alike)
    assert f["per_round"] == pytest.approx(base / (base + 0.1 + 0.2))
    assert f["joint"] == pytest.approx(f["per_round"])


def test_joint_bound_levels_across_end_rounds():
    # two end-game rounds whose totals lean opposite ways: each round's bound counts both leans, the joint none
    c = np.array([[0.9, 0.9, 0.5],
                  [0.9, 0.5, 0.9]])
    f = split_loss(c, [1, 1, 1], 1)
    base = 0.9 + 0.7 + 0.7
    assert f["per_round"] == pytest.approx(base / (base + 0.2 + 0.2))
    assert f["joint"] == pytest.approx(1.0)
    assert f["straggler"] == pytest.approx(base / 2.7)


def test_split_loss_refuses_misread_rounds():
    with pytest.raises(ValueError):
        split_loss(np.ones((2, 5)), [2, 2], 1)
    with pytest.raises(ValueError):
        split_loss(np.ones((2, 4)), [2, 2], 3)


def test_a_simulated_point():
    f = epoch_end("sharegpt4o", 4, 32, 256)  # raises if its straggler is not bench_metrics' on the same batches
    assert f["end_rounds"] >= 1 and 0 < f["end_step"] < f["steps"]
    assert f["straggler"] <= f["per_round"] <= f["joint"] <= 1.0
    assert f["straggler"] < f["flowing_straggler"]  # at this point the end game balances worse than the rest


def test_reads_what_the_scale_grid_reads():
    """The same point through `scale_grid.run_point`: ODB's straggler and predicted throughput over sorted GMT's
    are the grid's own (the tool re-runs the grid's simulation, not a sibling of it)."""
    from paper_repro.scale_grid import run_point

    g = run_point("release", 4, 32, 8192, "padded", 256)["methods"]["odb_dealt"]
    f = epoch_end("release", 4, 32, 256, report=True)
    assert f["straggler"] == g["straggler_eff"]
    assert f["throughput_vs_gmt"] == g["throughput_vs_gmt"]
    assert f["equal_straggler"] > 0 and f["equal_throughput_vs_gmt"] > 0
    assert f["flow_straggler"] > 0 and f["flow_throughput_vs_gmt"] > 0
    from paper_repro.epoch_end import render

    row = render([f]).splitlines()[2]
    assert row.startswith("| release, N = 4, W = 32 (256) |") and f"{f['throughput_vs_gmt']:.3f}, " in row


def test_flow_prototype_decides_the_rounds_some_rank_ran_dry():
    """At a point whose end game holds a round with some, not every, rank run dry, the flow-until-all rule
    decides it otherwise (a rule that changed nothing would give the default's figures)."""
    f = epoch_end("mmmix", 8, 128, 1024, report=True)
    assert f["end_rounds"] >= 2
    assert f["flow_straggler"] != f["straggler"] and f["flow_throughput_vs_gmt"] != f["throughput_vs_gmt"]


def test_equal_groups_cut_every_sample_once_within_budget():
    import random

    from paper_repro.epoch_end import equal_groups

    rng = random.Random(3)
    L = [(rng.randint(50, 5000), i) for i in range(60)]
    length = dict((i, t) for t, i in L)
    for T in (40, 50, 60, 80):
        gs = equal_groups(L, T, 8192, 1 / 24576)
        assert sorted(i for g in gs for i in g) == list(range(60))
        assert len(gs) == min(T, 60)
        assert all(len(g) * max(length[i] for i in g) <= 8192 or len(g) == 1 for g in gs)
    costliest = [max(len(g) * max(length[i] for i in g) for g in equal_groups(L, T, 8192, 0.0)) for T in (40, 50, 60)]
    assert costliest[0] >= costliest[1] >= costliest[2]  # more steps, a cheaper costliest batch
    assert equal_groups([(4000, 0), (3000, 1)], 1, 8192, 0.0) == [[0, 1]]  # a pair that fits is one batch
    with pytest.raises(RuntimeError):
        equal_groups(L, 31, 8192, 0.0)  # these 60 samples pack into 32 batches of 8,192 at the fewest
