"""Dealt sharding (``ODBDataLoader(sharding="dealt")``) on 2-3 gloo ranks.

One shuffled order is dealt to the ranks while the epoch runs (``odb.batching.deal``);
these tests audit exactly-once emission in every mode, with workers, drops that
make a rank run dry, and resume; that the traces conform to the table; and that
the ranks' token totals end more level than with fixed shards of the same data.
"""

import random

import pytest

from mp_harness import run_ranks, scenario
from proofs.conformance import assert_conformant

pytestmark = pytest.mark.slow

# heavy-tailed lengths: 1 sample in 8 is long, so fixed shards of a shuffled order differ in cost
_rng = random.Random(11)
LENGTHS = [_rng.randint(40, 120) if _rng.random() < 0.125 else _rng.randint(2, 12) for _ in range(240)]


def run(tmp_path, world_size, **spec):
    spec.setdefault("trace_dir", str(tmp_path / "traces"))
    spec.setdefault("lengths", LENGTHS)
    spec.setdefault("sharding", "dealt")
    res = run_ranks(scenario, world_size, tmp_path, args=(spec,), timeout_s=90)
    assert all(r.status == "ok" for r in res), [(r.status, r.error_type, (r.error or "")[:1500]) for r in res]
    return [r.value for r in res]


def emitted(values):
    return sorted(i for v in values for s in v["steps"] for i in s["ids"])


def tokens(values):
    return [sum(s["lt"] for s in v["steps"]) for v in values]


@pytest.mark.parametrize("mode, workers", [("pad", 0), ("join", 2), ("quota", 0)])
def test_every_sample_is_emitted_exactly_once_and_the_traces_conform(tmp_path, mode, workers):
    values = run(tmp_path, 3, mode=mode, workers=workers, W=8, budget=160)
    left = sorted(i for v in values for i in v["stats"]["unemitted_indices"])
    assert sorted(emitted(values) + left) == list(range(len(LENGTHS)))
    if mode != "quota":
        assert not left
        assert sum(v["stats"]["dealt"] for v in values) == len(LENGTHS)
    # nothing dropped: every deal tops each rank up to the most it can pull before the next one, so no rank
    # reads past its dealt keys into its reserve (a source that reads its keys ahead of its lead would)
    assert [v["stats"]["reserve_taken"] for v in values] == [0, 0, 0]
    if mode != "join":
        assert len({len(v["steps"]) for v in values}) == 1
    assert_conformant(str(tmp_path / "traces"))


def test_dealt_totals_end_more_level_than_fixed_shards(tmp_path):
    dealt = run(tmp_path / "d", 3, W=6, budget=160)
    fixed = run(tmp_path / "f", 3, W=6, budget=160, sharding="fixed")
    assert emitted(dealt) == emitted(fixed) == list(range(len(LENGTHS)))

    def spread(values):
        t = tokens(values)
        return (max(t) - min(t)) / (sum(t) / len(t))
    # measured: fixed shards of this order differ by 39% of the mean (23 steps), dealt ones by 20% (22 steps;
    # 5% when every rank was topped up to a whole window: 80 samples per rank leave the end game little to
    # level, and over 40 such orders in simulation both deals average 12% with a padded cost)
    assert spread(fixed) > 0.15 and spread(dealt) < 0.6 * spread(fixed), (tokens(fixed), tokens(dealt))


def test_a_rank_that_runs_dry_through_drops_is_dealt_nothing_more_and_nothing_is_lost(tmp_path):
    drops = list(range(0, len(LENGTHS), 2))  # half the indices return None: ranks consume past their lead
    values = run(tmp_path, 2, W=4, drop=drops, budget=160)
    assert emitted(values) == sorted(set(range(len(LENGTHS))) - set(drops))
    assert sum(v["stats"]["dropped"] for v in values) == len(drops)
    assert sum(v["stats"]["reserve_taken"] for v in values) > 0  # the drops did run ranks past their lead
    assert sum(v["stats"]["dealt"] + v["stats"]["reserve_taken"] for v in values) == len(LENGTHS)
    assert_conformant(str(tmp_path / "traces"))


def test_resume_round_trip_emits_every_sample_exactly_once(tmp_path):
    first = run(tmp_path / "a", 2, W=8, save_at=4, budget=160)
    second = run(tmp_path / "b", 2, W=8, state=[v["state"] for v in first], budget=160)
    assert emitted(first + second) == list(range(len(LENGTHS)))
    assert_conformant(str(tmp_path / "b" / "traces"))


def test_quota_stopping_with_positions_never_dealt_reports_them_unemitted_once(tmp_path):
    # drops (7 in 10) run one rank dry while the dealer still holds positions back: QUOTA stops there, and the
    # positions no rank was dealt are counted once, on rank 0, with every rank's unread keys and window
    rng = random.Random(3)
    drops = [i for i in range(len(LENGTHS)) if rng.random() < 0.7]
    values = run(tmp_path, 3, W=4, drop=drops, budget=160, mode="quota")
    left = [i for v in values for i in v["stats"]["unemitted_indices"]]
    assert values[0]["stats"]["unemitted_indices"]
    # every sample is emitted or reported once (an unread position may be one that would have dropped)
    kept = sorted(emitted(values) + [i for i in left if i not in drops])
    assert kept == sorted(set(range(len(LENGTHS))) - set(drops)) and len(set(left)) == len(left)
    assert_conformant(str(tmp_path / "traces"))
