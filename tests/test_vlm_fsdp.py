"""A vision-language model under FSDP2 with its vision tower sharded block by block, on 2 gloo ranks (CPU):
rank 0's batch is text-only, rank 1's holds images, as ODB's mixed batches give at any step.

Without `odb.batching.visual_stub` rank 0 skips the tower's all-gathers while rank 1 runs them, and the run
fails (on gloo a size mismatch that aborts a process; on NCCL we expect a hang, not run here).  With it both
ranks run the tower, and each rank's loss and the averaged full gradient equal those of an unsharded copy
on the batches without the stub.  Through the loader (PAD mode, uneven shards), rank 0's text-only batches
and zero-weight fillers run the tower too, and every sample is trained once.
"""

from __future__ import annotations

import pytest
import torch

from mp_harness import run_ranks
from test_vlm import STUB, _model, _samples

pytestmark = [pytest.mark.adapters, pytest.mark.slow]


def _batches():
    s = _samples()
    text = [x for x in s if "pixel_values" not in x] + [{"input_ids": [4, 8, 15, 16], "labels": [4, 8, 15, 16]}]
    return [text, [x for x in s if "pixel_values" in x][:2]]  # rank 0: text only; rank 1: images


def _sharded(world: int):
    """The tiny Qwen2-VL under FSDP2: the tower's blocks and the tower in units of their own (as per-block
    wrapping policies do), each decoder layer, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    net = _model().train()
    mesh = init_device_mesh("cpu", (world,))
    for block in [*net.model.visual.blocks, net.model.visual, *net.model.language_model.layers]:
        fully_shard(block, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def _step(rank: int, world: int, stub: bool) -> dict:
    from odb.batching import pad_collate, visual_stub

    if not stub:  # the control aborts a process: keep pytest's inherited crash dump (the terminal's fd) quiet
        import faulthandler

        faulthandler.disable()
    torch.set_num_threads(1)
    model = _sharded(world)
    collate = visual_stub(pad_collate, STUB) if stub else pad_collate
    loss = model(**collate(_batches()[rank])).loss
    loss.backward()
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}  # a collective on every rank
    return {"loss": loss.item(), "grads": grads if rank == 0 else None}


def _reference() -> tuple[list[float], dict]:
    """Each rank's loss and FSDP's averaged gradient, on one unsharded copy, without any stub."""
    from odb.batching import pad_collate

    model = _model().train()
    losses = []
    for b in _batches():
        loss = model(**pad_collate(b)).loss
        (loss / 2).backward()
        losses.append(loss.item())
    return losses, {n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in model.named_parameters()}


def test_a_text_only_rank_runs_the_sharded_vision_tower_with_a_stub_and_trains_exactly(tmp_path):
    out = run_ranks(_step, 2, tmp_path / "stub", args=(True,), timeout_s=120, pg_timeout_s=20)
    assert [o.status for o in out] == ["ok", "ok"], [o.error for o in out]
    losses, grads = _reference()
    assert [o.value["loss"] for o in out] == pytest.approx(losses, rel=1e-5, abs=1e-6)
    got = out[0].value["grads"]
    assert got.keys() == grads.keys()
    worst = max(float((got[n] - grads[n]).abs().max()) for n in grads)
    assert worst < 1e-5, worst
    vision = [n for n in grads if ".visual." in n]
    assert vision and any(float(grads[n].abs().max()) > 0 for n in vision)  # rank 1's images train the tower


def test_without_the_stub_the_ranks_collectives_do_not_match(tmp_path):
    # the control: the setting above does exercise the hazard (else the test above could not fail)
    out = run_ranks(_step, 2, tmp_path / "plain", args=(False,), timeout_s=120, pg_timeout_s=20)
    assert any(o.status != "ok" for o in out), [o.status for o in out]


class _Vlm(torch.utils.data.Dataset):
    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def _loader_epoch(rank: int, world: int) -> dict:
    """One epoch through the loader, PAD mode, uneven shards: rank 0 holds text-only samples and runs out
    first (its last steps are fillers), rank 1 holds image samples."""
    import odb
    from mp_harness import ListSampler
    from odb.batching import pad_collate, visual_stub
    from odb.integrations import weighted_loss

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(3)
    text = [{"input_ids": (t := torch.randint(3, 60, (int(n),), generator=g).tolist()), "labels": t}
            for n in torch.randint(3, 12, (6,), generator=g)]
    images = [x for x in _samples() if "pixel_values" in x] * 4
    ds = _Vlm(text + images)
    model = _sharded(world)
    shards = [list(range(len(text))), list(range(len(text), len(ds)))]

    def sizes(s):
        return len(s["input_ids"]), (int(s["pixel_values"].shape[0]) if "pixel_values" in s else 0)
    cost = {"tokens": 24, "image_patches": ("packed", 12)}
    loader = odb.ODBDataLoader(ds, None, visual_stub(pad_collate, STUB), cost=cost, length_fn=sizes, buffer_size=4,
                               timeout_s=30, sampler=ListSampler(shards[rank]))
    seen, fillers, text_only = [], 0, 0
    for batch in loader:
        info = odb.pop_step_info(batch)
        seen += list(info.indices)
        fillers += info.filler
        text_only += not any("pixel_values" in ds[i] for i in info.indices) or info.filler
        weighted_loss(model(**batch), info.loss_scale).backward()
    loader.close()
    return {"seen": seen, "fillers": fillers, "text_only": text_only, "steps": loader.stats.steps}


def test_through_the_loader_text_only_batches_and_fillers_run_the_sharded_tower(tmp_path):
    out = run_ranks(_loader_epoch, 2, tmp_path, timeout_s=150, pg_timeout_s=30)
    assert [o.status for o in out] == ["ok", "ok"], [o.error for o in out]
    a, b = (o.value for o in out)
    # measured: 8 steps each; rank 0 ran 2 text-only batches and 6 fillers, every one of them stubbed
    assert a["steps"] == b["steps"] and a["text_only"] == a["steps"] and a["fillers"] > 0
    assert sorted(a["seen"] + b["seen"]) == list(range(6 + 12))
