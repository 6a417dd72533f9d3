"""What the loader reports: the per-pass summary on logging.getLogger("odb"), the progress bar in samples,
and the figures of `LoaderStats`, each recomputed here from the batches themselves."""

import logging
import random

import pytest

import odb
from mp_harness import Samples, id_collate, make_lengths
from odb.batching import make_cost_model
from odb.core.sim import simulate
from simkit import sim_settings

LENGTHS = make_lengths(60, seed=5, lo=2)


def _run(loader):
    infos = []
    for batch in loader:
        infos.append(odb.pop_step_info(batch))
    return infos


def test_the_pass_summary_is_logged_with_figures_recomputed_from_the_batches(caplog):
    budget = 128
    with caplog.at_level(logging.INFO, logger="odb"):
        with odb.ODBDataLoader(Samples(LENGTHS), budget, id_collate, buffer_size=8) as loader:
            infos = _run(loader)
            st = loader.stats
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("odb")]
    assert len(lines) == 1 and lines[0].startswith(f"odb epoch 0 rank 0/1: {len(infos)} steps (0 fillers), 60 samples")
    sizes = [[LENGTHS[i] for i in info.indices] for info in infos]
    padded = sum(len(s) * max(s) for s in sizes)
    assert st.padding_ratio() == pytest.approx(1 - sum(LENGTHS) / padded)
    assert f"padding {100 * (1 - sum(LENGTHS) / padded):.1f}%" in lines[0]
    assert st.budget_use() == pytest.approx(sum(len(s) * max(s) / budget for s in sizes) / len(sizes))
    assert st.token_balance() == 1.0  # one rank: it is its own mean
    assert 0.0 <= st.wait_fraction() <= 1.0 and st.pass_time_s > 0


def test_the_summary_names_the_exchanges_moves_and_their_bytes_in_mib_and_what_was_not_trained_on():
    from odb.core.info import LoaderStats
    from odb.runtime.observe import summary_line

    s = LoaderStats(steps=4, samples=10, exchange_sent=2, exchange_received=1, exchange_bytes=3 * 2**20 + 2**19,
                    dropped=1, oversize=2, oversize_worst=(1.5,))
    line = summary_line(s, epoch=2, rank=1, world_size=4)
    assert line.startswith("odb epoch 2 rank 1/4: 4 steps (0 fillers), 10 samples")
    assert "; exchange: 2 batches sent, 1 received, 3.5 MiB;" in line
    assert line.endswith("1 dropped, 2 oversize (the costliest 1.50x the budget)")
    assert "exchange" not in summary_line(LoaderStats(steps=4), epoch=0, rank=0, world_size=1)


def test_a_pass_ended_early_logs_no_summary_but_counts_its_time(caplog):
    with caplog.at_level(logging.INFO, logger="odb"):
        with odb.ODBDataLoader(Samples(LENGTHS), 128, id_collate, buffer_size=8) as loader:
            it = iter(loader)
            next(it)
            it.close()
            assert loader.stats.pass_time_s > 0
    assert not [r for r in caplog.records if r.name.startswith("odb")]


def test_the_progress_bar_counts_every_sample(capsys):
    with odb.ODBDataLoader(Samples(LENGTHS), 128, id_collate, buffer_size=8, progress=True) as loader:
        _run(loader)
    err = capsys.readouterr().err
    assert "odb epoch 0" in err and "60/60" in err, err[-400:]


def test_progress_must_be_a_bool():
    with pytest.raises(odb.ConfigError, match="progress"):
        odb.ODBDataLoader(Samples(LENGTHS), 128, id_collate, progress="yes")


@pytest.mark.parametrize("mode", ["pad", "join", "quota"])
def test_token_balance_is_the_gathered_straggler_estimate(mode):
    rng = random.Random(7)
    shards = [[(rng.randint(1, 90),) for _ in range(rng.randint(20, 70))] for _ in range(3)]
    cost = make_cost_model("padded", 256)
    res = simulate(shards, sim_settings(cost, 16, mode=mode))

    def balance(steps):  # over the steps a rank took part in (JOIN: a rank's own steps end first)
        mean = mx = 0
        for k in range(steps):
            tokens = [sum(shards[r][p][0] for p in b[k]) if k < len(b) and b[k] is not None else 0
                      for r, b in enumerate(res.batches)]
            if sum(tokens):
                mean, mx = mean + sum(tokens) / 3, mx + max(tokens)
        return mean / mx
    assert 0.3 < balance(max(map(len, res.batches))) < 1.0  # uneven shards: a real straggler
    for r, st in enumerate(res.stats):
        assert st.token_balance() == pytest.approx(balance(len(res.batches[r]))), r
        real = [b for b in res.batches[r] if b is not None]
        uses = [len(b) * max(shards[r][p][0] for p in b) / 256 for b in real]
        assert st.budget_use() == pytest.approx(sum(uses) / len(uses))
