"""The pure rank core (`odb.core`): the named header, the compared settings, the replicated decision."""

import dataclasses
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odb.batching import default_policy
from odb.batching.dealt_order import DealtOrder
from odb.batching.intake import intake_ladder
from odb.batching.policy import NUM_BUCKETS, SUMMARY_TAG
from odb.core import REPLICATED, HeaderLayout, Replicated, Shared, mismatches, round_proposal
from odb.core.header import Post, reduce_posts
from odb.core.shared import PARAMETERS, describe_cost, describe_policy
from odb.errors import ConfigError, ProtocolError
from odb.protocol.table import DGAP, MODES


def _layout(w=8):
    return HeaderLayout(default_policy().summary_len, w, len(intake_ladder(w)))


@settings(max_examples=50, deadline=None)
@given(w=st.integers(1, 40), data=st.data())
def test_a_header_decodes_to_the_fields_it_was_encoded_from(w, data):
    lay = HeaderLayout(3, w, len(intake_ladder(w)))
    ints = st.integers(-2**40, 2**40)
    parts = dict(st=data.draw(ints), round=data.draw(ints), n=data.draw(ints), epoch=data.draw(ints),
                 digest=data.draw(st.lists(ints, min_size=3, max_size=3)),
                 summary=data.draw(st.lists(ints, min_size=3, max_size=3)),
                 taken=data.draw(ints), cost=data.draw(ints), dry=data.draw(ints), reserve=data.draw(ints),
                 intake=data.draw(st.lists(ints, min_size=lay.ladder_len, max_size=lay.ladder_len)))
    row = lay.encode(**parts)
    h = lay.decode(row)
    assert len(row) == lay.length == 11 + 3 + lay.ladder_len and lay.counts_len == 3 * w
    assert (h.epoch, h.deal, h.target, h.proposal) == (parts["epoch"], *parts["digest"])
    assert list(h.summary) == parts["summary"] and list(h.intake) == parts["intake"]
    assert (h.st, h.round, h.n, h.taken, h.cost, h.dry, h.reserve) == tuple(
        parts[k] for k in ("st", "round", "n", "taken", "cost", "dry", "reserve"))
    with pytest.raises(ValueError, match="holds"):
        lay.decode(row[:-1])
    with pytest.raises(ValueError, match="summary"):
        lay.encode(**{**parts, "summary": [1]})


@settings(max_examples=50, deadline=None)
@given(w=st.integers(1, 40), n=st.integers(1, 7), data=st.data())
def test_every_ranks_headers_decoded_at_once_read_as_each_header_decoded_alone(w, n, data):
    """`HeaderLayout.decode_all`: the transport's (N, length) int64 array, int lists, decoded `Header`s or
    `Headers` give the same rows; each field's column is the rows' field; a row of another length raises."""
    import numpy as np

    lay = HeaderLayout(3, w, len(intake_ladder(w)))
    rows = [data.draw(st.lists(st.integers(-2**40, 2**40), min_size=lay.length, max_size=lay.length))
            for _ in range(n)]
    want = [lay.decode(r) for r in rows]
    for form in (np.array(rows, dtype=np.int64), rows, want):
        got = lay.decode_all(form)
        assert len(got) == n and list(got) == want and lay.decode_all(got) is got
        assert got.summaries == [h.summary for h in want] and got.intake.tolist() == [list(h.intake) for h in want]
        for f in ("st", "round", "n", "epoch", "deal", "target", "proposal", "taken", "cost", "dry", "reserve"):
            assert got.values(f) == got.column(f).tolist() == [getattr(h, f) for h in want]
        assert list(got[1:]) == want[1:] and got[-1] == want[-1]
    with pytest.raises(ValueError, match="holds"):
        lay.decode_all(np.array(rows, dtype=np.int64)[:, :-1])
    with pytest.raises(ValueError, match="holds"):
        lay.decode_all(rows[:-1] + [rows[-1] + [0]])
    with pytest.raises(ValueError):  # the rows are every rank's, as gathered: read only
        lay.decode_all(rows).array[0, 0] = 1


@settings(max_examples=50, deadline=None)
@given(w=st.integers(1, 12), n=st.integers(1, 6), data=st.data())
def test_the_collective_sums_the_counts_and_keeps_each_batchs_largest_tokens(w, n, data):
    lay = HeaderLayout(3, w, len(intake_ladder(w)))
    counts = [data.draw(st.lists(st.integers(0, 10**6), min_size=3 * w, max_size=3 * w)) for _ in range(n)]
    g = reduce_posts([Post([r] * lay.length, c) for r, c in enumerate(counts)])
    assert [list(h) for h in g.rows] == [[r] * lay.length for r in range(n)]
    assert list(g.totals) == [sum(c[i] for c in counts) for i in range(3 * w)]
    assert list(g.tokens_max) == [max(c[3 * k] for c in counts) for k in range(w)]
    lay.check_reduced(g)
    with pytest.raises(ValueError, match="reduced counts"):
        lay.check_reduced(g._replace(tokens_max=list(g.tokens_max)[:-1]))
    with pytest.raises(ValueError, match="reduced counts"):
        lay.check_reduced(g._replace(totals=[*g.totals, 0]))


def test_the_transport_gathers_while_a_round_stays_small_and_reduces_past_it():
    from odb.runtime.transport import GATHER_LIMIT, HeaderGather, counts_mode

    lay = _layout(1024)  # 63-int headers, 3072 counts
    per_rank = lay.length + 3 * 1024
    assert counts_mode(GATHER_LIMIT // per_rank, lay.length, 1024) == "gather"
    assert counts_mode(GATHER_LIMIT // per_rank + 1, lay.length, 1024) == "reduce"
    assert counts_mode(8, lay.length, 1024) == "gather" and counts_mode(1024, lay.length, 1024) == "reduce"
    with pytest.raises(ValueError, match="mode"):
        HeaderGather(None, 1, "scatter")


def _shared(**kw):
    base = dict(protocol="p", window=8, mode="pad", sharding="dealt", header_len=_layout().length,
                policy=describe_policy(default_policy()), cost="padded(tokens:padded<=64)",
                loss_basis="label_tokens", shift_labels=False, order="shuffle=True seed=0 positions=60")
    return Shared(**{**base, **kw})


def test_the_construction_check_vector_is_generated_from_every_shared_field():
    names = [f.name for f in dataclasses.fields(Shared)]
    a = _shared()
    assert len(a.vector()) == len(names) == len(a.describe()) and set(PARAMETERS) == set(names)
    for name in names:  # changing any one field shows as exactly that mismatch
        v = getattr(a, name)
        other = (not v) if isinstance(v, bool) else (v + 1 if isinstance(v, int) else v + "x")
        b = dataclasses.replace(a, **{name: other})
        assert mismatches([a.vector(), b.vector()]) == [name]
    assert mismatches([a.vector(), a.vector()]) == []


def test_policy_and_cost_descriptions_hold_their_parameters():
    from odb.batching import make_cost_model

    assert "<=8192" in describe_cost(make_cost_model("padded", 8192))
    assert describe_cost(make_cost_model("padded", 8192)) != describe_cost(make_cost_model("padded", 4096))
    f1 = make_cost_model(lambda b: sum(s[0] for s in b), 100)
    f2 = make_cost_model(lambda b: len(b) * max(s[0] for s in b), 100)
    assert describe_cost(f1) != describe_cost(f2) and "budgets=[100.0]" in describe_cost(f1)

    class Tuned(type(default_policy())):
        def __init__(self, k):
            super().__init__()
            self.k = k
    assert describe_policy(Tuned(1)) != describe_policy(Tuned(2))  # public parameters are compared
    p = default_policy()
    p._memo = ("a cache",)
    assert describe_policy(p) == describe_policy(default_policy())  # caches are not


def _summary(n, exhausted, groups):
    h = [0] * NUM_BUCKETS
    h[6] = groups
    return [SUMMARY_TAG, n, int(exhausted), groups, groups, *h]


def test_round_proposal_asks_the_policy_with_the_window_and_skips_it_when_the_round_aborts():
    cfg = {"W": 256, "W0": 256, "mode": MODES["pad"], "header_len": 9, "xchg": 0}
    summaries = [_summary(256, False, 7), _summary(256, False, 7)]
    headers = [{"st": 0, "n": 256, "shape": 9}] * 2
    pol = default_policy()
    assert round_proposal(DGAP, cfg, headers, summaries, pol, 0) == pol.propose(summaries, 256) == 4
    assert pol.propose(summaries, 2) == 7  # the world size as the window would switch the reservoir off
    aborted = [{"st": 2, "n": 256, "shape": 9}, headers[1]]
    bad = [[0] * len(summaries[0]), summaries[1]]  # a failing rank's placeholder summary
    assert round_proposal(DGAP, cfg, aborted, bad, pol, 0) == 1  # the table's lower bound; propose not asked
    with pytest.raises(ProtocolError):
        round_proposal(DGAP, cfg, headers, bad, pol, 0)

    class Wild:
        def propose(self, summaries, window):
            return window + 5
    with pytest.raises(ProtocolError, match="outside the table's bounds"):
        round_proposal(DGAP, cfg, headers, summaries, Wild(), 3)


def _rows(lay, rep_fields, n=4):
    """The round's gathered headers, as the transport hands them to the replicas (`Headers`)."""
    return lay.decode_all([lay.encode(st=0, round=0, n=n, epoch=epoch, digest=digest, summary=_summary(n, False, 2),
                                      taken=n, cost=n, dry=0, reserve=0, intake=[n] * lay.ladder_len)
                           for epoch, digest in rep_fields])


@pytest.mark.parametrize("field", REPLICATED)
def test_a_replicated_field_that_differs_fails_every_replica_naming_it_and_the_ranks(field):
    lay = _layout()
    base = [(0, (5, 0, 0))] * 3
    j = REPLICATED.index(field)
    bad = list(base)
    epoch, dg = bad[2]
    vals = [epoch, *dg]
    vals[j] += 1
    bad[2] = (vals[0], tuple(vals[1:]))
    for rank in range(3):
        rep = Replicated(_shared(), world_size=3, aheads=(0, 0, 0), policy=default_policy(), order=None, epoch=0)
        err = ConfigError if field == "epoch" else ProtocolError
        with pytest.raises(err) as e:
            rep.decide(_rows(lay, bad))
        assert "ranks [0, 1]" in str(e.value) and "ranks [2]" in str(e.value)
        if field != "epoch":
            assert repr(field) in str(e.value)


@pytest.mark.parametrize("field", REPLICATED)
def test_a_replicated_field_that_differs_on_one_middle_rank_alone_fails_every_replica(field):
    lay = _layout()
    rep_fields = [(0, (5, 0, 0))] * 5
    j = REPLICATED.index(field)
    vals = [0, 5, 0, 0]
    vals[j] += 1
    rep_fields[2] = (vals[0], tuple(vals[1:]))
    for rank in range(5):
        rep = Replicated(_shared(), world_size=5, aheads=(0,) * 5, policy=default_policy(), order=None, epoch=0)
        with pytest.raises(ConfigError if field == "epoch" else ProtocolError, match=r"on ranks \[2\]"):
            rep.decide(_rows(lay, rep_fields))


def test_replicas_fed_the_same_rows_decide_and_deal_alike_whatever_their_rank():
    lay = _layout()
    keys = [(p, p) for p in range(40)]
    reps = []
    for rank in range(3):
        order = DealtOrder(keys, 3, rank, 10)
        order.first()
        reps.append(Replicated(_shared(), world_size=3, aheads=(0, 2, 6), policy=default_policy(), order=order,
                               epoch=0))
    digests = {r.digest() for r in reps}
    assert len(digests) == 1
    rows = _rows(lay, [(0, reps[0].digest())] * 3)
    decisions = [r.decide(rows) for r in reps]
    assert len({(d.proposal, d.target, tuple(sorted(d.inputs.items()))) for d in decisions}) == 1
    assert len({r.digest() for r in reps}) == 1 and reps[0].digest() != next(iter(digests))
    got = sorted(k for r in reps for k in r.order.keys)
    assert len(got) == len(set(got))  # every dealt key on exactly one rank


def test_every_loader_setting_is_compared_or_says_why_it_may_differ_per_rank():
    from odb.settings import COMPARED, RANK_LOCAL, LoaderSettings

    names = {f.name for f in dataclasses.fields(LoaderSettings)}
    assert names == set(COMPARED) | set(RANK_LOCAL) and not set(COMPARED) & set(RANK_LOCAL)
    compared_as = {f for v in COMPARED.values() for f in ((v,) if isinstance(v, str) else v)}
    assert compared_as <= {f.name for f in dataclasses.fields(Shared)}
    assert all(len(why) > 10 for why in RANK_LOCAL.values())


def test_loader_settings_validate_and_unknown_names_list_the_valid_ones():
    from odb.settings import LoaderSettings

    s = LoaderSettings(token_budget=64, buffer_size=8)
    assert s.buffer_size == 8 and dataclasses.replace(s, mode="join").mode == "join"
    with pytest.raises(ConfigError, match="buffer_size"):
        LoaderSettings(token_budget=64, buffer_size=0)
    with pytest.raises(ConfigError, match=r"unknown settings \['bufer_size'\]; valid: .*buffer_size"):
        LoaderSettings.from_kwargs({"token_budget": 64, "bufer_size": 8})
    with pytest.raises(ConfigError, match="the mapping holds the budgets"):
        LoaderSettings(token_budget=64, cost={"tokens": 64, "patches": 32})
    assert LoaderSettings(token_budget=None,
                          cost={"tokens": 64, "patches": 32}).cost_and_policy()[0].budgets == (64, 32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.mode = "join"


def _listed_core(n: int, *, traced: bool):
    """A one-rank core on W = 4 and a padded budget of 64 over n samples of 3, 6, 9, ... tokens, read in order."""
    from odb.batching import make_cost_model
    from odb.core.info import LoaderStats
    from odb.core.rank import RankCore

    class Listed:
        def __init__(self):
            self.items = [(p, p, {"input_ids": [1] * (3 + 3 * p)}, ((3 + 3 * p,), 3 + 3 * p)) for p in range(n)]
            self.pulled, self.dry, self.reserve_taken = 0, False, 0

        def next(self):
            if self.pulled == len(self.items):
                return None
            self.pulled += 1
            return self.items[self.pulled - 1]

    lay = _layout(4)
    shared = Shared(protocol="p", window=4, mode="pad", sharding="fixed", header_len=lay.length, policy="p",
                    cost="c", loss_basis="label_tokens", shift_labels=False, order="own")
    return RankCore(rank=0, world_size=1, mode=0, policy=default_policy(), cost=make_cost_model("padded", 64),
                    replica=Replicated(shared, world_size=1, aheads=(0,), policy=default_policy(), order=None,
                                       epoch=0),
                    layout=lay, source=Listed(), oversize="alone", loss_slot=1, stats=LoaderStats(),
                    template=lambda _fallback: None, traced=traced)


def test_an_untraced_core_posts_and_releases_what_a_traced_one_does_and_builds_no_trace():
    """``traced=False`` (no trace written: a simulation, a loader without ``trace_dir``) drops only the
    rows' trace fields; every post, release and row is the traced core's."""

    def run(c):
        seen, traces, post = [], [], None
        while not c.done:
            o = c.collect(reduce_posts([post])) if c.waiting else c.step(lambda: 0)
            post = o.post if o.post is not None else post
            seen.append((o.step.row if o.step else None, o.post,
                         [list(b.positions) for b in o.release if not b.filler]))
            traces.append(o.trace)
        return seen, traces

    (a, ta), (b, tb) = run(_listed_core(10, traced=True)), run(_listed_core(10, traced=False))
    assert a == b and sum(len(r) for _, _, r in a) > 0
    assert any(t and "collective" in t for t in ta) and all(t is None for t in tb)


def test_advance_returns_the_post_that_step_after_step_returns_with_its_rows_record():
    """`RankCore.advance`: the post row's `Step` (state before and after, params, inputs read, payload) and every
    release are those of `step` called row by row to the post; the rows before leave the same window."""

    def run(c, fast):
        seen, post = [], None
        while not c.done:
            if c.waiting:
                o = c.collect(reduce_posts([post]))
            elif fast:
                o = c.advance(lambda: 0)
            else:
                while (o := c.step(lambda: 0)).step.effect != "post":
                    pass
            if o.post is not None:
                post = o.post
            st = o.step
            seen.append((st.row, st.before, st.after, st.params, st.inputs, st.payload, st.count, o.post,
                         [(b.positions, b.info) for b in o.release], len(c._window)))
        return seen

    # 23 samples of 3 to 69 tokens, one over the budget
    fast, slow = run(_listed_core(23, traced=False), True), run(_listed_core(23, traced=False), False)
    assert fast == slow and sum(row[0] == "post_header" for row in fast) >= 5
    assert any(row[3] for row in fast)  # the collects' choices are in their rows' records


def test_a_released_batchs_step_info_is_the_dataclass_built_as_usual():
    """`step_info` (the release's fast build) gives what ``StepInfo(...)`` gives from the same fields in the
    dataclass's order: equal, the same repr, frozen; its parameters are the dataclass's fields in that order, so a
    field added or moved cannot land in another's place; a field left out is refused."""
    import inspect

    from odb.core.info import StepInfo, step_info

    names = [f.name for f in dataclasses.fields(StepInfo)]
    assert list(inspect.signature(step_info).parameters) == names
    fields = dict(indices=(4, 9), filler=False, local_samples=2, global_samples=7, local_tokens=30, global_tokens=99,
                  local_label_tokens=20, global_label_tokens=70, loss_scale=0.5, step=3, round=1, epoch=2)
    assert list(fields) == names  # every value distinct: two fields crossed would differ
    fast, slow = step_info(**fields), StepInfo(**fields)
    assert fast == slow and repr(fast) == repr(slow) and dataclasses.asdict(fast) == fields
    assert vars(fast) == fields
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.step = 4
    with pytest.raises(TypeError):  # keywords only: a field given by position could be the wrong one
        step_info(*fields.values())
    with pytest.raises(TypeError):
        step_info(**{k: v for k, v in fields.items() if k != "epoch"})


def test_no_round_imports_a_module_after_the_first():
    """A module imported lazily inside the decision stalls that round once per process, mid-epoch (numpy 2.4's
    ``np.unique`` imported ``numpy.ma``, 12-22 ms, in the first end-game deal).  A fresh process runs 64 dealt
    ranks through the level-order end game; no round after the first imports a module."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys
        from odb.batching import deal
        from odb.batching.cost import make_cost_model
        from odb.core.sim import simulate
        from odb.settings import LoaderSettings

        calls, seen, late = [0], {}, set()
        level_order = deal.level_order
        def counted(*a, **k):
            calls[0] += 1
            return level_order(*a, **k)
        deal.level_order = counted
        def on_round(k, posts):
            if k == 1:
                seen["mods"] = set(sys.modules)
            elif k > 1:
                late.update(set(sys.modules) - seen["mods"])
        lens = [(64 + (i * 7919) % 1900,) for i in range(64 * 768)]  # the end game in round 5
        settings = LoaderSettings(token_budget=None, cost=make_cost_model("padded", 8192), buffer_size=128)
        r = simulate([[] for _ in range(64)], settings, deal=lens, on_round=on_round)
        late.update(set(sys.modules) - seen["mods"])  # the last rounds' collects ran after the last on_round
        print(calls[0], r.rounds, sorted(late))
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this tree's odb, also in a mutant's copy
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    calls, rounds, late = out.stdout.split(" ", 2)
    assert int(calls) >= 1 and int(rounds) > 2  # the end game ran through level_order
    assert late.strip() == "[]", f"modules imported after the first round: {late}"


def test_the_stats_figures_are_the_ratios_of_their_counters_and_since_is_the_difference():
    # the figures the epoch summary prints and the planner's hint reads (killed survivors of a cosmic-ray sample)
    from odb.core.info import LoaderStats

    st = LoaderStats(real_tokens=300, padded_tokens=400, budget_use_sum=1.5, budget_batches=2,
                     step_tokens_mean=90.0, step_tokens_max=120, wait_time_s=0.5, pass_time_s=2.0)
    assert st.figures() == {"padding_ratio": 0.25, "budget_use": 0.75, "token_balance": 0.75, "wait_fraction": 0.25}
    assert LoaderStats().figures() == dict.fromkeys(st.figures())  # nothing to divide by: None, not 0
    before = st.snapshot()
    st.real_tokens += 50
    st.steps += 3
    st.oversize_worst = (1.5, (99,), 7)
    d = st.since(before)
    assert (d.real_tokens, d.steps, d.padded_tokens, d.oversize_worst) == (50, 3, 0, (1.5, (99,), 7))


def test_a_pooled_abort_names_the_ranks_of_the_pool_that_stopped():
    from odb.core.placement import OwnStage, PoolStage

    lay = HeaderLayout(2, 8, 1, lanes=4)
    assert PoolStage(lay, 5, 1, filler=None).who(1) == "a rank of pool 1 (ranks 4..7)"
    assert OwnStage(HeaderLayout(2, 8, 1), 0).who(3) == "rank 3"


def test_a_layout_reads_headers_of_an_equal_layout_and_names_the_reduced_counts_it_expects():
    from odb.core.header import Gathered, Headers

    a, b = HeaderLayout(2, 8, 1), HeaderLayout(2, 8, 1)  # equal, not the same object: a simulation's cores
    rows = a.decode_all([a.encode(st=0, round=0, n=1, epoch=0, digest=(0, 0, 0), summary=(1, 2), taken=1, cost=1,
                                  dry=0, reserve=0, intake=(1,))])
    assert b.decode_all(rows) is rows
    with pytest.raises(ValueError, match="header of"):
        HeaderLayout(3, 8, 1).decode_all(Headers(a, rows.array))
    with pytest.raises(ValueError, match=r"the layout holds 24 \+ 8"):
        a.check_reduced(Gathered([], [0] * 24, [0] * 7))


def test_a_pool_whose_first_lanes_read_ahead_otherwise_is_refused():
    from odb.core.placement import check_pool

    check_pool(4, 2, "pad", "dealt", (4, 4, 2, 2))  # each pool's lanes alike
    for aheads in ((4, 2, 2, 2), (2, 2, 2, 4)):
        with pytest.raises(ConfigError, match="read ahead"):
            check_pool(4, 2, "pad", "dealt", aheads)


def test_a_cost_object_is_described_by_its_own_repr_never_by_an_address():
    class Plain:  # object's repr: an address, different on every rank
        name = "plain"

    class Own:
        name = "own"

        def __repr__(self):
            return "Own(budget=7)"
    assert "0x" not in describe_cost(Plain()) and describe_cost(Plain()) == describe_cost(Plain())
    assert describe_cost(Own()).endswith("Own(budget=7)")


def test_captured_values_are_compared_however_deeply_they_nest():
    from odb.batching import make_cost_model

    def cost(deep):
        def fn(batch):
            return len(batch) * max(s[0] for s in batch) + len(deep)
        return make_cost_model(fn, 4096)
    assert describe_cost(cost({"a": {"b": {"c": {"d": 1}}}})) != describe_cost(cost({"a": {"b": {"c": {"d": 2}}}}))
    assert describe_cost(cost({"a": {"b": {"c": {"d": 1}}}})) == describe_cost(cost({"a": {"b": {"c": {"d": 1}}}}))


def test_receipts_count_the_step_infos_taken_from_zero():
    # the pass refuses a loop that took none: a count that starts above 0 would never refuse it
    from odb.core.info import Receipts, attach_step_info, pop_step_info, step_info

    r = Receipts()
    assert r.taken == 0
    batches = [attach_step_info({"x": k}, step_info(
        indices=(k,), filler=False, local_samples=1, global_samples=2, local_tokens=5, global_tokens=9,
        local_label_tokens=5, global_label_tokens=9, loss_scale=1.0, step=k, round=0, epoch=0), r) for k in range(3)]
    for b in batches[:2]:
        pop_step_info(b)
    assert r.taken == 2


def test_a_fresh_loaders_counters_are_all_zero():
    from odb.core.info import LoaderStats

    d = LoaderStats().as_dict()
    assert all(v == 0 for v in d.values() if isinstance(v, (int, float))) and "unemitted" in d


def test_fillers_replay_the_cheapest_sample_seen_within_the_budget_else_cut_the_cheapest_over_it():
    from odb.core.types import FillerContent

    asked = []
    f = FillerContent(lambda fallback: asked.append(fallback) or "cut")
    for sample, cost in (("a", 900), ("b", 800), ("c", 850)):
        f.see(sample, cost, fits=False)
    f.build()
    assert asked == ["b"] and f.sample == "cut"
    g = FillerContent(lambda fallback: pytest.fail("a sample fits: nothing to build"))
    for sample, cost, fits in (("x", 50, True), ("y", 900, False), ("z", 30, True), ("w", 40, True)):
        g.see(sample, cost, fits)
    assert g.sample == "z"


def test_captured_sets_are_described_in_order_and_apart():
    from odb.batching import make_cost_model

    def cost(captured):
        def fn(batch):
            return len(batch) * max(s[0] for s in batch) + len(captured)
        return make_cost_model(fn, 4096)
    assert describe_cost(cost({3, 1, 2})) == describe_cost(cost({1, 2, 3}))
    assert describe_cost(cost({1, 2})) != describe_cost(cost({1, 3}))


def test_a_gather_of_the_wrong_shape_is_a_value_error_naming_it():
    import numpy as np

    lay = HeaderLayout(2, 8, 1)
    for bad in (np.zeros(lay.length, dtype=np.int64), np.zeros((1, 2, lay.length), dtype=np.int64)):
        with pytest.raises(ValueError, match="the layout holds"):
            lay.decode_all(bad)


def test_a_simulation_given_a_deal_with_fixed_sharding_says_which_it_was_given():
    from odb.batching import make_cost_model
    from odb.core.sim import simulate
    from odb.settings import LoaderSettings

    cost = make_cost_model("padded", 64)
    with pytest.raises(ConfigError, match="was given deal="):
        simulate([[], []], LoaderSettings(token_budget=None, cost=cost, sharding="fixed"), deal=[(3,)] * 8)
    with pytest.raises(ConfigError, match="was given no deal="):
        simulate([[(3,)], [(3,)]], LoaderSettings(token_budget=None, cost=cost, sharding="dealt"))


def test_a_rank_that_saw_no_sample_within_the_budget_asks_for_its_filler_while_it_runs():
    # rank 0's only samples are over the budget: its PAD fillers are what the loader's template makes of them
    from odb.batching import make_cost_model
    from odb.core.header import reduce_posts
    from odb.core.sim import _Setting
    from odb.core.types import FillerContent
    from odb.settings import LoaderSettings

    setting = _Setting(2, LoaderSettings(token_budget=None, cost=make_cost_model("padded", 64), buffer_size=4),
                       None, None)
    cores = [setting.core(0, [(100,)])[0], setting.core(1, [(5,)] * 12)[0]]
    asked = []
    cores[0].fillers = FillerContent(lambda fallback: asked.append(fallback) or {"cut": True})
    fillers = []
    while not all(c.done for c in cores):
        posts = []
        for c in cores:
            while not c.waiting and not c.done:
                o = c.step(lambda: 0)
                posts += [o.post] if o.post is not None else []
        if posts:
            for b in cores[0].collect(reduce_posts(posts)).release:
                fillers += b.samples if b.filler else []
            cores[1].collect(reduce_posts(posts))
    assert fillers and all(s == {"cut": True} for s in fillers) and asked == [None]


def test_captured_values_are_described_by_type_and_content_and_a_bad_placement_kind_is_refused():
    """Holes a cosmic-ray sample of odb/core found: the text of an object and of a dict a policy holds, and a
    placement mapping of an unknown kind."""
    from odb.core.placement import placement_of
    from odb.core.shared import _canon
    from odb.errors import ConfigError

    class Knob:
        def __repr__(self):
            return "Knob(3)"

    assert _canon(Knob()) == "test_captured_values_are_described_by_type_and_content_and_a_bad_placement_kind_is_" \
                             "refused.<locals>.Knob Knob(3)"
    assert _canon(object()) == "object"  # an address in its repr: the type only
    assert _canon({"b": 2, "a": (1,)}) == "dict['a': (1,), 'b': 2]"  # plain values as their repr
    deep = {"k": 0}
    for _ in range(8):
        deep = {"k": deep}
    assert _canon(deep) == "dict['k': " * 6 + "dict[...: ...]" + "]" * 6  # past depth 6 cut, in a dict too
    for kind in ("bogus", "auto", "Exchanged"):
        with pytest.raises(ConfigError, match="placement="):
            placement_of({"kind": kind, "pool": 1})
