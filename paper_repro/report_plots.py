"""The PNG plots of `make repro`, each showing its spread: medians with min-max bars over rounds
(measured) or the mean with the sd over seeds (simulated).  Called by `paper_repro.report`."""

from __future__ import annotations

import os

from . import repro_stats as st

__all__ = ["write_plots"]

COLORS = {"odb_pad": "C0", "odb_join": "C1", "gmt": "C2", "bmt": "C3", "standard1": "C4", "standardB": "C5",
          "standard1_noacc": "C6"}


def _bars(s: dict) -> tuple[float, list[list[float]]]:
    return s["med"], [[s["med"] - s["lo"]], [s["hi"] - s["med"]]]


def _speedup(plt, outdir, runs, sim, names) -> str:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    pts = [(run["spec"]["paper_cv"], run) for run in runs if run["spec"].get("paper_cv") and not run["spec"].get("lora")
           and run["spec"]["net"].get("impl") != "hf"]
    for k, m in enumerate(("odb_pad", "odb_join", "gmt", "bmt", "standard1_noacc")):
        for cv, run in pts:
            s = st.spread(st.paired(run, m, "standard1"))
            if s is None:
                continue
            y, err = _bars(s)
            ax.errorbar(cv + 0.012 * (k - 2), y, yerr=err, fmt="o", color=COLORS[m], capsize=3,
                        label=names[m] if cv == min(c for c, r in pts if st.paired(r, m, "standard1")) else None)
        xy = sorted((cv, st.spread(st.paired(run, m, "standard1"))) for cv, run in pts)
        xy = [(x, s["med"]) for x, s in xy if s]
        if len(xy) > 1:
            ax.plot(*zip(*xy), "-", color=COLORS[m], lw=0.8)
    ax.axhline(1, color="grey", lw=0.5)
    ax.set_xlim(0.2, 1.1)
    ax.set_title("measured, 2 CPU ranks (median, bars: min-max over rounds)", fontsize=8)
    ax.set_xlabel("CV of post-pipeline length")
    ax.set_ylabel("samples/s vs Standard batch 1 (accum.)")
    ax.legend(fontsize=7)
    if sim and sim.get("rows"):
        for n, mk in ((8, "s"), (16, "^"), (64, "D")):
            rows = sorted((r for r in sim["rows"] if r["world_size"] == n), key=lambda r: r["cv"])
            if rows:
                bx.errorbar([r["cv"] for r in rows], [r["odb_pad_vs_standard"] for r in rows],
                            yerr=[r.get("odb_pad_vs_standard_sd", 0) for r in rows], fmt=mk + "--", capsize=3,
                            label=f"ODB pad / Standard, N={n}")
        bx.axhline(1, color="grey", lw=0.5)
        bx.set_title("predicted, H20 cluster model (mean, bars: sd over seeds)", fontsize=8)
        bx.set_xlabel("CV of post-pipeline length")
        bx.set_ylabel("samples/s vs Standard batch 1 (no accum.)")
        bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "speedup_vs_cv.png"), dpi=110)
    plt.close(fig)
    return "speedup_vs_cv.png"


def _rounds(plt, outdir, runs, names) -> str:
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(runs)), 4))
    ms = [m for m in COLORS if any(st.repeats(r, m) for r in runs)]
    for i, run in enumerate(runs):
        for k, m in enumerate(ms):
            recs = st.repeats(run, m)
            if not recs:
                continue
            x = i + 0.8 * (k - (len(ms) - 1) / 2) / len(ms)
            ys = [r["samples_per_s"] for r in recs]
            ax.plot([x] * len(ys), ys, ".", color=COLORS[m], ms=5, label=names[m] if i == 0 else None)
            med = st.spread(ys)["med"]
            ax.plot([x - 0.04, x + 0.04], [med, med], "-", color=COLORS[m], lw=2)
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels([r["spec"]["name"] for r in runs], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("samples/s (dots: rounds; bar: median)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "throughput_rounds.png"), dpi=110)
    plt.close(fig)
    return "throughput_rounds.png"


def _padding(plt, outdir, runs, names) -> str:
    fig, ax = plt.subplots(figsize=(6, 4))
    ms = ("standardB", "gmt", "bmt", "odb_pad", "odb_join")  # Standard-1 pads nothing
    for k, m in enumerate(ms):
        ys = []
        for run in runs:
            recs = st.repeats(run, m)
            ys.append(1 - recs[0]["real_tokens"] / max(1, recs[0]["padded_tokens"]) if recs else 0)
        ax.bar([i + 0.15 * k for i in range(len(runs))], ys, width=0.15, label=names[m], color=COLORS[m])
    ax.set_xticks([i + 0.3 for i in range(len(runs))])
    ax.set_xticklabels([r["spec"]["name"] for r in runs], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("padding fraction of padded tokens (identical every round)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "padding.png"), dpi=110)
    plt.close(fig)
    return "padding.png"


def _loss(plt, outdir, runs, names) -> str | None:
    run = next((r for r in runs if r["spec"]["name"] == "sharegpt4o_full"), runs[0] if runs else None)
    if run is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in run["methods"]:
        recs = st.repeats(run, m)
        if not recs or not recs[0].get("curve"):
            continue
        xs, ys = zip(*recs[0]["curve"])
        k = max(1, len(ys) // 30)
        sm = [sum(ys[i:i + k]) / len(ys[i:i + k]) for i in range(0, len(ys), k)]
        ax.plot(xs[::k][:len(sm)], sm, label=f"{names.get(m, m)} train", color=COLORS.get(m))
        vx, vy = zip(*recs[0]["val_loss"])
        ax.plot(vx, vy, "k.", ms=4)
    ax.set_xlabel("samples seen (global)")
    ax.set_ylabel("loss per label token (dots: validation)")
    ax.set_title(run["spec"]["name"] + " (round 0; every round emits the same steps)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "loss_curves.png"), dpi=110)
    plt.close(fig)
    return "loss_curves.png"


def write_plots(outdir: str, runs: list[dict], sim: dict, names: dict) -> list[str]:
    """Write every plot; returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = [_speedup(plt, outdir, runs, sim, names)]
    if runs:
        made += [_rounds(plt, outdir, runs, names), _padding(plt, outdir, runs, names)]
    loss = _loss(plt, outdir, runs, names)
    return made + ([loss] if loss else [])
