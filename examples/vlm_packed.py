"""A vision-language loop under a two-resource budget, text tokens and image patches (CPU, gloo; a tiny
random Qwen2-VL, no download).

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/vlm_packed.py [--packed] [--fsdp]
    python examples/vlm_packed.py   # one process

A batch is bounded in both (``cost={"tokens": ..., "image_patches": ("packed", ...)}``, ``token_budget=None``,
``length_fn`` -> (tokens, patches)).  ``pad_collate`` (default) pads the text and joins the images as the
vision tower reads them; ``--packed``: ``mrope_collate``, one padding-free row whose mRoPE position ids
restart at every sample (tokens then cost "packed").  Limit: packed samples stay apart under sdpa or eager
attention with ``use_cache=False`` only (the collate sets it).  The ranks then check exactly-once per epoch.

A batch may be text-only on one rank while its peer's holds images; the model would then run its vision
tower on one rank only.  ``visual_stub`` appends a zero-loss stub image to such a batch, so the tower runs
on every rank at every step: DDP needs no ``find_unused_parameters``, and ``--fsdp`` (FSDP2, the tower
sharded block by block) keeps the ranks' all-gathers matched.
"""

import argparse
import gc
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _tiny import init_gloo  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration  # noqa: E402

from odb import ODBDataLoader  # noqa: E402
from odb.batching import check_packing, mrope_collate, pad_collate, visual_stub  # noqa: E402
from odb.integrations import TrainStream, grad_sync, weighted_loss  # noqa: E402

IMAGE, START, END = 70, 72, 73
TOKENS, PATCHES = 96, 64  # budgets per batch


def tiny_qwen2_vl():
    """A 2-layer, 32-wide Qwen2-VL with a 1-block vision tower, random weights (the recipe of tests/test_vlm.py)."""
    torch.manual_seed(0)
    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
                         bos_token_id=1, eos_token_id=2),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=2,
                           temporal_patch_size=1, spatial_merge_size=2, in_channels=3),
        image_token_id=IMAGE, video_token_id=71, vision_start_token_id=START, vision_end_token_id=END,
        attn_implementation="sdpa")
    return Qwen2VLForConditionalGeneration(cfg)


def vlm_samples(n: int = 48, seed: int = 0) -> list[dict]:
    """Chat-like samples: an image block (start, merged image tokens, end) then text, labels on the text;
    about one in four is text only."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        text = torch.randint(3, 60, (int(torch.randint(3, 21, (1,), generator=g)),), generator=g).tolist()
        s = {"input_ids": text, "labels": text}
        if torch.rand(1, generator=g) > 0.25:
            h, w = (2 * int(v) for v in torch.randint(1, 5, (2,), generator=g))  # even: 2 x 2 patches merge
            merged = h * w // 4
            s = {"input_ids": [START] + [IMAGE] * merged + [END] + text, "labels": [-100] * (merged + 2) + text,
                 "mm_token_type_ids": [0] + [1] * merged + [0] * (len(text) + 1),
                 "pixel_values": torch.randn(h * w, 3 * 2 * 2, generator=g), "image_grid_thw": [[1, h, w]]}
        out.append(s)
    return out


# a 1 x 2 x 2 patch grid (one merged image token), no label: it only makes the vision tower run
STUB = {"input_ids": [START, IMAGE, END], "labels": [-100] * 3, "mm_token_type_ids": [0, 1, 0],
        "pixel_values": torch.zeros(4, 3 * 2 * 2), "image_grid_thw": [[1, 2, 2]]}


def sizes(s) -> tuple[int, int]:
    """The loader's length_fn: (tokens, image patches)."""
    return len(s["input_ids"]), (int(s["pixel_values"].shape[0]) if "pixel_values" in s else 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packed", action="store_true", help="mRoPE padding-free packing (mrope_collate)")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard), the vision tower block by block")
    a = ap.parse_args()
    init_gloo()  # under torchrun, or one process; ODB takes the default group
    net = tiny_qwen2_vl()
    if a.packed:  # packing is exact only for a model that restarts every layer at a sample boundary: measure it
        check_packing(net, mrope_collate(net.model.get_rope_index))
    if a.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in [*net.model.visual.blocks, net.model.visual, *net.model.language_model.layers]:
            fully_shard(block, mesh=mesh)
        model = fully_shard(net, mesh=mesh)
    else:
        model = DDP(net)  # every batch runs the vision tower (visual_stub): no find_unused_parameters
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ds = vlm_samples()
    collate = visual_stub(mrope_collate(net.model.get_rope_index) if a.packed else pad_collate, STUB)
    cost = {"tokens": ("packed" if a.packed else "padded", TOKENS), "image_patches": ("packed", PATCHES)}
    # shift_labels: the loader counts labels[1:], the targets of the model's shifted loss
    loader = ODBDataLoader(ds, None, collate, cost=cost, length_fn=sizes, shift_labels=True, buffer_size=8,
                           timeout_s=60)
    stream = TrainStream(loader, 2)  # accumulate 2 micro-steps per optimizer step
    seen, largest, loss, text_only = [], 0, float("nan"), 0
    for _ in range(2):  # epochs
        for ms in stream.epoch():
            seen += [(ms.info.epoch, i) for i in ms.info.indices]
            text_only += not any("pixel_values" in ds[i] for i in ms.info.indices)  # the stub ran the tower
            largest = max(largest, sum(sizes(ds[i])[1] for i in ms.info.indices))
            with grad_sync(model, ms.sync):
                out = model(**ms.batch)
                weighted_loss(out, ms.loss_weight).backward()
            loss = out.loss.item() if ms.loss_weight else loss  # a filler's loss is not trained on
            if ms.sync:
                opt.step()
                opt.zero_grad()
    p = stream.progress
    print(f"rank {loader.rank}: {p.samples} samples, {p.optimizer_steps} optimizer steps, "
          f"fillers {loader.stats.fillers}, text-only batches {text_only}, largest batch {largest}/{PATCHES} image "
          f"patches, last loss {loss:.3f}")
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, seen)  # SYNC: every rank must reach this
    got = sorted(x for part in every for x in part)
    if got != sorted((e, i) for e in range(2) for i in range(len(ds))):
        raise RuntimeError(f"not every sample trained exactly once per epoch: {len(got)} of {2 * len(ds)} seen")
    loader.close()
    del model  # DDP holds the group; free it before the group goes (a gloo work freed at exit aborts)
    gc.collect()
    dist.barrier()  # tear down together: a peer that exits mid-teardown can abort gloo
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
