"""`odb plan` (issue 53): it runs the loader's own rank core, so given the whole dataset's lengths its figures are a
real run's, batch for batch; given a sample they are estimates within the tolerances the docs state; its
recommendation is runnable as it is printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import odb
from mp_harness import Samples, id_collate, run_ranks
from odb.core.placement import DEFAULT_EXCHANGE
from odb.plan import measure, plan, read_lengths
from odb.plan.metrics import schedule_metrics

_rng = np.random.default_rng(53)
LENGTHS = [int(x) for x in np.clip(np.round(_rng.lognormal(np.log(30), 0.9, 600)), 2, 400)]  # a long tail, CV ~1


def _loader_rows(rank, world_size):
    out = []
    for extra in ({}, {"placement": None}):  # the default ("auto": the exchange on 3 ranks), then none
        loader = odb.ODBDataLoader(Samples(LENGTHS), 256, id_collate, buffer_size=64, timeout_s=60, **extra)
        out.append([list(odb.pop_step_info(b).indices) or None for b in loader])
        loader.close()
    return out


@pytest.mark.slow  # 3 gloo ranks
def test_given_every_length_the_plan_is_the_loaders_own_run_on_gloo_ranks(tmp_path):
    res = run_ranks(_loader_rows, 3, tmp_path, timeout_s=90)
    assert all(r.status == "ok" for r in res), [r.error for r in res]
    from odb.batching import make_cost_model

    cost = make_cost_model("padded", 256)
    preds = plan(LENGTHS, world_size=3, budgets=[256], windows=[64]).predictions
    default = [p for p in preds if p.candidate.settings()["placement"] == DEFAULT_EXCHANGE.as_dict()]
    none = [p for p in preds if p.candidate.settings()["placement"] is None]
    assert len(default) == len(none) == 1
    for k, p in enumerate((default[0], none[0])):
        real = schedule_metrics([r.value[k] for r in res], [(n,) for n in LENGTHS], cost)
        assert (p.steps, p.padding, p.straggler_efficiency) == (real["steps"], real["padding"], real["straggler_eff"])
    assert default[0].straggler_efficiency > none[0].straggler_efficiency  # what the default's exchange buys here


def test_from_a_sample_of_a_quarter_of_the_lengths_the_estimates_are_within_the_stated_tolerance():
    big = [int(x) for x in np.clip(np.round(np.random.default_rng(7).lognormal(np.log(300), 1.0, 16_000)), 8, 4096)]
    full = plan(big, world_size=8, budgets=[8192], windows=[256, 1024])
    sample = list(np.random.default_rng(8).choice(big, 4000, replace=False))
    est = plan(sample, world_size=8, budgets=[8192], windows=[256, 1024], num_samples=len(big))
    for f, e in zip(full.predictions, est.predictions):
        assert abs(e.steps / f.steps - 1) <= 0.05, (e.steps, f.steps)
        assert abs(e.padding - f.padding) <= 0.02 and abs(e.straggler_efficiency - f.straggler_efficiency) <= 0.03
        assert abs(e.throughput_vs_gmt - f.throughput_vs_gmt) <= 0.03


def test_the_command_line_prints_json_whose_recommendation_a_loader_takes(tmp_path):
    path = tmp_path / "lengths.npy"
    np.save(path, np.asarray(LENGTHS))
    out = subprocess.run([sys.executable, "-m", "odb", "plan", str(path), "--world-size", "4", "--budget", "256",
                          "--budget", "512", "--window", "32", "--window", "128", "--json"], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)["recommended"]
    assert set(rec["predicted"]) >= {"steps", "straggler_efficiency", "padding", "throughput_vs_gmt"}
    assert rec["why"] and rec["settings"]["token_budget"] in (256, 512)
    odb.ODBDataLoader(Samples(LENGTHS), collate_fn=id_collate, **rec["settings"]).close()
    text = subprocess.run([sys.executable, "-m", "odb", "plan", str(path), "--world-size", "4", "--budget", "256",
                           "--window", "32"], capture_output=True, text=True, timeout=120).stdout
    line = next(x for x in text.splitlines() if x.startswith("Recommended: "))
    want = plan(LENGTHS, world_size=4, budgets=[256], windows=[32]).recommended.candidate.placement()
    # every setting is printed, the placement always (the default's resolution depends on the world size)
    assert line == "Recommended: ODBDataLoader(dataset, token_budget=256, buffer_size=32, placement=" + (
        f"{'None' if want is None else 'odb.' + repr(want)})"), line
    loader = eval(line.removeprefix("Recommended: "), {"ODBDataLoader": odb.ODBDataLoader, "odb": odb,
                                                       "dataset": Samples(LENGTHS)})  # runnable as printed
    assert loader.settings.placement == want
    loader.close()
    assert "straggler: mean/max rank batch cost per step" in text  # the columns, explained under the table


def test_lengths_are_read_from_every_format_and_a_missing_column_is_named(tmp_path):
    want = [5, 17, 3]
    np.save(tmp_path / "a.npy", np.asarray(want))
    (tmp_path / "a.txt").write_text("5\n17 3\n")
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"input_ids": [1] * n}) + "\n" for n in want))
    for name, col in (("a.npy", None), ("a.txt", None), ("a.jsonl", "input_ids")):
        assert read_lengths(str(tmp_path / name), col).tolist() == want
    with pytest.raises(odb.ConfigError, match="needs --column"):
        read_lengths(str(tmp_path / "a.jsonl"))
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in want]})
    ds.to_parquet(str(tmp_path / "a.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    assert read_lengths(str(tmp_path / "a.parquet"), "input_ids").tolist() == want
    assert read_lengths(str(tmp_path / "saved"), "input_ids").tolist() == want


def test_measure_reads_lengths_as_the_loader_does_and_times_preprocessing():
    lengths, seconds = measure(Samples(LENGTHS), num=50)
    assert len(lengths) == 50 and set(lengths) <= set(LENGTHS) and seconds >= 0


def test_with_several_ranks_per_host_it_weighs_pooling_and_the_exchange_and_says_why():
    r = plan(LENGTHS * 8, world_size=8, ranks_per_host=4, budgets=[256], windows=[32, 256])
    kinds = {(p.candidate.pool_size, p.candidate.exchange) for p in r.predictions}
    assert kinds == {(1, False), (1, True), (4, False), (4, True)}  # (1, True): the default, "auto", on 8 ranks
    assert any(p.moved_share > 0 for p in r.predictions if p.candidate.exchange)
    c = r.recommended.candidate
    assert r.why[0].startswith("token_budget=256") and any(f"buffer_size={c.buffer_size}" in w for w in r.why)
    meets = [p.candidate for p in r.predictions if not p.misses]
    assert meets, "no candidate meets the targets here"
    assert not r.recommended.misses  # one meets them: the recommendation is one that does, the least memory first
    assert c.buffer_size * c.pool_size == min(m.buffer_size * m.pool_size for m in meets)
    assert any(w.startswith("placement=") for w in r.why)  # the placement's choice has its reason
    with pytest.raises(odb.ConfigError, match="at least one length"):
        plan([], world_size=2)


def _hinted(rank, world_size):
    import logging

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    log = logging.getLogger("odb")
    log.setLevel(logging.INFO)
    log.addHandler(Keep())
    loader = odb.ODBDataLoader(Samples(LENGTHS), 256, id_collate, buffer_size=8, timeout_s=60, placement=None)
    for _ in range(2):
        for b in loader:
            odb.pop_step_info(b)
    loader.close()
    return [m for m in seen if "`odb plan`" in m]


@pytest.mark.slow  # 2 gloo ranks
def test_an_epoch_that_misses_the_balance_target_says_once_what_a_larger_window_would_buy(tmp_path):
    res = run_ranks(_hinted, 2, tmp_path, timeout_s=90)
    assert all(r.status == "ok" for r in res), [r.error for r in res]
    (hint,), others = res[0].value, res[1].value
    assert not others  # rank 0 only, once per loader
    assert "buffer_size=8 (now): token balance" in hint and "buffer_size=16:" in hint and "buffer_size=32:" in hint
    # run without it
    assert "placement='auto' (the default: the round exchange) at buffer_size=8: token balance" in hint


def _hint_loader(world_size, buffer_size, cost="padded", placement=None):
    from types import SimpleNamespace

    settings = SimpleNamespace(cost=cost, token_budget=256, buffer_size=buffer_size, seed=0, placement=placement)
    return SimpleNamespace(settings=settings, world_size=world_size)


def test_the_hint_simulates_only_below_its_sample_limit_and_otherwise_names_the_command_to_run():
    from odb.runtime.observe import HINT_SAMPLES, plan_hint

    lengths = [(7 * k) % 200 + 1 for k in range(300)]
    hint = plan_hint(_hint_loader(2, 8), lengths, 0.9)  # an epoch of 2 ranks x 300 samples: simulated
    assert "drawn for all 2 ranks, predicts: buffer_size=8 (now): token balance" in hint and "buffer_size=32:" in hint
    # the simulated epoch holds world_size x this rank's samples: one rank more than the limit allows, and the hint
    # does not simulate but says which command would
    w = 64
    n = HINT_SAMPLES // len(lengths) + 1
    assert (n - 1) * len(lengths) <= HINT_SAMPLES < n * len(lengths)
    big = plan_hint(_hint_loader(n, w), lengths, 0.9)
    assert "predicts" not in big and f"--world-size {n} to see what buffer_size={2 * w} or pooling" in big
    # its figures are the planner's own token balance for the same epoch, window by window
    rep = plan(lengths, world_size=2, budgets=[256], windows=[8, 16, 32], seed=0, num_samples=600)
    for p in rep.predictions:
        if p.candidate.placement() is None:
            now = " (now)" if p.candidate.buffer_size == 8 else ""
            assert f"buffer_size={p.candidate.buffer_size}{now}: token balance {p.token_balance:.3f}," in hint
    assert len({f"{p.token_balance:.3f}" for p in rep.predictions} | {f"{p.straggler_efficiency:.3f}"
                                                                        for p in rep.predictions}) > 3
    # a window that holds the rank's whole epoch already: no larger one is proposed
    whole = plan_hint(_hint_loader(2, 512), lengths, 0.9)
    assert "already holds this rank's whole epoch (300 samples)" in whole and "buffer_size=1024" not in whole
    for cost in ("linear", None):  # a cost the planner does not model, or the user's own: no figures
        assert "predicts what another buffer_size" in plan_hint(_hint_loader(2, 8, cost), lengths, 0.9)
    assert "predicts what another buffer_size" in plan_hint(_hint_loader(2, 8), lengths[:1], 0.9)


def test_the_fit_recovers_a_step_model_of_its_form_and_the_planner_reads_it():
    from odb.plan.probe import fit
    from odb.plan.stepmodel import StepModel

    true = StepModel(c_fixed=0.02, flop_per_token=3e-6, flop_per_l2=2e-9, knee_tokens=256.0, peak=1.0, mfu=1.0)
    shapes = [(1, 64), (8, 64), (1, 512), (4, 512), (1, 2048), (2, 2048)]
    got, err = fit(shapes, [true.compute([n] * r) for r, n in shapes])
    assert err < 1e-6 and got.knee_tokens == 256.0
    for r, n in [(3, 100), (16, 256), (1, 4000)]:  # shapes it was not fitted on
        assert abs(got.compute([n] * r) / true.compute([n] * r) - 1) < 1e-6
    slow = plan(LENGTHS, world_size=2, budgets=[256], windows=[32], step_model=got)
    fast = plan(LENGTHS, world_size=2, budgets=[256], windows=[32])
    assert slow.predictions[0].steps == fast.predictions[0].steps  # the batches are the same; only time differs
    assert slow.predictions[0].throughput_vs_standard != fast.predictions[0].throughput_vs_standard
    with pytest.raises(odb.ConfigError, match="3 shapes or more"):
        fit(shapes[:2], [1.0, 2.0])


def test_probe_on_cpu_times_the_model_and_says_it_measured_no_memory(tmp_path):
    from odb.plan.probe import largest_budget, load_model, probe, probe_shapes

    shapes = probe_shapes(LENGTHS, [256])
    assert len(shapes) >= 3 and all(r * n <= 256 or r == 1 for r, n in shapes)
    res = probe(load_model("_probe_model:tiny_lm"), shapes, device="cpu", repeats=1)
    assert res.device == "cpu" and res.peak_bytes is None and len(res.seconds) == len(shapes)
    assert all(s > 0 for s in res.seconds) and res.model.c_fixed >= 0
    best, why = largest_budget(res, [256, 512], max(LENGTHS))
    assert best is None and "step time only" in why
    with pytest.raises(odb.ConfigError, match="module:callable"):
        load_model("no_colon_here")
    path = tmp_path / "lengths.npy"
    np.save(path, np.asarray(LENGTHS))
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-m", "odb", "plan", str(path), "--world-size", "2", "--budget", "256",
                          "--window", "32", "--probe", "_probe_model:tiny_lm", "--probe-device", "cpu", "--json"],
                         capture_output=True, text=True, timeout=180,
                         env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=tests_dir))
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["inputs"]["step_model"].startswith("fitted on cpu") and rep["inputs"]["probe"]["seconds"]
    assert any("step time only" in w for w in rep["recommended"]["why"])


@pytest.mark.adapters  # transformers
def test_probe_loads_a_saved_transformers_model_from_its_folder_without_the_network(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from odb.plan.probe import load_model, probe

    LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(tmp_path / "m")
    res = probe(load_model(str(tmp_path / "m")), [(1, 16), (4, 16), (1, 64)], device="cpu", repeats=1)
    assert len(res.seconds) == 3 and all(s > 0 for s in res.seconds)
    with pytest.raises(odb.ConfigError, match="ModuleNotFoundError"):
        load_model("no_such_module_odb:build")



def test_the_first_batchs_wait_is_the_samples_a_rank_reads_before_it_times_the_preprocessing():
    """`first_batch_s`: the simulated rank's reads before its first batch (`SimResult.first_wait`, checked against a
    real loader in tests/test_first_window.py) times one sample's preprocessing, over the workers: at most the
    first two rounds' windows (32 + 64), three with the exchange (its batches run a round later)."""
    rep = plan(LENGTHS, world_size=2, budgets=[256], windows=[64, 256], preprocess_s=0.002, num_workers=2)
    assert len(rep.predictions) == 4
    for p in rep.predictions:
        reads = p.first_batch_s / 0.002 * 2
        assert reads == pytest.approx(round(reads)) and 32 <= round(reads)
        most = 32 + 64 + (128 if p.candidate.exchange else 0)
        assert round(reads) <= min(most, 2 * p.candidate.buffer_size + p.candidate.exchange * p.candidate.buffer_size)


class _GatedSamples(Samples):
    """`Samples` that counts the pass's reads and holds every read past the first `most` until the test opens
    `gate` (after the first batch): a rank whose first batch needs more reads waits the gate out (`waited_out`)."""

    def __init__(self, lengths, patience_s):
        super().__init__(lengths)
        self.most, self.read, self.waited_out, self.patience_s = len(lengths), 0, 0, patience_s
        self.gate = __import__("threading").Event()

    def __getitem__(self, i):
        self.read += 1
        if self.read > self.most and not self.gate.wait(self.patience_s):
            self.waited_out += 1
            self.gate.set()  # one wait is enough to fail the test
        return super().__getitem__(i)


def _candidate_runs(rank, world_size, runs):
    """Each run: (placement, gate), the loader built with the candidate's placement as a user writes it, its
    pass's reads gated at `gate`: the batches, whether the first one waited out the gate, and what the rank
    measured (rounds, batches sent, the window and header it ran with)."""
    out = []
    for placement, gate in runs:
        data = _GatedSamples(LENGTHS, patience_s=3.0)
        loader = odb.ODBDataLoader(data, 256, id_collate, buffer_size=16, timeout_s=60, placement=placement)
        data.read, data.most = 0, gate  # the construction's probe of two agreed positions is not the pass's
        it = iter(loader)
        rows = [list(odb.pop_step_info(next(it)).indices) or None]
        waited = data.waited_out
        data.gate.set()
        rows += [list(odb.pop_step_info(b).indices) or None for b in it]
        out.append({"rows": rows, "waited": waited, "rounds": loader.stats.rounds, "sent": loader.stats.exchange_sent,
                    "window": loader.shared.window, "steps": loader.layout.steps, "header": loader.layout.length})
        loader.close()
    return out


@pytest.mark.slow  # 4 gloo ranks, 8 passes, 4 of them wait out a 3 s gate once
def test_every_candidate_with_pools_is_the_loaders_own_run_on_every_rank_first_batch_wait_and_cost_included(tmp_path):
    """Candidate by candidate on 4 ranks, 2 per host (no placement, the default's exchange, pools of 2, pools
    with the exchange), placements written as a user writes them: the planner's steps, padding, straggler
    efficiency, moved share, window memory and predicted throughput (the loader's own rounds and header
    charged) are the loader's run; its first batch's wait is the most any rank reads before its first batch:
    every rank gated there gets its first batch, gated a read earlier some rank waits the gate out."""
    from odb.baselines.offline import global_max_tokens
    from odb.batching import make_cost_model
    from odb.plan.stepmodel import H20_2B, odb_round_latency, predict
    from odb.runtime.source import shard_order

    slack = DEFAULT_EXCHANGE.slack
    placements = [None, odb.Exchanged(pool=1, slack=slack), odb.Pooled(2), odb.Exchanged(pool=2, slack=slack)]
    rep = plan(LENGTHS, world_size=4, ranks_per_host=2, budgets=[256], windows=[16], preprocess_s=1.0,
               num_workers=1, sample_bytes=1000.0)
    preds = {json.dumps(p.candidate.settings()["placement"]): p for p in rep.predictions}
    mine = [preds.pop(json.dumps(None if pl is None else pl.as_dict())) for pl in placements]
    assert not preds, sorted(preds)  # these four candidates, no other
    gates = [int(p.first_batch_s) for p in mine]
    assert [p.first_batch_s for p in mine] == gates
    runs = [(pl, g) for pl, g in zip(placements, gates)] + [(pl, g - 1) for pl, g in zip(placements, gates)]
    res = run_ranks(_candidate_runs, 4, tmp_path, args=(runs,), timeout_s=150)
    assert all(r.status == "ok" for r in res), [(r.status, (r.error or "")[-1500:]) for r in res]
    cost, sizes = make_cost_model("padded", 256), [(n,) for n in LENGTHS]
    filler = int(np.median(LENGTHS))

    def throughput(rows, **kw):  # the planner's step-time model on a schedule of dataset indices
        steps = max(len(r) for r in rows)
        lens = [[("filler", filler) if s < len(r) and r[s] is None else [LENGTHS[i] for i in (r[s] if s < len(r)
                                                                                              else [])]
                 for r in rows] for s in range(steps)]
        return predict(lens, 4, H20_2B, collate="pad", **kw)["samples_per_s"]
    order = shard_order(len(LENGTHS), 0, 1, True, 0, 0)  # the loader's own order (seed 0, epoch 0)
    gmt = throughput([[None if b is None else [order[i] for i in b] for b in row]
                      for row in global_max_tokens([sizes[i] for i in order], cost, 4)])
    for k, (pl, p) in enumerate(zip(placements, mine)):
        got = [r.value[k] for r in res]
        rows = [g["rows"] for g in got]
        real = schedule_metrics(rows, sizes, cost)
        assert (p.steps, p.padding, p.straggler_efficiency) == (real["steps"], real["padding"],
                                                                 real["straggler_eff"]), pl
        batches = sum(b is not None for row in rows for b in row)
        assert p.moved_share == pytest.approx(sum(g["sent"] for g in got) / batches, abs=1e-12), pl
        assert p.window_bytes == 3 * got[0]["window"] * 1000.0, pl
        (g0,) = {(g["rounds"], g["steps"], g["header"]) for g in got}
        round_s = odb_round_latency(H20_2B, 4, g0[1], g0[2])[0]
        assert p.throughput_vs_gmt * gmt == pytest.approx(throughput(rows, num_rounds=g0[0], round_s=round_s),
                                                           rel=1e-9), pl
        assert not any(g["waited"] for g in got), (pl, gates[k], [g["waited"] for g in got])
        early = [r.value[k + len(placements)]["waited"] for r in res]
        assert any(early), (pl, gates[k] - 1)


def test_the_memory_fit_puts_a_sample_longer_than_the_budget_alone_in_one_row_of_its_own_length():
    """With ``oversize="alone"`` a sample longer than the budget runs as a batch of its own: one row of its length,
    whatever the budget.  Peaks of a known memory model (``m0 + m1 T + m2 L2``) at the probed shapes, all within
    the smallest budget: the worst batch of each budget is priced at the longest sample, never fewer rows, never a
    shorter row."""
    from odb.plan.probe import ProbeResult, largest_budget, probe_shapes
    from odb.plan.stepmodel import StepModel

    longest = 3000
    shapes = probe_shapes(LENGTHS + [longest], [256, 512])
    assert all(n <= 256 and r * n <= 256 for r, n in shapes), shapes  # what the loader forms within the budget
    m0, m1, m2 = 1.0e9, 1.0e5, 50.0

    def need(rows, length):
        return m0 + m1 * rows * length + m2 * rows * length * length
    res = ProbeResult("cuda:0", shapes, [0.01] * len(shapes), [int(need(r, n)) for r, n in shapes], StepModel(),
                      0, 0.0)
    one, two = need(1, longest), need(2, longest)  # 1.75e9 and 2.5e9 bytes
    # every budget below the longest sample: each one's worst batch is that sample alone, which does not fit
    res.total_bytes = int(one / 0.9) - 2**20
    best, why = largest_budget(res, [256, 512, 1024], longest)
    assert best is None and f"at length {longest}" in why, why
    # it fits: then every budget up to two rows of it fits, and the largest of them is chosen
    res.total_bytes = int((one + two) / 2 / 0.9)
    best, why = largest_budget(res, [256, 512, 4096, 6000], longest)
    assert best == 4096 and f"(1 x {longest} tokens)" in why, why
    assert largest_budget(res, [256], longest)[0] == 256
    res.total_bytes = int(two / 0.9) + 2**20
    best, why = largest_budget(res, [256, 6000], longest)
    assert best == 6000 and f"(2 x {longest} tokens)" in why, why


# -- the user's epoch, at a user's pace (issue 64) ---------------------------------------------------------------

def test_the_plan_simulates_the_users_epoch_and_never_a_window_past_a_ranks_share_of_it():
    lines = []
    r = plan(LENGTHS, world_size=8, budgets=[256, 512], windows=[32, 64, 128], progress=lines.append)
    i = r.inputs
    assert (i["simulated_samples"], i["samples_per_rank"], i["order"]) == (600, 75, "exact")  # the data given, as is
    assert i["windows_cut"] == [128] and {p.candidate.buffer_size for p in r.predictions} == {32, 64, 75}
    assert all(p.candidate.buffer_size <= 75 for p in r.predictions)
    assert len(lines) == len(r.predictions) == 2 * 3 * 2 and all(line.startswith("odb plan: ") for line in lines)
    assert "cut to 75, a rank's epoch" in r.text()
    # a sample of the data, with the dataset's size: drawn up to that size, and said so
    drawn = plan(LENGTHS[:200], world_size=8, budgets=[256], windows=[32], num_samples=600)
    assert (drawn.inputs["simulated_samples"], drawn.inputs["order"]) == (600, "drawn")
    assert "drawn with replacement from the 200 given" in drawn.text()
    with pytest.raises(odb.ConfigError, match="fewer samples than ranks"):
        plan(LENGTHS[:4], world_size=8)


def test_a_small_epoch_is_named_and_a_large_one_is_not():
    small = plan(LENGTHS, world_size=8, budgets=[4096], windows=[64])  # 75 samples a rank: a few steps of 4096
    assert any(w.startswith("a small epoch: 75 samples a rank") for w in small.why)
    big = plan(LENGTHS, world_size=2, budgets=[128], windows=[64])  # 300 a rank at 128 tokens: many steps
    assert not any(w.startswith("a small epoch") for w in big.why)


def test_measure_and_plan_compose_as_the_guide_writes_them_and_a_report_prints_as_its_table():
    report = plan(measure(Samples(LENGTHS), num=300), world_size=2, budgets=[256], windows=[32])
    assert report.predictions[0].first_batch_s is not None  # the measured seconds became preprocess_s
    text = str(report)
    assert text == report.text() and report.table() in text and "Recommended: ODBDataLoader(dataset" in text
    assert len(text) < 3000


def test_the_recommendation_says_best_when_it_is_the_best_budget_not_the_smallest_within_5_percent():
    r = plan(LENGTHS, world_size=2, budgets=[64, 256, 1024], windows=[64])
    first = r.why[0]
    best = max(p.throughput_vs_standard for p in r.predictions)
    chosen = max(p.throughput_vs_standard for p in r.predictions
                 if p.candidate.token_budget == r.recommended.candidate.token_budget)
    if chosen == best:
        assert "the best predicted throughput" in first and "smallest budget within 5%" not in first
    else:
        assert "the smallest budget within 5% of the best" in first


def test_the_command_line_checks_plot_before_computing_and_reads_a_saved_datasets_input_ids(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in LENGTHS], "labels": [[1] * n for n in LENGTHS]})
    ds.save_to_disk(str(tmp_path / "saved"))
    assert read_lengths(str(tmp_path / "saved")).tolist() == LENGTHS  # input_ids: what the loader measures
    datasets.Dataset.from_dict({"a": [1, 2], "b": [3, 4]}).save_to_disk(str(tmp_path / "other"))
    with pytest.raises(odb.ConfigError, match=r"Pass --column, one of \['a', 'b'\]"):
        read_lengths(str(tmp_path / "other"))
    np.save(tmp_path / "l.npy", np.asarray(LENGTHS))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # matplotlib made unimportable: the error comes before any candidate is simulated
    code = ("import sys; sys.modules['matplotlib'] = None; from odb.plan.cli import main; "
            f"sys.exit(main([{str(tmp_path / 'l.npy')!r}, '--world-size', '2', '--plot', 'x.png']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "--plot needs matplotlib" in out.stderr and "odb plan: 1/" not in out.stderr
    ok = subprocess.run([sys.executable, "-m", "odb", "plan", str(tmp_path / "l.npy"), "--world-size", "2",
                         "--budget", "256", "--window", "32"], capture_output=True, text=True, timeout=120, env=env)
    assert ok.returncode == 0 and "odb plan: 1/2 token_budget=256" in ok.stderr  # progress, a line per candidate


def test_odb_help_lists_the_commands_and_version_prints_it():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    h = subprocess.run([sys.executable, "-m", "odb", "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert h.returncode == 0 and "plan LENGTHS --world-size N" in h.stdout
    v = subprocess.run([sys.executable, "-m", "odb", "--version"], capture_output=True, text=True, timeout=60, env=env)
    assert v.returncode == 0 and v.stdout.strip() == f"odb {odb.__version__}"
    bad = subprocess.run([sys.executable, "-m", "odb", "plna"], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "unknown command 'plna'" in bad.stderr


def test_the_planning_guides_commands_run_as_written_in_seconds(tmp_path):
    # every `odb plan` line of the guide's first block, on 5,000 lengths (a long tail) and a .jsonl of token lists
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "guide" / "planning.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    cmds = [line.split("#")[0].split() for line in block.splitlines() if line.startswith("odb plan ")]
    assert len(cmds) == 3
    lens = np.clip(np.random.default_rng(64).lognormal(6.0, 0.9, 5000).astype(int), 8, 16_000)
    np.save(tmp_path / "lengths.npy", lens)
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"input_ids": [1] * int(n)}) + "\n" for n in lens[:2000]))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for cmd in cmds:
        out = subprocess.run([sys.executable, "-m", "odb", *cmd[1:]], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300, env=env)
        assert out.returncode == 0, (cmd, out.stderr[-2000:])
        assert ("--json" in cmd) == out.stdout.startswith("{"), out.stdout[:200]
    assert (tmp_path / "plan.png").stat().st_size > 0


def test_the_predicted_token_balance_is_the_quantity_the_loader_measures():
    from odb import LoaderSettings
    from odb.batching import make_cost_model
    from odb.core.sim import simulate
    from odb.plan.metrics import token_balance

    assert token_balance([[[0], [1]], [[2], None]], [(10,), (4,), (6,)]) == pytest.approx((8 + 2) / (10 + 4))
    sizes = [(n,) for n in LENGTHS]
    for placement in (None, DEFAULT_EXCHANGE):
        sim = simulate([[] for _ in range(3)], LoaderSettings(token_budget=None, cost=make_cost_model("padded", 256),
                                                              buffer_size=32, placement=placement),
                       deal=[((n,), n - 1) for n in LENGTHS])
        # every simulated rank's own stats, from the gathered counts, as the loader's epoch summary reads them
        want = token_balance(sim.batches, sizes)
        assert [s.token_balance() for s in sim.stats] == [pytest.approx(want)] * 3 and want < 1


def test_candidates_simulated_in_worker_processes_give_the_report_of_one_process(tmp_path):
    """``jobs``: the candidates' runs spread over processes give every prediction, line for line, and the
    recommendation of one process; a bad count is refused before any work; the collector is left as it was."""
    import gc

    kw = dict(world_size=8, ranks_per_host=4, budgets=[256, 512], windows=[32, 64])
    one, lines = plan(LENGTHS, **kw), []
    two = plan(LENGTHS, **kw, jobs=2, progress=lines.append)
    assert [p.as_dict() for p in two.predictions] == [p.as_dict() for p in one.predictions]
    assert two.why == one.why and two.recommended.candidate == one.recommended.candidate
    assert len(lines) == len(one.predictions) == 2 * 2 * 4 and lines[-1].startswith(f"odb plan: {len(lines)}/")
    with pytest.raises(odb.ConfigError, match="jobs must be >= 1"):
        plan(LENGTHS, **kw, jobs=0)
    assert gc.isenabled()
    gc.disable()
    try:
        plan(LENGTHS, world_size=2, budgets=[256], windows=[32])
        assert not gc.isenabled()  # the planner turns the collector on only where it found it on
    finally:
        gc.enable()
    from odb.plan.planner import POOL_FROM_SAMPLES, _jobs

    cpus = min(12, len(os.sched_getaffinity(0)))
    assert _jobs(None, 12, POOL_FROM_SAMPLES // 12 - 1) == 1  # a small plan (samples x candidates) stays here
    assert _jobs(None, 12, POOL_FROM_SAMPLES // 12 + 1) == cpus and _jobs(None, 12, POOL_FROM_SAMPLES) == cpus
    assert _jobs(64, 3, 10) == 3 and _jobs(1, 12, 10**9) == 1


def test_the_command_line_plans_in_a_process_a_cpu_unless_told_and_reads_input_ids_first(tmp_path, monkeypatch):
    import odb.plan.planner as planner
    from odb.plan.cli import _obvious_column, main

    seen = []

    def fake(lengths, **kw):
        seen.append(kw["jobs"])
        raise odb.ConfigError("stop here")
    monkeypatch.setattr(planner, "plan", fake)
    np.save(tmp_path / "l.npy", np.array(LENGTHS))
    assert main([str(tmp_path / "l.npy"), "--world-size", "2"]) == 2
    assert main([str(tmp_path / "l.npy"), "--world-size", "2", "--jobs", "3"]) == 2
    assert seen == [None, 3]
    assert _obvious_column(["length", "input_ids", "labels"], "p") == "input_ids"
    assert _obvious_column(["labels", "num_tokens"], "p") == "num_tokens"


def test_a_window_of_exactly_a_ranks_epoch_is_not_cut_and_a_drawn_epoch_is_the_seeds():
    r = plan(LENGTHS, world_size=8, budgets=[256], windows=[75])  # 75 samples a rank
    assert r.inputs["windows_cut"] == [] and "cut to" not in r.text()
    a, b, c = (plan(LENGTHS[:200], world_size=8, budgets=[256], windows=[32], num_samples=600, seed=s)
               for s in (1, 1, 2))
    assert a.inputs["order"] == "drawn" and [p.as_dict() for p in a.predictions] == [p.as_dict() for p in b.predictions]
    assert [p.as_dict() for p in a.predictions] != [p.as_dict() for p in c.predictions]


def test_the_recommendation_prices_a_pool_by_its_whole_window_and_prints_none_when_it_runs_none():
    """Of candidates that all meet the targets, the cheapest runs: a pool of G windows of W costs G W samples of
    preprocessing and memory a rank, more than one window of 2 W; the call it prints names ``placement=None``
    (the loader's default is "auto", not None)."""
    from odb.plan.planner import Candidate, Prediction, _recommend

    def pred(c):
        return Prediction(candidate=c, steps=10, padding=0.1, straggler_efficiency=0.99, token_balance=0.99,
                          budget_use=0.9, steps_vs_gmt=1.0, throughput_vs_gmt=1.0, throughput_vs_standard=5.0,
                          first_batch_s=None, window_bytes=None)

    preds = [pred(Candidate(512, 64)), pred(Candidate(512, 32, 4)), pred(Candidate(512, 32, 4, exchange=True))]
    rec, why = _recommend(preds, [512], per_rank=1000)
    assert rec.candidate == Candidate(512, 64) and "buffer_size=64: the smallest window" in why[1]
    assert rec.candidate.call().endswith("buffer_size=64, placement=None)")
    assert Candidate(512, 32, 4).call().endswith("placement=odb.Pooled(size=4))")


def test_a_script_without_the_main_guard_gets_a_clear_error_from_plan_with_processes_and_never_hangs(tmp_path):
    """``jobs`` > 1 starts worker processes, each importing the calling script: one that plans at its top level
    fails at once, naming the ``__main__`` guard (before: the pool waited for good on the first worker's start);
    the same script under the guard plans."""
    body = ("import numpy as np\nfrom odb.plan import plan\n{guard}"
            "{ind}lengths = np.clip(np.random.default_rng(0).lognormal(6.0, 0.9, 20000).astype(int), 8, 16000)\n"
            "{ind}print(plan(lengths, world_size=8, budgets=[8192], windows=[256, 1024], jobs=2).recommended"
            ".candidate.call())\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for guarded in (False, True):
        script = tmp_path / f"plan_{guarded}.py"
        script.write_text(body.format(guard='if __name__ == "__main__":\n' if guarded else "",
                                      ind="    " if guarded else ""))
        out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                             timeout=240, env=env)
        if guarded:
            assert out.returncode == 0 and out.stdout.startswith("ODBDataLoader(dataset, token_budget=8192"), \
                out.stderr[-1500:]
        else:
            assert out.returncode == 1 and 'under `if __name__ == "__main__":`, or pass jobs=1' in out.stderr, \
                out.stderr[-1500:]
