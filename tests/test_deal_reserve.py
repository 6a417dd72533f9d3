"""The dealer's reserve classes (`odb.batching.deal`), driven like the runtime drives them.

N replicas of `DealtOrder` (one per rank, the object the runtime's source reads its keys
from) see the same gathered numbers; between deals each rank reads keys, dropping some
(drops do not fill its window), and when its dealt keys run out `DealtOrder.key` gives it
its own reserve class or ends it (dry).  Whatever the drops, every position is given to
exactly one rank, every replica stays identical, and the epoch ends with nothing left.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from odb.batching.deal import Dealer
from odb.batching.dealt_order import DealtOrder


def _epoch(total, world, window, drop_every, seed_bits):
    order = [(p, p) for p in range(total)]
    reps = [DealtOrder(order, world, r, window + 1) for r in range(world)]
    for d in reps:
        d.first()
    taken = [0] * world          # keys consumed (the header's `taken`)
    ended = [False] * world
    rounds = 0
    while not all(ended) and rounds < 10 * total + 10:
        rounds += 1
        for r, d in enumerate(reps):  # FILL: consume until `window` usable keys or the source ends
            usable = 0
            while usable < window and not ended[r]:
                key = d.key(taken[r])
                if key is None:
                    ended[r] = True
                    break
                taken[r] += 1
                if drop_every == 0 or (key[0] * 7 + seed_bits) % drop_every:
                    usable += 1
        # the collective: every replica deals from the same gathered numbers
        gathered = (list(taken), [3 * t for t in taken], [int(d.dry) for d in reps], [d.reserve_taken for d in reps])
        before = [len(d.keys) for d in reps]
        for d in reps:
            d.deal(*gathered)
        assert len({repr(d.dealer.state_dict()) for d in reps}) == 1
        for r, d in enumerate(reps):
            assert not (len(d.keys) > before[r] and ended[r]), (
                f"rank {r} was dealt {d.keys[before[r]:]} after its source ended")
    given_out = sorted(k[0] for d in reps for k in d.keys)
    return given_out, reps[0].dealer, [d.dry for d in reps]


@settings(max_examples=150, deadline=None)
@given(total=st.integers(0, 120), world=st.integers(1, 5), window=st.integers(1, 6),
       drop_every=st.sampled_from([0, 1, 2, 3, 5]), seed_bits=st.integers(0, 6))
def test_every_position_is_given_exactly_once_whatever_the_drops(total, world, window, drop_every, seed_bits):
    given_out, dealer, dry = _epoch(total, world, window, drop_every, seed_bits)
    assert given_out == list(range(total))
    assert dealer.done and dealer.left == 0


def test_heavy_drops_use_the_reserve_and_a_dry_rank_is_dealt_nothing_more():
    # every key dropped: each rank consumes all it is dealt, then its whole reserve class
    given_out, dealer, dry = _epoch(60, 3, 4, 1, 0)
    assert given_out == list(range(60))
    assert sum(dealer.reserve) > 0 and any(dry)


def test_a_reserve_take_never_reaches_a_dealt_position():
    d = Dealer(10, 2, 2)
    d.start()                     # 0, 1, 2, 3 dealt
    assert [d.reserve_position(0, k) for k in range(4)] == [9, 7, 5, None]
    assert [d.reserve_position(1, k) for k in range(4)] == [8, 6, 4, None]
    d2 = Dealer(10, 2, 2)
    d2.start()
    d2.deal([2, 2], [1, 1], [0, 0], [1, 0])  # rank 0 took 9; needs are met from 4 on
    assert 9 not in d2.undealt() and d2.undealt() == [p for p in range(d2.cursor, 9)]
    assert d.deal([4, 3], [1, 1], [0, 0], [2, 1]) == [[4, 6], [5]]  # 7, 8, 9 were taken by their ranks
    assert d.undealt() == []
    assert d.done and d.left == 0


def test_reads_past_the_dealt_keys_take_successive_reserve_positions_and_count_them():
    d = DealtOrder([(p, p) for p in range(10)], 2, 0, 2)
    d.first()                              # rank 0 is dealt 0 and 2; the cursor is at 4
    got = [d.key(i) for i in range(6)]
    assert got == [(0, 0), (2, 2), (9, 9), (7, 7), (5, 5), None]  # its class from the end, down to the cursor
    assert d.reserve_taken == 3 and d.dry and d.key(5) is None  # dry stays dry
