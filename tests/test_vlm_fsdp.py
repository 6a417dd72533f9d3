"""A vision-language model under FSDP2 with its vision tower sharded block by block, on 2 gloo ranks (CPU):
rank 0's batch is text-only, rank 1's holds images, as ODB's mixed batches give at any step.

Without `odb.batching.visual_stub` rank 0 skips the tower's all-gathers while rank 1 runs them, and the run
fails (on gloo a size mismatch that aborts a process; on NCCL a hang).  With it both ranks run the tower,
and each rank's loss and the averaged full gradient equal those of an unsharded copy on the batches without
the stub.
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


def _step(rank: int, world: int, stub: bool) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from odb.batching import pad_collate, visual_stub

    if not stub:  # the control aborts a process: keep pytest's inherited crash dump (the terminal's fd) quiet
        import faulthandler

        faulthandler.disable()
    torch.set_num_threads(1)
    net = _model().train()
    mesh = init_device_mesh("cpu", (world,))
    for blk in net.model.visual.blocks:  # the tower in units of its own, as per-block wrapping policies do
        fully_shard(blk, mesh=mesh)
    fully_shard(net.model.visual, mesh=mesh)
    for layer in net.model.language_model.layers:
        fully_shard(layer, mesh=mesh)
    model = fully_shard(net, mesh=mesh)
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
