"""GMT/BMT's length cache, priced: one pass of the real preprocessing over the train split.

The paper's case against the offline oracles (FACTS.md section 1): they need every sample's
post-pipeline length before training starts, so the whole preprocessing (templating,
tokenization, truncation, image decode/resize, visual-token expansion) runs once first, and again
whenever the template, cutoff, image resolution, augmentation or mixture changes.  ODB needs no
such pass.  FACTS.md does not say whether the paper's GMT/BMT throughputs include the pass.

1. Measured where the preprocessing is real (`price_pipelines`, in the parent process while no
   training job runs): each pipeline of `PIPELINES` over `num` samples, `repeats` passes;
   per-sample ms = the least pass / num (another program can only add time to a pass, as in
   `make bench`), with the passes' median and max beside it.
2. Charged where it is not: a lengths-only workload (it stands for a paper dataset; its samples
   are cut from a token table, so its own pass costs microseconds) is charged
   ``per_sample_ms[spec["cache_pipeline"]] * num_train / world_size``, the pass sharded over the
   ranks as `paper_repro.sources.OfflineBatches` builds it.  The real workloads' passes are
   measured in their training jobs (``setup_s``).
3. Two views (`views`): the pass amortized over the run's epochs, and over one epoch (common for
   fine-tuning): samples / (loop seconds + pass seconds).
4. Extrapolated (`extrapolate`): at the paper's throughput R samples/s on G GPUs, a pass by P
   processes at c ms per sample is ``c * R / P`` of one epoch, whatever the dataset size N; N
   (`PAPER_SIZES`) only sets the seconds, ``N * c / P``.  c: "mm_768" per sample for the image
   datasets; for text, the "text" cost per token times the dataset's assumed mean length
   (`paper_repro.distributions`; our docstrings are ~100 tokens, UltraChat's ~1300).  Our
   pipelines (a local BPE, matplotlib decode, bilinear resize) are lighter than a production VLM
   processor, so these are floors.
"""

from __future__ import annotations

import statistics
import time

__all__ = ["PIPELINES", "PAPER_SIZES", "PAPER_RATES", "price_pipelines", "charge_s", "views", "extrapolate"]

# name -> (what it runs, dataset settings).  "mm" is the images workload's own pipeline (what the CPU
# lengths workloads are charged); "mm_768" is the same at the paper's largest image side and a
# 1024-token cutoff, for the extrapolation.
PIPELINES = {
    "text": ("template + tokenize + truncate (ChatDataset, cutoff 512)", {"kind": "text", "cutoff": 512}),
    "mm": ("image decode + random resize (long side <= 336) + visual-token expansion + template/tokenize/"
           "truncate (ImageChatDataset, cutoff 128)", {"kind": "mm", "cutoff": 128, "max_side": 336}),
    "mm_768": ("the same with long side <= 768 (the paper's recipes) and cutoff 1024",
               {"kind": "mm", "cutoff": 1024, "max_side": 768}),
}
# The range for the paper's train splits (FACTS.md gives no per-dataset sizes).
PAPER_SIZES = (57_000, 200_000)
# (dataset, paper's ODB samples/s, GPUs, pipeline, distribution): FACTS.md section 1.
PAPER_RATES = [("UltraChat (8B, 1 node)", 10.23, 8, "text", "ultrachat"),
               ("LLaVA (8B, 1 node)", 24.87, 8, "mm_768", "llava"),
               ("ShareGPT4o (8B, 1 node)", 5.83, 8, "mm_768", "sharegpt4o"),
               ("MM-Mix (2B, 2 nodes)", 79.15, 16, "mm_768", "mmmix")]
WORKERS_PER_GPU = 4  # the authors' recipes (FACTS.md section 1)


def price_pipelines(num: int = 256, repeats: int = 5, seed: int = 0) -> dict:
    """{pipeline: {"ms": least per-sample ms, "med", "lo", "hi", "num", "mean_len", "what"}} over
    `repeats` passes."""
    import torch

    from .data import ChatDataset, ImageChatDataset, chat_pairs, get_tokenizer, sample_len

    torch.set_num_threads(1)  # one preprocessing process, as a DataLoader worker runs it
    tok = get_tokenizer(2048)
    pairs = chat_pairs(seed)
    out = {}
    for name, (what, kw) in PIPELINES.items():
        idx = range(num)
        if kw["kind"] == "text":
            ds = ChatDataset(tok, pairs, idx, kw["cutoff"])
        else:
            ds = ImageChatDataset(tok, pairs, idx, seed=seed, cutoff=kw["cutoff"], max_side=kw["max_side"])
        ds[0]  # first-call costs (imports, lazy tables) are not a per-sample cost
        passes, tokens = [], 0
        for _ in range(repeats):
            t = time.perf_counter()
            tokens = sum(sample_len(ds[i]) for i in idx)
            passes.append((time.perf_counter() - t) * 1e3 / num)
        out[name] = {"ms": min(passes), "med": statistics.median(passes), "lo": min(passes), "hi": max(passes),
                     "num": num, "mean_len": tokens / num, "what": what}
    return out


def charge_s(prices: dict, spec: dict, world_size: int) -> float | None:
    """Seconds charged to a lengths-only workload's cache pass; None if it names no pipeline."""
    p = spec.get("cache_pipeline")
    if spec.get("kind") != "lengths" or not p:
        return None
    return prices[p]["ms"] * 1e-3 * spec["num_train"] / world_size


def views(samples: int, epochs: int, loop_s: float, cache_s: float) -> dict:
    """samples/s of an offline method without its cache, with it amortized over `epochs`, and with it
    over one epoch; `samples` and `loop_s` are the whole run's."""
    per_epoch = loop_s / epochs
    return {"loop": samples / loop_s, "amortized": samples / (loop_s + cache_s),
            "one_epoch": (samples / epochs) / (per_epoch + cache_s), "cache_over_epoch": cache_s / per_epoch}


def extrapolate(prices: dict) -> list[dict]:
    """For each paper figure: the pass's share of one epoch with one process per GPU and with
    `WORKERS_PER_GPU` per GPU, and its seconds at `PAPER_SIZES` with one process per GPU."""
    from .distributions import DISTRIBUTIONS

    rows = []
    for name, rate, gpus, pipe, dist in PAPER_RATES:
        p = prices[pipe]
        ms = p["ms"] * DISTRIBUTIONS[dist][1] / p["mean_len"] if pipe == "text" else p["ms"]
        c = ms * 1e-3
        rows.append({"dataset": name, "rate": rate, "gpus": gpus, "pipeline": pipe, "ms": ms,
                     "share_per_gpu": c * rate / gpus, "share_workers": c * rate / (gpus * WORKERS_PER_GPU),
                     "seconds": {n: n * c / gpus for n in PAPER_SIZES},
                     "epoch_s": {n: n / rate for n in PAPER_SIZES}})
    return rows
