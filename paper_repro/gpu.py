"""The paper's headline on a GPU, ready for the few minutes one is at hand (issue 54).

    python -m paper_repro.gpu --plan-only     what the run would do and how long it should take (no GPU needed)
    python -m paper_repro.gpu --toy           a tiny model, a few steps, on any device (CI runs it on CPU)
    make repro-gpu                            the real run; it needs CUDA and exits 2 without it

It runs from the repository root with the python a GPU machine already has (torch, transformers, numpy and
tokenizers; matplotlib for the plot if present) and installs nothing: it imports `odb`, the repro's data
(`paper_repro.data`, `paper_repro.workloads`) and batch sources (`paper_repro.sources`), never z3 or the proofs.

What runs (`Config`): a randomly initialised Llama-shaped decoder built from a config (about 0.5B parameters,
fp32 weights under bf16 autocast, the model's default attention), nothing downloaded; the paper's four length
distributions (`paper_repro.distributions`: llava, ultrachat, mmmix, sharegpt4o, CV 0.29 to 1.0) as real tokens of
a locally trained BPE (`paper_repro.data.LengthDataset`), the loss on the label tokens.  Per workload, every
method trains a fresh copy of the same initial weights on the same samples for one epoch, round after round,
the order rotated each round (as `make repro` does):

    odb_pad       odb.ODBDataLoader, padded batches under the token budget (the default)
    odb_packed    odb.ODBDataLoader with odb.batching.packed_collate and cost="packed" (padding-free)
    standard1     per-device batch 1, DistributedSampler, accumulation matched to odb_pad's samples per step
    gmt / bmt     the offline oracles of `odb.baselines`, fed a length cache whose build is timed (setup_s)
    hf_rebalance  HF's BatchRebalanceSampler (`odb.baselines.peers.hf_rebalance`), on the same cache

Measured per method and round: emitted samples per second of the training loop (evaluation excluded, the
GPU synchronised at its end), real tokens per second, padding, peak GPU memory, the share of the loop spent
waiting for the loader, the validation loss after the epoch (equal samples for every method), and that every
sample was emitted once.  On more than one GPU it runs once on one GPU and once on all of them (NCCL for the
model, ODB's own gloo group for its protocol).  Results: ``paper_repro/results/gpu_<device>_<yyyymm>.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

__all__ = ["Config", "FULL", "TOY", "METHODS", "PAPER", "plan", "run", "report", "main"]

METHODS = ("odb_pad", "odb_packed", "standard1", "gmt", "bmt", "hf_rebalance")
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# The paper's figures this run is compared with (FACTS.md section 1; NVIDIA H20, Qwen3-VL 2B/8B).
PAPER = {"odb_vs_standard_single_node": (1.58, 2.51), "odb_vs_oracles_ultrachat_llava": "within 15%",
         "odb_vs_oracles_sharegpt4o": (2.24, 2.39)}


@dataclass(frozen=True)
class Config:
    """One run: the model, the data and the protocol; `plan` turns it into counts and an estimated time."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    cutoff: int                 # the longest sample, tokens (the distributions are clipped to it)
    length_scale: float         # the distributions' lengths divided by this (1: the paper's; the toy's are short)
    budget: int                 # ODB's token_budget, and the oracles' (padded tokens per batch per rank)
    window: int                 # ODB's buffer_size
    num_train: int              # samples per method and round, per workload
    num_val: int
    rounds: int
    workloads: tuple[str, ...]
    lr: float
    bf16: bool                  # bf16 autocast (CUDA)
    assumed_tokens_per_s: float  # --plan-only's guess for a budget-full batch on one GPU
    assumed_batch1_efficiency: float  # and for batch 1 (a GPU runs one sample far below its peak)

    def net_params(self) -> int:
        """Parameters of the decoder this config builds (tied embeddings off: input and output)."""
        attn = self.hidden * self.hidden * 2 + 2 * self.hidden * (self.hidden // self.heads * self.kv_heads)
        return self.layers * (attn + 3 * self.hidden * self.intermediate + 2 * self.hidden) + \
            2 * self.vocab * self.hidden + self.hidden


FULL = Config(name="full", hidden=1024, layers=28, heads=16, kv_heads=8, intermediate=4096, vocab=2048,
              cutoff=8192, length_scale=1.0, budget=16384, window=1024, num_train=160, num_val=64, rounds=2,
              workloads=("llava", "ultrachat", "mmmix", "sharegpt4o"), lr=2e-4, bf16=True,
              assumed_tokens_per_s=40_000.0, assumed_batch1_efficiency=0.35)
TOY = Config(name="toy", hidden=64, layers=2, heads=4, kv_heads=4, intermediate=128, vocab=512,
             cutoff=256, length_scale=12.0, budget=512, window=32, num_train=48, num_val=16, rounds=1,
             workloads=("llava", "ultrachat", "mmmix", "sharegpt4o"), lr=1e-3, bf16=False,
             assumed_tokens_per_s=20_000.0, assumed_batch1_efficiency=0.5)


def _lengths(cfg: Config, workload: str):
    from .workloads import paper_lengths

    return paper_lengths(workload, cfg.num_train + cfg.num_val, seed=0, cutoff=cfg.cutoff, scale=cfg.length_scale)


def plan(cfg: Config, world_sizes=(1,)) -> dict:
    """What a run of `cfg` does and how long it should take, from its lengths and the config's assumed speeds."""
    tokens = {w: int(_lengths(cfg, w)[:cfg.num_train].sum()) for w in cfg.workloads}
    tps, eff = cfg.assumed_tokens_per_s, cfg.assumed_batch1_efficiency
    per_round = sum(t * (len(METHODS) - 1) / tps + t / (tps * eff) for t in tokens.values())
    setup_s = 60.0 if cfg.name == "full" else 10.0  # imports, the tokenizer, the data and the model
    est = setup_s + sum(cfg.rounds * per_round / n for n in world_sizes) * 1.15  # evaluation, warm-up, fillers
    return {"config": dataclasses.asdict(cfg), "params": cfg.net_params(), "methods": list(METHODS),
            "world_sizes": list(world_sizes), "train_tokens_per_method": tokens, "method_runs":
            len(cfg.workloads) * len(METHODS) * cfg.rounds * len(world_sizes), "estimated_s": round(est, 1),
            "assumptions": f"{tps:,.0f} tokens/s at a budget-full batch, {eff:.0%} of it at batch 1, one GPU"}


# -- the worker ---------------------------------------------------------------------------------------------------
def _dist():
    import torch.distributed as dist

    return dist


def _setup(cuda: bool) -> tuple[int, int, torch.device]:
    """Rank, world size and device; a process group under torchrun (NCCL on CUDA, gloo otherwise)."""
    dist = _dist()
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        if cuda:  # the GPU-only lines: which device, which backend
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if cuda else "gloo")
    if not dist.is_initialized():
        return 0, 1, torch.device("cuda" if cuda else "cpu")
    return dist.get_rank(), dist.get_world_size(), torch.device(f"cuda:{torch.cuda.current_device()}" if cuda
                                                               else "cpu")


def _build_net(cfg: Config):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=cfg.cutoff + 8, tie_word_embeddings=False, pad_token_id=0))


def _inputs(batch: dict, device: torch.device) -> dict:
    """The model's keyword arguments from a source's batch (padded: the attention mask as ints; packed: as is)."""
    skip = ("num_visual",)
    out = {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items() if k not in skip}
    if "attention_mask" in out:
        out["attention_mask"] = out["attention_mask"].long()
    return out


def _autocast(cfg: Config, device: torch.device):
    if cfg.bf16 and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def _val_loss(model, val, cfg: Config, device: torch.device, rank: int, world: int) -> float:
    """Mean loss per label target over the validation set (all ranks)."""
    model.eval()
    s = torch.zeros(2, dtype=torch.float64, device=device)
    for i, b in enumerate(val):
        if i % world == rank:
            kw = _inputs(b, device)
            with _autocast(cfg, device):
                loss = model(**kw).loss
            n = int((kw["labels"][:, 1:] != -100).sum())
            s += torch.tensor([float(loss) * n, n], dtype=torch.float64, device=device)
    if world > 1:
        _dist().all_reduce(s)  # SYNC: every rank evaluates after every method run
    model.train()
    return float(s[0] / s[1])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_method(method: str, cfg: Config, data, init: dict, rank: int, world: int, device: torch.device,
               accum: int) -> dict:
    """One epoch of `method` from the initial weights `init`; this rank's record."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from . import sources
    from .train import accumulation_groups

    ds_train, val = data
    spec = {"budget": cfg.budget, "window": cfg.window, "seed": 0, "cutoff": cfg.cutoff, "kind": "lengths",
            "timeout_s": 600}
    source = sources.batch_source(method, ds_train, spec, rank, world)
    with torch.device(device):  # a fresh module per run (a second DDP over one module would add its hooks)
        model = _build_net(cfg)
    model.load_state_dict(init)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None) if world > 1 else model
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rec = {"method": method, "accum": accum, "steps": 0, "micro_steps": 0, "samples": 0, "real_tokens": 0,
           "padded_tokens": 0, "fillers": 0, "wait_s": 0.0, "setup_s": source.setup_s, "indices": []}
    _sync(device)
    t0 = time.perf_counter()
    with source.join_context(net):
        for group, wait in accumulation_groups(source.epoch(0), accum):
            rec["wait_s"] += wait
            if not group:
                break
            opt.zero_grad(set_to_none=True)
            for i, (batch, meta) in enumerate(group):
                ctx = net.no_sync() if world > 1 and i < len(group) - 1 else contextlib.nullcontext()
                with ctx, _autocast(cfg, device):
                    out = net(**_inputs(batch, device))
                    # ODB weights each batch by its loss_scale (the global per-token mean after DDP); a filler's
                    # scale is 0 (`weighted_loss`'s zero keeps the graph); fixed batches average the window
                    w = meta["scale"] / len(group)
                    loss = out.logits.sum() * 0.0 if w == 0 else out.loss * w
                loss.backward()
                rec["micro_steps"] += 1
                rec["fillers"] += int(meta["filler"])
                rec["samples"] += meta["local_samples"]
                rec["real_tokens"] += meta["real_tokens"]
                rec["padded_tokens"] += meta["padded_tokens"]
                rec["indices"] += meta["indices"]
            opt.step()
            rec["steps"] += 1
    _sync(device)
    rec["train_s"] = time.perf_counter() - t0
    rec["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    rec["val_loss"] = _val_loss(model, val, cfg, device, rank, world)
    close = getattr(source, "close", None)
    if close is not None:
        close()
    return rec


def _merge(recs: list[dict], num_train: int) -> dict:
    """Every rank's record of one method run, as one (rank 0)."""
    out = {k: recs[0][k] for k in ("method", "accum", "setup_s", "val_loss", "peak_mem_gb")}
    out["train_s"] = max(r["train_s"] for r in recs)
    for k in ("samples", "real_tokens", "padded_tokens", "fillers"):
        out[k] = sum(r[k] for r in recs)
    out["steps"] = max(r["steps"] for r in recs)
    out["samples_per_s"] = out["samples"] / out["train_s"]
    out["tokens_per_s"] = out["real_tokens"] / out["train_s"]
    out["padding"] = 1 - out["real_tokens"] / max(1, out["padded_tokens"])
    out["wait_share"] = max(r["wait_s"] for r in recs) / out["train_s"]
    seen = sorted(i for r in recs for i in r["indices"])
    out["exactly_once"] = seen == list(range(num_train))
    return out


def _packing_methods(net) -> tuple[list[str], str]:
    """The methods to run, and whether this model and transformers keep packed samples apart
    (`odb.batching.check_packing`); odb_packed is left out, and the report says so, where they do not."""
    from odb import ConfigError
    from odb.batching import check_packing, packed_collate

    try:
        leak = check_packing(net, packed_collate)
    except ConfigError as e:
        return [m for m in METHODS if m != "odb_packed"], f"odb_packed not run: {str(e)[:300]}"
    return list(METHODS), f"packed samples kept apart (check_packing leak {leak:.1e})"


def run(cfg: Config, out_json: str) -> None:
    """Every workload, round and method on this process group (or alone); rank 0 writes `out_json`."""
    from .data import LengthDataset, collate_pad, get_tokenizer

    cuda = torch.cuda.is_available()
    rank, world, device = _setup(cuda)
    tok = get_tokenizer(cfg.vocab)
    with torch.device(device):
        net = _build_net(cfg)
    init = {k: v.detach().clone() for k, v in net.state_dict().items()}
    params = sum(v.numel() for k, v in init.items())
    methods, packing = _packing_methods(net)
    del net
    runs = []
    for workload in cfg.workloads:
        lengths = _lengths(cfg, workload)
        ds_train = LengthDataset(tok, lengths[:cfg.num_train], seed=0)
        ds_val = LengthDataset(tok, lengths[cfg.num_train:], seed=1)
        val = [collate_pad([ds_val[j] for j in range(i, min(len(ds_val), i + 8))]) for i in range(0, len(ds_val), 8)]
        accum = 1
        for r in range(cfg.rounds):
            order = methods[r % len(methods):] + methods[:r % len(methods)]
            for method in order:
                a = accum if method == "standard1" else 1
                rec = run_method(method, cfg, (ds_train, val), init, rank, world, device, a)
                recs = [rec]
                if world > 1:
                    recs = [None] * world
                    _dist().all_gather_object(recs, rec)  # SYNC: every rank after every method run
                merged = dict(_merge(recs, len(ds_train)), workload=workload, round=r, world_size=world)
                if method == "odb_pad" and r == 0:  # Standard's effective batch matched to ODB's (`make repro`'s rule)
                    accum = max(1, round(merged["samples"] / merged["steps"] / world))
                runs.append(merged)
                if rank == 0:
                    print(f"{workload} round {r} {method}: {merged['samples_per_s']:.1f} samples/s, padding "
                          f"{merged['padding']:.2f}, val loss {merged['val_loss']:.3f}", flush=True)
    if rank == 0:
        meta = {"device": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
                "torch": torch.__version__, "world_size": world, "config": dataclasses.asdict(cfg),
                "params": params, "date": time.strftime("%Y-%m-%d"), "packing": packing}
        with open(out_json, "w") as f:
            json.dump({"meta": meta, "runs": runs}, f, indent=1)
    if world > 1:
        _dist().barrier()
        _dist().destroy_process_group()


# -- the report -----------------------------------------------------------------------------------------------------
def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]" if xs else "n/a"


def report(results: list[dict]) -> str:
    """Markdown: per world size and workload, each method's figures (median [min-max] over rounds), its ratio to
    Standard and to GMT per round, and the paper's figures beside them."""
    lines = []
    for res in results:
        meta, runs = res["meta"], res["runs"]
        lines += [f"## {meta['device']}, {meta['world_size']} rank(s), {meta['params'] / 1e6:.1f}M parameters "
                  f"({meta['config']['name']}; torch {meta['torch']}; {meta['date']})", "",
                  f"Padding-free: {meta['packing']}.", "",
                  "| workload | method | samples/s | / Standard-1 | / GMT | tokens/s | padding | peak GB | loader wait "
                  "| val loss | once |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for w in dict.fromkeys(r["workload"] for r in runs):
            mine = [r for r in runs if r["workload"] == w]
            by = {m: [r for r in mine if r["method"] == m] for m in METHODS}

            def ratio(m, ref):
                got = {r["round"]: r["samples_per_s"] for r in by[m]}
                return [got[r["round"]] / r["samples_per_s"] for r in by[ref] if r["round"] in got]
            for m in METHODS:
                rs = by[m]
                if not rs:
                    continue
                mem = [r["peak_mem_gb"] for r in rs if r["peak_mem_gb"] is not None]
                cells = [w, m, _spread([r["samples_per_s"] for r in rs]), _spread(ratio(m, "standard1")) + "x",
                         _spread(ratio(m, "gmt")) + "x", f"{statistics.median(r['tokens_per_s'] for r in rs):,.0f}",
                         f"{statistics.median(r['padding'] for r in rs):.2f}", f"{max(mem):.1f}" if mem else "n/a",
                         f"{statistics.median(r['wait_share'] for r in rs):.1%}",
                         f"{statistics.median(r['val_loss'] for r in rs):.3f}",
                         "yes" if all(r["exactly_once"] for r in rs) else "NO"]
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lo, hi = PAPER["odb_vs_standard_single_node"]
    lines += [f"The paper (NVIDIA H20, Qwen3-VL 2B/8B): ODB / Standard {lo}-{hi}x on one node; within 15% of the "
              "GMT/BMT oracles on UltraChat and LLaVA, faster on ShareGPT4o. Here: a randomly initialised "
              "text-only decoder on the same length distributions, one epoch per method and round; GMT, BMT and "
              "hf_rebalance exclude their length cache's build from samples/s (setup_s in the JSON)."]
    return "\n".join(lines) + "\n"


def _plot(results: list[dict], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    res = results[0]
    workloads = list(dict.fromkeys(r["workload"] for r in res["runs"]))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(METHODS)
    for k, m in enumerate(METHODS):
        ys = []
        for w in workloads:
            std = statistics.median(r["samples_per_s"] for r in res["runs"] if r["workload"] == w
                                    and r["method"] == "standard1")
            ys.append(statistics.median(r["samples_per_s"] for r in res["runs"] if r["workload"] == w
                                        and r["method"] == m) / std)
        ax.bar([i + k * width for i in range(len(workloads))], ys, width, label=m)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads)
    ax.set_ylabel("samples/s over Standard batch 1")
    ax.set_title(f"{res['meta']['device']}, {res['meta']['world_size']} rank(s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", name.lower().replace("nvidia", "")) or "cpu"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m paper_repro.gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-only", action="store_true", help="print what would run and its expected time")
    ap.add_argument("--toy", action="store_true", help="a tiny model and a few steps, on any device")
    ap.add_argument("--out", default=RESULTS, help="where the results go (default paper_repro/results)")
    ap.add_argument("--world-sizes", default=None, help="comma-separated, e.g. 1,2 (default: 1, and every GPU)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a torchrun rank: write this JSON
    a = ap.parse_args(argv)
    cfg = TOY if a.toy else FULL
    if a.worker:
        run(cfg, a.worker)
        return 0
    cuda = torch.cuda.is_available()
    gpus = torch.cuda.device_count() if cuda else 0
    sizes = [int(x) for x in a.world_sizes.split(",")] if a.world_sizes else ([1] + ([gpus] if gpus > 1 else []))
    p = plan(cfg, sizes)
    print(f"paper_repro.gpu ({cfg.name}): {p['params'] / 1e6:.1f}M parameters, {len(cfg.workloads)} workloads x "
          f"{len(METHODS)} methods x {cfg.rounds} rounds x world sizes {sizes} = {p['method_runs']} method runs; "
          f"train tokens per method run {p['train_tokens_per_method']}; expected about {p['estimated_s'] / 60:.1f} "
          f"min ({p['assumptions']}); device: {torch.cuda.get_device_name(0) if cuda else 'no CUDA'}")
    if a.plan_only:
        return 0
    if not cuda and not a.toy:
        print("paper_repro.gpu: no CUDA device here; the full run needs a GPU (use --toy to check the code path on "
              "this machine, --plan-only to see the plan)", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"gpu_{_slug(torch.cuda.get_device_name(0)) if cuda else 'cpu'}_{cfg.name}_"
                               f"{time.strftime('%Y%m')}")
    results = []
    t0 = time.perf_counter()
    for n in sizes:
        part = f"{stem}_n{n}.json"
        if n == 1 and "WORLD_SIZE" not in os.environ:
            run(cfg, part)
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
                   "-m", "paper_repro.gpu", "--worker", part] + (["--toy"] if a.toy else [])
            subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS",
                                                                                               "1")))
        with open(part) as f:
            results.append(json.load(f))
    with open(stem + ".json", "w") as f:
        json.dump({"results": results, "wall_s": time.perf_counter() - t0}, f, indent=1)
    plot = _plot(results, stem + ".png")
    with open(stem + ".md", "w") as f:
        f.write(f"# ODB on a GPU: the paper's headline measured (`python -m paper_repro.gpu`"
                f"{' --toy' if a.toy else ''})\n\n{report(results)}"
                + (f"\n![samples/s over Standard]({os.path.basename(plot)})\n" if plot
                   else "\nNo plot: matplotlib is not installed here.\n"))
    for part in (f"{stem}_n{n}.json" for n in sizes):
        os.remove(part)
    print(f"paper_repro.gpu: {time.perf_counter() - t0:.0f} s; wrote {stem}.md, .json" + (", .png" if plot else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
