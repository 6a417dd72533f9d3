"""paper_repro harness: the cluster step-time arithmetic and a 2-rank smoke run of the trainer."""

import dataclasses
import math

import pytest

from paper_repro import cluster_sim as cs
from simkit import sim_settings

EXACT = cs.StepModel(flop_per_token=10.0, flop_per_l2=1.0, peak=100.0, mfu=0.5, knee_tokens=0.0, c_fixed=1.0,
                     grad_bytes=1000.0, bw_intra=100.0, bw_inter=10.0, alpha_intra=0.5, alpha_inter=1.0,
                     overlap=0.0, gpus_per_node=2)


def test_step_model_arithmetic_on_a_tiny_case():
    # batch [2, 3] pads to 2 x 3 = 6 tokens; attention 2 * 3^2 = 18; eff = 0.5 * 100 = 50 FLOP/s
    assert EXACT.compute([2, 3]) == pytest.approx(1.0 + (10 * 6 + 18) / 50)
    assert EXACT.compute([]) == 0.0
    assert EXACT.allreduce(1) == 0.0
    assert EXACT.allreduce(2) == pytest.approx(2 * 1 / 2 * 1000 / 100 + 2 * 0.5)  # intra-node ring
    assert EXACT.allreduce(4) == pytest.approx(2 * 3 / 4 * 1000 / 10 + 6 * 1.0)   # crosses nodes
    # a step waits for the slowest rank, then the (unhidden) all-reduce
    assert EXACT.step([[2, 3], [1]], 2) == pytest.approx(EXACT.compute([2, 3]) + EXACT.allreduce(2))


def test_a_packed_batch_runs_its_tokens_and_their_squares_without_padding():
    # packed [2, 3]: 5 tokens, attention 4 + 9 = 13 (padded: 6 and 18, above)
    assert EXACT.compute([2, 3], "packed") == pytest.approx(1.0 + (10 * 5 + 13) / 50)
    assert EXACT.compute([3, 3], "packed") == EXACT.compute([3, 3])  # equal lengths: nothing to pad
    with pytest.raises(ValueError):
        EXACT.compute([1], "ragged")
    plan = [[[2, 3], [1]]]
    assert cs.simulate(plan, 2, EXACT, collate="packed")["pad_frac"] == 0.0
    assert cs.simulate(plan, 2, EXACT, collate="packed")["seconds"] < cs.simulate(plan, 2, EXACT)["seconds"]


def test_simulate_counts_samples_fillers_and_stragglers():
    plan = [[[2, 3], [1]], [[4], ("filler", 2)]]
    r = cs.simulate(plan, 2, EXACT)
    assert r["samples"] == 4 and r["steps"] == 2
    assert r["seconds"] == pytest.approx(EXACT.step([[2, 3], [1]], 2) + EXACT.step([[4], [2]], 2))
    # padded: 6 + 1 + 4 + 2 (filler) = 13; real: 5 + 1 + 4 = 10
    assert r["pad_frac"] == pytest.approx(1 - 10 / 13)
    e1 = (EXACT.compute([2, 3]) + EXACT.compute([1])) / 2 / EXACT.compute([2, 3])
    e2 = (EXACT.compute([4]) + EXACT.compute([2])) / 2 / EXACT.compute([4])
    assert r["straggler_eff"] == pytest.approx((e1 + e2) / 2)
    with_rounds = cs.simulate(plan, 2, EXACT, num_rounds=3, header_bytes=100)
    assert with_rounds["seconds"] - r["seconds"] == pytest.approx(3 * EXACT.allgather(2, 100))
    timed = cs.simulate(plan, 2, EXACT, num_rounds=3, header_bytes=100, round_s=0.25)
    assert timed["seconds"] - r["seconds"] == pytest.approx(0.75)  # a given round cost replaces the gather
    # balanced: every step as long as its mean rank
    mean1 = (EXACT.compute([2, 3]) + EXACT.compute([1])) / 2
    mean2 = (EXACT.compute([4]) + EXACT.compute([2])) / 2
    assert r["balanced_seconds"] == pytest.approx(mean1 + mean2 + 2 * EXACT.allreduce(2))
    # two micro-batches per optimizer step: one wait for the larger per-rank sum, one all-reduce
    acc = cs.simulate(plan, 2, EXACT, accum=2)
    s0, s1 = EXACT.compute([2, 3]) + EXACT.compute([4]), EXACT.compute([1]) + EXACT.compute([2])
    assert acc["seconds"] == pytest.approx(max(s0, s1) + EXACT.allreduce(2))
    assert acc["straggler_eff"] == pytest.approx((s0 + s1) / 2 / max(s0, s1))
    with pytest.raises(ValueError):
        cs.simulate(plan, 2, EXACT, accum=0)


def test_protocol_cost_counts_the_runtime_header_and_the_release_gather():
    from odb.batching import default_policy
    from odb.core.header import header_layout

    for w in (64, 1024):
        h = header_layout(default_policy().summary_len, w).length
        p = cs.protocol_cost(64, w, h)
        lad = {64: 12, 1024: 20}[w]  # len(intake_ladder(w)): 1, 2, 3, 4, 6, 8, 12, ... w
        # the header the engine posts: st, round, n, epoch, 3 digest ints, summary, 4 deal ints, ladder
        assert h == 11 + default_policy().summary_len + lad
        assert p["release_bytes"] == 64 * (2 + 2 * w) * 8
        if w == 64:  # 64 x (h + 3W) ints fit 1 MiB: the runtime all-gathers header and counts
            assert p["odb_bytes"] == 64 * (h + 3 * w) * 8
            assert p["odb_latency_s"] == pytest.approx(cs.H20_2B.allgather(64, 8 * (h + 3 * w)))
        else:  # past it: N slots with the 3W counts summed, then W tokens max; 2 (N-1)/N of each received
            assert p["odb_bytes"] == pytest.approx(2 * 63 / 64 * (64 * h + 4 * w) * 8)
            assert p["odb_latency_s"] == pytest.approx(cs.H20_2B.allreduce(64, 8 * (64 * h + 3 * w))
                                                       + cs.H20_2B.allreduce(64, 8 * w))
    # the counts' share does not grow with N (the headers' does)
    def counts_share(n):
        return cs.protocol_cost(n, 1024, h)["odb_bytes"] - 2 * (n - 1) / n * n * h * 8

    assert counts_share(1024) == pytest.approx(counts_share(64), rel=0.02)


def test_standard_plan_deals_every_sample_once_with_equal_steps():
    plan = cs.standard_plan(list(range(1, 21)), 4, batch_size=2, seed=1)
    assert len(plan) == 2  # 20 // (4 * 2) * 2 = 4 samples per rank = 2 steps of 2; the tail of 4 is dropped
    got = sorted(x for st in plan for b in st for x in b)
    assert len(got) == 16 and len(set(got)) == 16 and set(got) <= set(range(1, 21))


@pytest.mark.slow  # two torchrun ranks (~15 s): the real harness end to end on a tiny config
def test_harness_smoke_run_two_ranks_every_method_emits_every_sample_in_every_round(tmp_path):
    from paper_repro import repro_stats as st
    from paper_repro.repro import _base, job_spec, merge_jobs, run_spec

    methods = ["odb_pad", "odb_join", "gmt", "standard1", "standard1_noacc"]
    spec = _base(name="smoke", kind="text", num_train=16, num_val=8, cutoff=64, budget=128, epochs=1, window=8,
                 net={"dim": 16, "layers": 1, "heads": 2}, length_scale=1.0, timeout_s=30, repeats=2,
                 warmup_steps=2, methods=methods, max_load_cores=-1.0, retries=1, retry_budget_s=1e-6)
    # max_load_cores < 0: every run counts as loaded, so the first one is rerun and the budget then stops reruns
    res = run_spec(spec, str(tmp_path), timeout_s=150)
    assert res["world_size"] == 2
    # interleaved and rotated: round 1 starts with round 0's second method
    assert res["rounds"] == [methods, methods[1:] + methods[:1]]
    for m in methods:
        recs = res["methods"][m]["repeats"]
        assert [r["round"] for r in recs] == [0, 1], m
        for r in recs:
            assert r["exactly_once"] and r["index_errors"] == 0, (m, r["index_errors"])
            assert r["samples"] == r["expected_samples"] == 16, (m, r["samples"])
            assert all(math.isfinite(v) for _, v in r["val_loss"])
            assert r["samples_per_s"] > 0 and r["padded_tokens"] >= r["real_tokens"] > 0
            assert r["wall_s"] >= r["first_batch_all_s"] >= r["first_batch_s"] > 0
            assert len(r["cpu"]) == 2 and all(c["main_cpu_s"] > 0 and c["loader_cpu_s"] >= 0 for c in r["cpu"])
        # a repeat is the same training: same batches, steps and losses; only the clock differs
        assert st.identical(recs[0], recs[1]), m
        assert "curve" in recs[0] and "curve" not in recs[1]
    assert res["methods"]["gmt"]["repeats"][0]["setup_s"] > 0  # the length cache pass is timed
    kept = [r for m in methods for r in res["methods"][m]["repeats"]]
    assert (len(kept[0]["attempts"]) == 1 and sum(len(r["attempts"]) for r in kept) == 1
            and all(r["loaded"] for r in kept))
    # Standard's accumulation is matched to ODB pad's mean samples per optimizer step, measured first
    ms = {m: res["methods"][m]["repeats"][0] for m in methods}
    want = max(1, round(ms["odb_pad"]["samples"] / ms["odb_pad"]["steps"] / 2))
    assert ms["standard1"]["accum"] == want and ms["standard1_noacc"]["accum"] == 1
    assert ms["standard1"]["micro_steps"] == ms["standard1_noacc"]["steps"] == 8  # 16 samples, batch 1, 2 ranks
    assert ms["standard1"]["steps"] == -(-8 // want)  # the epoch's last group may be shorter
    # the same init and the same data: every method starts from the same validation loss
    assert len({round(ms[m]["val_loss"][0][1], 6) for m in methods}) == 1
    # make repro's next job: round 2 alone, rotated as round 2, Standard's accumulation handed on from round 0
    res2 = run_spec(job_spec(spec, 2, {"standard1": want, "standard1_noacc": 1}), str(tmp_path), timeout_s=150)
    assert res2["rounds"] == [methods[2:] + methods[:2]] and res2["first_round"] == 2
    for m in methods:
        (rec,) = res2["methods"][m]["repeats"]
        assert rec["round"] == 2 and "curve" not in rec
        assert st.identical(ms[m], rec), m  # another process, the same training
    assert res2["methods"]["standard1"]["repeats"][0]["accum"] == want
    run = merge_jobs(spec, [res, res2])
    assert run["jobs"] == 2 and len(run["rounds"]) == 3
    assert all([r["round"] for r in run["methods"][m]["repeats"]] == [0, 1, 2] for m in methods)
    with pytest.raises(ValueError, match="contiguous"):
        merge_jobs(spec, [res2, res])


def test_accumulation_is_matched_to_the_reference_method_and_refuses_a_wrong_order():
    from paper_repro.sources import MethodUnavailable
    from paper_repro.train import accum_for

    spec = {"methods": ["odb_pad", "standard1", "standardB"], "accum_match": "odb_pad",
            "accum_methods": ["standard1", "standardB"], "budget": 1024, "cutoff": 256, "kind": "text"}
    done = {"odb_pad": {"samples": 300, "steps": 10}}  # 30 global samples per optimizer step
    assert accum_for("standard1", spec, done, world_size=2) == 15
    assert accum_for("standardB", spec, done, world_size=2) == 4  # batch 1024 // 256 = 4 per rank: 30 / 8
    assert accum_for("gmt", spec, done, world_size=2) == 1  # not an accumulating method
    assert accum_for("standard1", spec, {"odb_pad": {"samples": 3, "steps": 10}}, world_size=2) == 1  # never 0
    with pytest.raises(ValueError, match="has not run"):
        accum_for("standard1", spec, {}, world_size=2)
    with pytest.raises(MethodUnavailable, match="unavailable"):
        accum_for("standard1", spec, {"odb_pad": {"unavailable": "no odb"}}, world_size=2)


def test_ordering_verdict_separates_pass_tie_and_misorder():
    from paper_repro.report import _ordering

    def rows(*gs):
        return [{"odb_pad_vs_standard": g, "odb_pad_vs_standard_sd": sd} for g, sd in gs]

    assert _ordering(rows((2.0, 0.05), (2.2, 0.05), (2.5, 0.1)))[1] == "PASS"
    assert _ordering(rows((2.0, 0.05), (2.02, 0.05), (2.5, 0.1)))[1].startswith("MISS (tie")
    assert _ordering(rows((2.0, 0.01), (1.9, 0.01), (2.5, 0.1)))[1] == "MISS (misordered)"


def test_cluster_seeds_average_and_equal_mean_control_keeps_the_cv():
    from paper_repro import cluster_runs as cr

    one = [cr.run_one("ultrachat", 2, 16, 16, 12288, seed=s) for s in range(2)]
    two = cr.run_seeds("ultrachat", 2, 16, 16, 12288, seeds=2)
    assert two["odb_pad_vs_standard"] == pytest.approx(
        (one[0]["odb_pad_vs_standard"] + one[1]["odb_pad_vs_standard"]) / 2)
    assert two["odb_pad_vs_standard_all"] == [r["odb_pad_vs_standard"] for r in one]
    ctl = cr.run_one("ultrachat", 2, 16, 16, 12288, seed=0, mean=500.0)
    assert ctl["cv"] == pytest.approx(one[0]["cv"], abs=0.01)  # rescaling keeps the CV (rounding aside)
    assert ctl["standard"]["samples"] == one[0]["standard"]["samples"] == 32


def test_a_scale_point_scores_every_method_on_the_same_samples_and_its_targets_name_the_ceiling(tmp_path):
    from paper_repro import scale_grid as sg

    r = sg.run_point("sharegpt4o", 4, 16, 4096, "packed", 64)
    assert set(r["methods"]) == set(sg.METHODS) and r["samples"] == 256
    gmt, odb = r["methods"]["gmt"], r["methods"]["odb_dealt"]
    assert gmt["throughput_vs_gmt"] == 1.0 and gmt["steps_vs_gmt"] == 1.0
    assert odb["rounds"] > 0 and odb["predicted"]["samples_per_s"] > 0
    assert gmt["accum_throughput_vs_gmt"] == 1.0 and odb["predicted_accum"]["samples_per_s"] > 0
    assert odb["variable_throughput_vs_gmt"] > 0 and "predicted_variable" not in gmt  # ODB's prototype only
    for m in r["methods"].values():  # balancing a schedule's steps can only make it faster
        assert m["predicted"]["balanced_samples_per_s"] >= m["predicted"]["samples_per_s"] * (1 - 1e-9)
        assert m["straggler_eff"] <= m["straggler_ceiling"] + 1e-9
    res = {"rows": [r], "targets": {**sg.TARGETS, "min_world": 2, "min_window": 16}}
    met = sg.target_lines({**res, "targets": {**res["targets"], "straggler_eff": 0.0, "steps_vs_gmt": 99.0,
                                              "throughput_vs_gmt": 0.0}})
    assert all(line.split(": ", 2)[2].startswith("MET") for line in met[:3])
    missed = sg.target_lines({**res, "targets": {**res["targets"], "straggler_eff": 1.01, "steps_vs_gmt": 0.5,
                                                 "throughput_vs_gmt": 2.0}})
    assert "MISSED at 1/1" in missed[0] and "straggler ceiling" in missed[0]
    assert "MISSED at 1/1" in missed[1] and "lower bound" in missed[1]
    assert "MISSED at 1/1" in missed[2] and "mean rank" in missed[2]
    assert sg.target_lines({"rows": [r], "targets": sg.TARGETS}) == ["- no point at N >= 64 and W >= 256 in this grid"]
    grid = {"grid": {**sg.GRID_QUICK, "per_rank": 64}, "rows": [r], "targets": sg.TARGETS, "seconds": 1.0}
    paths = sg.write(grid, str(tmp_path))
    md = open(paths[1]).read()
    assert "| Megatron DP-balanced | no | yes |" in md and "| HF rebalance | yes | no |" in md
    assert not any(p.endswith(".png") for p in paths)  # the plot shows the padded points: none here
    paths = sg.write({**grid, "rows": [{**r, "cost": "padded"}]}, str(tmp_path))
    assert any(p.endswith(".png") for p in paths)  # the plot against N, per method


def test_the_grids_pooled_odb_is_the_shipped_pool_and_its_targets_are_checked_beside_the_default():
    from odb.core.sim import simulate
    from paper_repro import scale_grid as sg
    from paper_repro.bench_grid import point

    r = sg.run_point("mmmix", 16, 8, 4096, "padded", 32, pooled=True)
    pooled = r["methods"][sg.POOLED]
    assert pooled["predicted"]["samples_per_s"] > 0 and pooled["rounds"] > 0
    pt = point("mmmix", 16, 4096, "padded", 32)  # the same figures as the shipped simulation's own batches
    sim = simulate([[] for _ in range(16)], sim_settings(pt.cost, 8, mode="pad", pool=sg.HOST), deal=pt.sizes)
    assert pooled["steps"] == len(sim.batches[0]) and pooled["rounds"] == sim.rounds
    assert sg.POOLED not in sg.run_point("mmmix", 8, 8, 4096, "padded", 32, pooled=True)["methods"]  # one host
    assert 0 <= r["methods"][sg.EXCHANGE]["moved_batches"] <= 1  # the exchange prototype runs beside it
    lines = sg.target_lines({"rows": [r], "targets": {**sg.TARGETS, "min_world": 2, "min_window": 8}})
    assert not set(sg.EXCHANGES) & set(r["methods"])  # the exchange's rows are their own run (`exchange_point`)
    # each target, each configuration run here, and the two compared
    for key in (k for k in sg.ODBS if k not in sg.EXCHANGES):
        assert sum(line.startswith(f"- {sg.LABELS[key]}: ") for line in lines) == 3
        assert sum(line.startswith(f"- {sg.LABELS[key]} must beat") for line in lines) == len(sg.BEATS)
    assert any(line.startswith(f"- {sg.LABELS[sg.POOLED]} against ODB dealt") for line in lines)


def test_the_exchange_prototype_re_deals_a_rounds_batches_by_fill_moving_a_batch_only_when_its_rank_is_taken():
    from odb.batching import make_cost_model
    from paper_repro import scale_grid as sg

    sizes, cost = [(90,), (80,), (40,), (30,), (60,), (50,)], make_cost_model("padded", 100)
    rows = [[[0], [1], [4]], [[2], [3], None]]  # round 1: steps 0-1; round 2: step 2 (one batch and a filler)
    out, moved = sg.exchange_schedule(rows, sizes, cost, [2, 1])
    # round 1 in decreasing fill: 0 (rank 0), 1 (rank 0: taken in step 0, moves to rank 1), 2 (rank 1), 3 (moves)
    assert out == [[[0], [3], [4]], [[1], [2], None]]
    assert moved["moved_batches"] == pytest.approx(2 / 5) and moved["moved_tokens"] == pytest.approx(110 / 300)
    assert moved["header_ints_max"] == 2 * 2
    assert sg.exchange_schedule(rows, sizes, cost, [1, 1, 1])[0] == rows  # one step per round: nothing to re-deal


def test_the_exchange_prototype_orders_packed_batches_by_their_attention_aware_fill():
    from odb.batching import default_policy, make_cost_model
    from odb.batching.grouping import Group
    from odb.batching.policy import aligned_fill
    from paper_repro import scale_grid as sg

    # packed: [0] holds one 6,000-token sample, [1, 2] two of 3,000 - the same tokens (plain fills tie, and a tie
    # keeps the step order), but the fill weighs L (1 + a L), so [0] is the fuller batch and runs first
    sizes, cost = [(6000,), (3000,), (3000,), (100,)], make_cost_model("packed", 8192)
    rows = [[[1, 2], [0], [3]]]
    out, moved = sg.exchange_schedule(rows, sizes, cost, [3])
    fills = [aligned_fill([Group(tuple(b), True, cost.utilisation([sizes[i] for i in b]))], sizes, cost,
                          default_policy().attention)[0].fill for b in ([0], [1, 2], [3])]
    assert fills[0] > fills[1] > fills[2]  # what the order reads, on the epoch's window as the policy sees it
    assert out == [[[0], [1, 2], [3]]] and moved["moved_batches"] == 0  # steps change, ranks do not


def test_variable_counts_end_a_step_once_every_rank_ran_its_share_of_compute():
    unit = cs.StepModel(flop_per_token=1.0, flop_per_l2=0.0, peak=1.0, mfu=1.0, knee_tokens=0.0, c_fixed=0.0,
                        grad_bytes=0.0, alpha_intra=0.0, alpha_inter=0.0, overlap=0.0)  # compute([L]) = L
    plan = [[[4], [1]], [[4], [1]], [[1], ("filler", 9)], [[1], [4]], [[], [4]]]
    # fixed counts, 2 per step: rank sums (8, 2), then (2, 13) with the filler, then (0, 4)
    assert cs.simulate(plan, 2, unit, accum=2)["seconds"] == pytest.approx(8 + 13 + 4)
    v = cs.simulate_variable(plan, 2, unit, accum=2)
    # mean batch 2.5 (fillers dropped), a share of 5, each rank's next batch taken while it brings the sum
    # nearer: rank 0 runs 4 | 4+1 | 1, rank 1 runs 1+1+4 | 4
    assert v["steps"] == 3 and v["samples"] == 8 and v["seconds"] == pytest.approx(6 + 5 + 1)
    assert v["straggler_eff"] == pytest.approx((5 / 6 + 4.5 / 5 + 0.5 / 1) / 3)
    assert cs.simulate_variable(plan, 2, unit, accum=2, num_rounds=3, round_s=0.5)["seconds"] == pytest.approx(13.5)


def test_the_repro_budget_is_checked_not_only_printed():
    import json
    import os

    from paper_repro import report
    from paper_repro.report import budget_lines
    from paper_repro.repro import BUDGET
    quick = budget_lines(BUDGET, BUDGET["repro_s"] + 1, [1.0, 9.0, 2.0], [4], full=False)
    assert quick[0].endswith("MISSED") and "repro_s" not in quick[1] and quick[1].endswith("MET")
    assert quick[2].endswith("MET")
    assert budget_lines(BUDGET, BUDGET["repro_s"], [1.0], [4], full=False)[0].endswith("MET")
    full = budget_lines(BUDGET, 10 * BUDGET["repro_s"], [BUDGET["repeat_loop_s"] + 1.0], [2], full=True)
    assert len(full) == 2 and full[0].endswith("MISSED") and full[1].endswith("MISSED")
    raw = json.load(open(os.path.join(os.path.dirname(__file__), "..", "paper_repro", "results", "repro_raw.json")))
    loops = report.loop_seconds(raw["runs"])  # the committed run's loops: one per method and round
    assert len(loops) == sum(len(r["methods"]) * r["spec"]["repeats"] for r in raw["runs"]) and min(loops) > 0


def test_the_full_grid_runs_the_default_window_at_scale_with_realistic_epochs():
    from odb.settings import LoaderSettings
    from paper_repro import scale_grid as sg
    wide = [p for p in sg.points(True) if p[2] != sg.GRID_FULL["window"]]
    assert {p[2] for p in wide} == {LoaderSettings(token_budget=8192).buffer_size}  # the loader's default window
    assert {(p[1], p[4]) for p in wide} == {(64, "padded"), (256, "padded")} and len(wide) == 2 * len(sg.DISTS)
    assert all(p[5] >= 8 * p[2] and p[6] for p in wide)  # 8 W samples per rank, the prototypes beside
    assert sg.at_window(("release", 8, 256, 8192, "padded", 10000, False), 1024)[5] == 10000
    assert not [p for p in sg.points(False) if p[2] != sg.GRID_QUICK["window"]]


def test_either_grid_serializes_as_run_grid_hands_it_to_the_writer():
    # the full grid nests a dict (the default window's points): `make repro-full` once computed every point and
    # then failed to build its result
    import json

    from paper_repro import scale_grid as sg
    for full in (False, True):
        res = sg.run_grid(full, workers=1, progress=False, pts=[])
        g = json.loads(json.dumps(res))["grid"]
        assert g["costs"]["padded"] == list((sg.GRID_FULL if full else sg.GRID_QUICK)["costs"]["padded"])
        if full:
            assert g["wide"] == {"window": 1024, "costs": {"padded": [64, 256]}}


def test_the_epoch_end_report_splits_the_lost_balance_that_the_metrics_see():
    from odb.core.sim import simulate
    from paper_repro.bench_grid import point
    from paper_repro.bench_metrics import metrics
    from paper_repro.epoch_end import epoch_end

    r = epoch_end("sharegpt4o", 4, 64, 256)
    pt = point("sharegpt4o", 4, 8192, "padded", 256)
    settings = dataclasses.replace(sim_settings(pt.cost, 64, mode="pad"), first_window=None)  # as epoch_end runs it
    sim = simulate([[] for _ in range(4)], settings, deal=pt.sizes)
    m = metrics(sim.batches, pt.sizes, pt.cost)
    assert r["steps"] == m["steps"] and r["rounds"] == sim.rounds
    per_step = []  # max - mean rank cost, step by step, computed here apart from the metrics
    for s in range(m["steps"]):
        c = [pt.cost.utilisation([pt.sizes[i] for i in row[s]]) if s < len(row) and row[s] else 0.0
             for row in sim.batches]
        per_step.append(max(c) - sum(c) / 4)
    assert abs(r["lost"] - sum(per_step)) < 1e-9 and abs(r["lost_at_end"] - sum(per_step[r["end_step"]:])) < 1e-9
    # the end: a round that is not the first, and not after the last batch; some balance is lost there
    assert 0 < r["end_round"] < r["rounds"] and 0 < r["end_step"] < r["steps"]
    assert 0 < r["lost_at_end"] < r["lost"]
