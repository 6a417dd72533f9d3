"""The default placement, ``"auto"`` (issue 53): the round exchange where it can run, resolved alike on every rank.

What a user gets without settings: on two ranks or more, in mode "pad" or "quota", with dealt sharding, the
exchange with budget balance (`odb.core.placement.DEFAULT_EXCHANGE`); else no placement.  The resolved value is
what the construction check compares, so a rank built with another placement stops every rank.
"""

from __future__ import annotations

import pytest
import torch

import odb
from mp_harness import Samples, id_collate, make_lengths, run_ranks
from odb.core.placement import AUTO, DEFAULT_EXCHANGE, resolve_placement

LENGTHS = make_lengths(400, seed=3, lo=2, hi=120)


@pytest.mark.parametrize("world, mode, sharding, want", [
    (2, "pad", "dealt", DEFAULT_EXCHANGE), (64, "quota", "dealt", DEFAULT_EXCHANGE),
    (1, "pad", "dealt", None), (2, "join", "dealt", None), (2, "pad", "fixed", None), (8, "quota", "fixed", None)])
def test_auto_resolves_to_the_exchange_exactly_where_it_can_run(world, mode, sharding, want):
    assert resolve_placement(AUTO, world=world, mode=mode, sharding=sharding) == want
    assert resolve_placement(None, world=world, mode=mode, sharding=sharding) is None  # a choice stays a choice
    s = odb.LoaderSettings(token_budget=64, mode=mode).resolved(world, sharding)
    assert s.placement == want and s.exchange == (want is not None) and s.slack_bp == (125 if want else 0)


def test_the_default_is_auto_and_an_unresolved_setting_cannot_be_read_as_a_placement():
    s = odb.LoaderSettings(token_budget=64)
    assert s.placement == AUTO and s.lanes == 1  # "auto" never pools
    with pytest.raises(odb.ConfigError, match="resolved per group"):
        s.exchange
    with pytest.raises(odb.ConfigError, match="not valid"):
        odb.LoaderSettings(token_budget=64, placement="exchange")


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i, n in enumerate(LENGTHS[:100]):
            yield {"input_ids": torch.ones(n, dtype=torch.long), "id": [i]}


def _resolved(rank, world_size):
    out = {}
    for name, kw, data in (("default", {}, Samples(LENGTHS)), ("join", {"mode": "join"}, Samples(LENGTHS)),
                           ("sampler", {"sampler": range(rank, len(LENGTHS), world_size)}, Samples(LENGTHS)),
                           ("none", {"placement": None}, Samples(LENGTHS)), ("iterable", {}, _Stream())):
        loader = odb.ODBDataLoader(data, 256, id_collate, buffer_size=16, timeout_s=60, **kw)
        if name == "default":  # it runs: every sample once, some of them moved between the two ranks
            seen = []
            for b in loader:
                info = odb.pop_step_info(b)
                seen += [] if info.filler else list(info.indices)
            out["seen"], out["sent"] = seen, loader.stats.exchange_sent
        out[name] = loader.settings.placement
        loader.close()
    return out


@pytest.mark.slow  # 2 gloo ranks
def test_a_loader_without_settings_exchanges_on_two_ranks_and_not_where_it_cannot(tmp_path):
    res = run_ranks(_resolved, 2, tmp_path, timeout_s=120)
    assert all(r.status == "ok" for r in res), [(r.status, (r.error or "")[:600]) for r in res]
    for r in res:
        v = r.value
        assert v["default"] == DEFAULT_EXCHANGE and v["sent"] > 0
        assert v["join"] is None and v["sampler"] is None and v["none"] is None and v["iterable"] is None
    assert sorted(res[0].value["seen"] + res[1].value["seen"]) == list(range(len(LENGTHS)))


def _mixed(rank, world_size):
    kw = {"placement": None} if rank == 1 else {}
    odb.ODBDataLoader(Samples(LENGTHS), 256, id_collate, buffer_size=16, timeout_s=30, **kw)


@pytest.mark.slow  # 2 gloo ranks
def test_a_rank_that_turns_the_exchange_off_alone_stops_every_rank_at_construction(tmp_path):
    res = run_ranks(_mixed, 2, tmp_path, timeout_s=60)
    assert [r.error_type for r in res] == ["ConfigError", "ConfigError"], [(r.status, r.error) for r in res]
    assert all("exchange" in (r.error or "") for r in res)
