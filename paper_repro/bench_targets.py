"""The benchmark's targets, as data, and the lines that say which are met (`target_lines`)."""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

__all__ = ["Target", "TARGETS", "NET_OF_SHARDS", "TARGET_VALUES", "BEATS", "REPORTED_ONLY", "target_lines"]

# The methods ODB must beat (issue 15), on `metrics`' step_time (a step lasts as long as its costliest
# batch): shuffled GMT, BMT, HF's BatchRebalanceSampler and Megatron's DP-balanced packing.  Karmarkar-Karp
# micro-batches (verl / OpenRLHF) are reported beside them, not a target, as the issue asks.
BEATS = ("gmt_shuffled", "bmt", "hf_rebalance", "dp_balanced")
REPORTED_ONLY = ("kk_micro",)

# the thresholds, as printed in the JSON report
TARGET_VALUES = {"straggler_eff": 0.97, "singletons_avoid": 0.02, "vs_gmt_256": 1.10, "vs_gmt_1024": 1.05,
                 "packed_budget_use": 0.95, "decision_ms_1024": 1.0, "step_time_vs_beats": 1.0, "beats": list(BEATS)}


class Target(NamedTuple):
    """One target: ``value(point, method figures)`` must satisfy ``ok`` at every point ``applies`` selects;
    ``lowest`` says whether the worst point is the lowest value (or the highest)."""

    label: str
    value: Callable[[dict, dict], float]
    ok: Callable[[float], bool]
    lowest: bool
    applies: Callable[[dict], bool]


def _key(k: str):
    return lambda r, m: m[k]


TARGETS: tuple[Target, ...] = (
    Target("straggler efficiency >= 0.97", _key("straggler_eff"), lambda x: x >= 0.97, True, lambda r: True),
    Target("avoidable singleton batches < 2%", _key("singletons_avoid"), lambda x: x < 0.02, False, lambda r: True),
    Target("steps <= 1.10 x GMT (W >= 256)", _key("vs_gmt"), lambda x: x <= 1.10, False, lambda r: r["window"] >= 256),
    Target("steps <= 1.05 x GMT (W = 1024)", _key("vs_gmt"), lambda x: x <= 1.05, False, lambda r: r["window"] >= 1024),
    Target("packed budget use >= 0.95", _key("budget_use"), lambda x: x >= 0.95, True, lambda r: r["cost"] == "packed"),
)
# the same targets with the fixed shards' imbalance taken out (see `paper_repro.bench`)
NET_OF_SHARDS: tuple[Target, ...] = (
    Target("straggler efficiency >= 0.97 where the fixed shards allow it (token ceiling >= 0.97)",
           _key("straggler_eff"), lambda x: x >= 0.97, True, lambda r: r["shard_token_ceiling"] >= 0.97),
    Target("straggler efficiency >= 0.97 x its own straggler ceiling",
           lambda r, m: m["straggler_eff"] / m["straggler_ceiling"], lambda x: x >= 0.97, True, lambda r: True),
    Target("steps <= 1.10 x the per-shard lower bound (W >= 256)", _key("vs_shard_lb"), lambda x: x <= 1.10, False,
           lambda r: r["window"] >= 256),
    Target("packed budget use >= 0.95 x the fixed shards' ceiling",
           lambda r, m: m["budget_use"] / r["packed_use_ceiling"], lambda x: x >= 0.95, True,
           lambda r: r["cost"] == "packed"),
)


def target_lines(results: list[dict], micro: dict, released: Sequence[dict] = ()) -> list[str]:
    """One line per target: met or missed, with the worst grid point, for ODB with fixed and with dealt shards."""

    def where(r):
        return f"{r['dist']} N={r['world']} W={r['window']} B={r['budget']} {r['cost']}"

    def tally(value, ok, lowest, pts):
        parts = []
        for name, label in (("odb", "fixed"), ("odb_dealt", "dealt")):
            vals = [(value(r, r["methods"][name]), r) for r in pts]
            v, r = (min if lowest else max)(vals, key=lambda t: t[0])
            bad = sum(1 for x, _ in vals if not ok(x))
            parts.append(f"{label} {'MET' if not bad else f'MISSED at {bad}/{len(vals)} points'}, "
                         f"worst {v:.3f} ({where(r)})")
        return "; ".join(parts)

    lines = []

    def add(targets):
        for t in targets:
            pts = [r for r in results if t.applies(r)]
            if pts:
                lines.append(f"- {t.label}: {tally(t.value, t.ok, t.lowest, pts)}")

    add(TARGETS)
    worlds = sorted({r["world"] for r in results})
    if len(worlds) > 1:
        def missed(n, name):
            return sum(1 for r in results if r["world"] == n and r["methods"][name]["straggler_eff"] < 0.97)
        lines.append("  - straggler efficiency >= 0.97 missed, by world size: " + ", ".join(
            f"N={n}: fixed {missed(n, 'odb')}, dealt {missed(n, 'odb_dealt')} of "
            f"{sum(1 for r in results if r['world'] == n)}" for n in worlds))
    infeasible = sum(1 for r in results if r["shard_token_ceiling"] < 0.97)
    lines.append(f"- fixed shards whose token ceiling alone is below 0.97 (no policy can reach 0.97 straggler "
                 f"efficiency on a packed cost there; dealt shards have no such ceiling): "
                 f"{infeasible}/{len(results)} points")
    add(NET_OF_SHARDS)
    fewer = [sum(1 for r in results if r["methods"][name]["steps"] < r["methods"]["release_reimpl"]["steps"])
             for name in ("odb", "odb_dealt")]
    better = [sum(1 for r in results
                  if r["methods"][name]["straggler_eff"] > r["methods"]["release_reimpl"]["straggler_eff"])
              for name in ("odb", "odb_dealt")]
    lines.append(f"- strictly fewer steps than the release algorithm (re-implemented, fixed shards): "
                 f"fixed {fewer[0]}/{len(results)}, dealt {fewer[1]}/{len(results)} points")
    lines.append(f"- higher straggler efficiency than the release algorithm: "
                 f"fixed {better[0]}/{len(results)}, dealt {better[1]}/{len(results)} points")
    ok = [e for e in released if "error" not in e["package"]]
    if released:
        both = [sum(1 for e in ok if e[name]["steps"] < e["package"]["steps"]
                    and e[name]["straggler_eff"] > e["package"]["straggler_eff"]) for name in ("odb", "odb_dealt")]
        lines.append(f"- strictly fewer steps AND higher straggler efficiency than the RELEASED PACKAGE itself "
                     f"(measured, section below): fixed {both[0]}/{len(released)}, dealt {both[1]}/{len(released)} "
                     f"points ({len(released) - len(ok)} package runs failed)")
    for peer in BEATS + REPORTED_ONLY:
        def ratio(r, m, peer=peer):
            return m["step_time"] / r["methods"][peer]["step_time"]
        if peer in BEATS:
            verdict = f"ODB must beat {peer}, step time <= its: {tally(ratio, lambda x: x <= 1.0, False, results)}"
        else:
            verdict = f"reported, not a target: step time <= {peer}'s at " + ", ".join(
                f"{label} {sum(1 for r in results if ratio(r, r['methods'][name]) <= 1.0)}/{len(results)}"
                for name, label in (("odb", "fixed"), ("odb_dealt", "dealt"))) + " points"

        def wins(k, op, peer=peer):
            return ", ".join(f"{label} {sum(1 for r in results if op(r['methods'][name][k], r['methods'][peer][k]))}"
                             for name, label in (("odb", "fixed"), ("odb_dealt", "dealt")))
        lines.append(f"- {verdict}; fewer steps: {wins('steps', lambda a, b: a < b)}; higher straggler "
                     f"efficiency: {wins('straggler_eff', lambda a, b: a > b)} (of {len(results)} points)")
    # context: the offline oracles (exact length cache, global or bucketed sort) on the straggler target
    for name, label in (("gmt", "GMT"), ("bmt", "BMT")):
        vals = [(r["methods"][name]["straggler_eff"], r) for r in results]
        v, r = min(vals, key=lambda t: t[0])
        bad = sum(1 for x, _ in vals if x < 0.97)
        lines.append(f"- for comparison, the offline oracle {label} (exact length cache) on straggler efficiency "
                     f">= 0.97: missed at {bad}/{len(vals)} points, worst {v:.3f} ({where(r)})")
    worst_key = max(micro, key=lambda k: micro[k]["median_ms"])
    worst_ms = micro[worst_key]["median_ms"]
    line = (f"- decision time per round, 1024-sample window, 64 ranks: median {worst_ms:.3f} ms (worst: {worst_key}) "
            f"-> {'MET' if worst_ms < 1.0 else 'MISSED'} (< 1 ms); the policy is the same with fixed and dealt shards")
    big = [r for r in results if r["window"] >= 1024]
    if big:
        line += "; worst mean per round in the grid at W = 1024: " + ", ".join(
            f"{label} {max(r['methods'][name]['decision_ms'] for r in big):.3f} ms"
            for name, label in (("odb", "fixed"), ("odb_dealt", "dealt")))
    lines.append(line)
    return lines
