"""Dealt sharding in the checked model: the table composed with the real `DealtOrder` replicas.

Invariant: at small scope every dealt property holds on the real dealer, every seeded dealer or
glue bug is caught by the property expected to catch it, the state counts do not move unnoticed,
and the reserve arithmetic is proved for all N.  About 10 s on one core (the full `DEALT_SCOPES`
run in `make verify`).
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import z3

from models.dealt import DROP, DealtConfig, DealtModel, Replicas
from models.dealt_properties import DEALT_PROPERTIES, by_name, for_mode
from models.scopes import DEALT_SCOPES, DealtScope
from odb.batching.deal import Dealer
from odb.batching.dealt_order import DealtOrder
from odb.protocol.table import JOIN, PAD, QUOTA
from proofs.explicit.dealt import check_dealt_scope, dealt_witness_verdicts, explore_dealt
from proofs.mutants import KILL
from proofs.mutants.dealt import DEALT_MUTANTS, check_dealt_mutant
from proofs.symbolic.dealt import OBLIGATIONS, class_count, prove_dealer

# (total, aheads, W, mode, policy, values) -> (states, transitions, BFS depth, sinks, longest path).
PINNED = {
    (5, (0, 0), 1, PAD, "whole", (DROP, 1, 2)): (14354, 24667, 46, 243, 46),
    (7, (0, 1), 1, PAD, "whole", (DROP, 1)): (11455, 20212, 59, 144, 59),
    (7, (0, 1), 1, JOIN, "whole", (DROP, 1)): (10496, 18394, 58, 144, 58),
    (7, (0, 1), 1, QUOTA, "whole", (DROP, 1)): (6620, 11897, 50, 134, 50),
    (11, (0, 0), 3, PAD, "singletons", (1,)): (38440, 70282, 85, 357, 85),
    (7, (0, 0, 0), 1, PAD, "whole", (DROP, 1)): (43915, 112515, 66, 128, 66),
}


@pytest.mark.parametrize("key", sorted(PINNED), ids=str)
def test_dealt_state_counts_are_pinned(key):
    total, aheads, w, mode, policy, values = key
    r = explore_dealt(DealtConfig(total=total, aheads=aheads, W=w, mode=mode, policy=policy, values=values))
    assert (r.states, r.transitions, r.depth, r.sinks, r.longest_path) == PINNED[key]
    assert not r.truncated and r.num_deadlocks == 0 and r.cycle is None and r.always_fail == {}


def test_the_model_reads_and_deals_through_the_real_dealt_order():
    # what the interned replicas answer is what a DealtOrder driven directly answers
    reps = Replicas(DealtOrder, 9, 2)
    direct = DealtOrder([(p, p) for p in range(9)], 2, 1, 2)
    direct.first()
    rid = reps.first(1, 2)
    assert reps.info[rid]["keys"] == tuple(k[0] for k in direct.keys) == (1, 3)
    for i in range(4):  # two dealt keys, then rank 1's reserve class from the end: 7, 5
        rid, p = reps.key(rid, i)
        k = direct.key(i)
        assert p == (None if k is None else k[0])
    assert reps.info[rid]["reserve_taken"] == direct.reserve_taken == 2
    args = ((2, 4), (2, 4), (0, 0), (0, 2), (2, 2))
    rid = reps.deal(rid, args)
    direct.deal(*(list(a) for a in args))
    assert reps.info[rid]["state"] == direct.dealer.state_dict()
    assert reps.info[rid]["keys"] == tuple(k[0] for k in direct.keys)
    assert reps.materialize(rid).dealer.state_dict() == direct.dealer.state_dict()


def test_the_real_dealer_passes_every_dealt_check_at_a_small_scope():
    res = check_dealt_scope(DealtScope(aheads=(0, 1), w=1, totals=tuple(range(0, 8))))
    bad = [(v.property, v.mode, v.result, v.detail) for v in res.verdicts if not v.ok]
    assert bad == []
    got = {v.property for v in res.verdicts if v.mode == "quota"}
    assert got == {p.name for p in for_mode(QUOTA) if p.kind == "always"} | {
        "deadlock_free", "bounded_termination", "every_step_fires"}
    assert ("a_prefetched_key_waits_across_a_collective", "pad") in res.found


def test_every_dealt_always_property_names_witnesses_of_its_modes_and_every_witness_is_required():
    known = {p.name: p for p in DEALT_PROPERTIES}
    for p in DEALT_PROPERTIES:
        if p.kind == "always":
            assert p.witness and all(known[w].kind == "sometimes" for w in p.witness), p.name
            for mode in p.modes:
                assert any(mode in known[w].modes for w in p.witness), (p.name, mode)
    # a witness not found in any scope fails
    vs = dealt_witness_verdicts([{("a_rank_runs_dry", "pad"): "somewhere"}], modes=(PAD,))
    assert {v.property: v.result for v in vs}["a_rank_runs_dry"] == "found"
    assert {v.property: v.result for v in vs}["the_end_game_deals_by_cost"] == "not found"
    # the CI scopes cover every mode, two to four ranks, and prefetch that differs between ranks
    assert {m for s in DEALT_SCOPES for m in s.modes} == {PAD, JOIN, QUOTA}
    assert max(s.n for s in DEALT_SCOPES) == 4 and any(len(set(s.aheads)) > 1 for s in DEALT_SCOPES)


@pytest.mark.parametrize("mutant", DEALT_MUTANTS, ids=lambda m: m.name)
def test_each_seeded_dealer_or_glue_bug_is_caught_by_its_expected_property(mutant):
    r = check_dealt_mutant(mutant)
    assert r.killed_as_expected, f"{mutant.name}: expected {mutant.expected}, killed by {r.killers}"
    assert r.counterexample.startswith(f"VIOLATION {mutant.expected}")


def test_the_runtimes_old_rank_local_prefetch_bug_makes_replicas_diverge_and_positions_go_twice_or_never():
    (m,) = [m for m in DEALT_MUTANTS if m.name == "needs_from_own_prefetch"]
    r = check_dealt_mutant(m)
    assert {"replicas_agree/pad", "every_position_emitted_or_dropped_once/pad"} <= set(r.killers)


def test_a_dealer_that_raises_is_a_failed_verdict_and_a_stuck_rank_not_an_exception():
    class _Raises(Dealer):
        def deal_parts(self, *a, **k):  # what `DealtOrder.deal` calls (`Dealer.deal` lists its result)
            raise ValueError("seeded")

    class _Order(DealtOrder):
        def __init__(self, keys, world_size, rank, lead, stats=None):
            super().__init__(keys, world_size, rank, lead, stats)
            self.dealer = _Raises(len(self.order), world_size, lead)

    class _Model(DealtModel):
        order_cls = _Order

    res = check_dealt_scope(DealtScope(aheads=(0, 0), w=1, totals=(6,), modes=(PAD,)), model_cls=_Model)
    got = {v.property: v for v in res.verdicts}
    assert got["the_dealer_never_raises"].result == KILL and got["deadlock_free"].result == KILL
    assert any("raised ValueError: seeded" in text for _, text in res.counterexamples)


def test_an_incomplete_dealt_search_is_unknown_never_a_pass():
    res = check_dealt_scope(DealtScope(aheads=(0, 0), w=1, totals=(6,), modes=(PAD,)), max_states=50)
    assert res.verdicts and all(v.result == "unknown" and "INCOMPLETE" in v.detail for v in res.verdicts)
    assert res.found == {}


# -- the reserve arithmetic -------------------------------------------------------------------------
def test_left_is_the_count_of_undealt_positions_for_every_small_dealer_state():
    """Exhaustive at N <= 4, total <= 10: every cursor and every reserve vector whose takes lie at or
    past... anywhere in their class (the dealer allows any counts it was told)."""
    for n in range(1, 5):
        for total in range(0, 11):
            sizes = [len(range(r, total, n)) for r in range(n)]  # positions per class
            for reserve in itertools.product(*[range(c + 1) for c in sizes]):
                taken = {total - 1 - (n * k + r) for r in range(n) for k in range(reserve[r])}
                for cursor in range(0, total + 1):
                    d = Dealer(total, n, 1)
                    d.cursor, d.reserve = cursor, list(reserve)
                    want = [p for p in range(cursor, total) if p not in taken]
                    assert d.undealt() == want and d.left == len(want), (n, total, reserve, cursor)
                    for r in range(n):  # the z3 term of the summand is the code's
                        span = total - 1 - cursor
                        c = z3.simplify(class_count(z3.IntVal(span), z3.IntVal(r), z3.IntVal(n))).as_long()
                        assert min(reserve[r], c) == (min(reserve[r], (span - r) // n + 1) if span >= r else 0)


def test_the_dealer_arithmetic_is_proved_for_all_n_and_has_teeth():
    vs = {v.property: v for v in prove_dealer()}
    assert set(vs) == {name for name, _ in OBLIGATIONS}
    assert all(v.result == "proved" for v in vs.values()), [(v.property, v.detail) for v in vs.values()]
    off_by_one = {v.property: v for v in prove_dealer(lambda span, r, n: z3.If(span >= r, (span - r) / n, 0))}
    assert off_by_one["left_class_count_is_exact"].result == "failed"
    assert "counterexample" in off_by_one["left_class_count_is_exact"].detail


def test_the_dealt_properties_are_named_once():
    names = [p.name for p in DEALT_PROPERTIES]
    assert len(names) == len(set(names)) and by_name("replicas_agree").kind == "always"


def test_the_dealt_model_imports_neither_torch_nor_z3():
    code = ("import sys, models.dealt, models.dealt_properties; "
            "print(sorted(m for m in ('torch', 'z3') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
