"""Checks of the explicit engine itself: the fast successors and the symmetry reduction.

Legend
    succ      `models.env.Model.successors` (the generic, unreduced semantics)
    fast      `fast.FastModel.successors` (memoised, symmetry-reduced)
    canon     `SysState.canon` (sort the rank tuples); pi a rank permutation

Three verdicts per mode, at small scopes with and without quits (every state,
every permutation; the quit scopes exercise ``Model.quit_successors``):

``fast_successors_match_model``
    for every reachable reduced state s: fast(s) == {canon(t) for t in succ(s)}
``symmetry_self_test``
    for every reachable unreduced state s and every pi:
    {canon(t) for t in succ(s)} == {canon(t) for t in succ(pi(s))}
``symmetry_reduction_sound``
    reduced and unreduced runs have the same states up to permutation, the
    same sinks, the same verdicts and the same longest path
"""

from __future__ import annotations

import itertools
import time

from models.env import SysState
from odb.protocol.table import DGAP, Table

from ..verdict import Verdict
from .explore import MODE_NAMES, explore

__all__ = ["fast_matches_model", "symmetry_self_test", "reduction_sound", "selfcheck_verdicts"]

METHOD = "explicit engine self-check"


def fast_matches_model(n: int, d_max: int, w: int, mode: int, *, table: Table = DGAP,
                       quits: int = 0) -> tuple[int, list]:
    """(states checked, mismatches[:3]) for every reachable reduced state."""
    r = explore(n, d_max, w, mode, table=table, quits=quits)
    fm, bad = r.fm, []
    for s in r.states_list:
        fast = {t for _, _, _, t in fm.successors(s)}
        generic = {fm.from_sys(t) for _, t in fm.model.successors(fm.to_sys(s))}
        if fast != generic and len(bad) < 3:
            bad.append((fm.to_sys(s), len(fast), len(generic)))
    return r.states, bad


def _permute(s: SysState, pi: tuple[int, ...]) -> SysState:
    return SysState(s.table_fields, tuple(s.ranks[p] for p in pi), s.k, s.mb, s.cfg_items)


def symmetry_self_test(n: int, d_max: int, w: int, mode: int, *, table: Table = DGAP,
                       quits: int = 0) -> tuple[int, list]:
    """(pairs checked, mismatches[:3]) over every reachable unreduced state and every permutation."""
    r = explore(n, d_max, w, mode, table=table, symmetry=False, quits=quits)
    model, bad, pairs = r.model, [], 0
    perms = list(itertools.permutations(range(n)))[1:]
    for s in r.states_list:
        base = {t.canon() for _, t in model.successors(s)}
        for pi in perms:
            pairs += 1
            if {t.canon() for _, t in model.successors(_permute(s, pi))} != base and len(bad) < 3:
                bad.append((s, pi))
    return pairs, bad


def _summary(r) -> dict:
    return {"always_fail": sorted(r.always_fail), "sometimes": sorted(r.sometimes_found),
            "deadlock": r.num_deadlocks > 0, "cycle": r.cycle is not None, "traps": r.num_traps > 0,
            "nondet": bool(r.nondeterministic), "empty": bool(r.empty_batches), "longest_path": r.longest_path,
            "per_vector": {d: (e["max_rounds"], e["min_rounds"], e["longest"]) for d, e in r.per_vector.items()}}


def reduction_sound(n: int, d_max: int, w: int, mode: int, *, table: Table = DGAP, quits: int = 0) -> tuple[dict, list]:
    """(figures, differences) between the reduced and the unreduced run."""
    red = explore(n, d_max, w, mode, table=table, quits=quits)
    full = explore(n, d_max, w, mode, table=table, symmetry=False, quits=quits)
    fm = red.fm
    diffs = []
    if {fm.from_sys(s) for s in full.states_list} != set(red.states_list):
        diffs.append("reachable states differ up to permutation")
    red_sinks = {red.states_list[i] for i in red.sink_list}
    if {fm.from_sys(full.states_list[i]) for i in full.sink_list} != red_sinks:
        diffs.append("sinks differ up to permutation")
    a, b = _summary(red), _summary(full)
    diffs += [f"{k}: reduced {a[k]} vs unreduced {b[k]}" for k in a if a[k] != b[k]]
    return {"reduced_states": red.states, "unreduced_states": full.states,
            "longest_path": red.longest_path}, diffs


# (check, N max, D max, W, quits): the unreduced runs use the generic successors and grow fast with N.
SELFCHECK_SCOPES = (("fast_successors_match_model", 3, 2, 2, 0), ("fast_successors_match_model", 2, 3, 2, 0),
                    ("fast_successors_match_model", 3, 1, 2, 2), ("fast_successors_match_model", 2, 2, 2, 1),
                    ("symmetry_self_test", 2, 3, 2, 0), ("symmetry_self_test", 2, 2, 2, 1),
                    ("symmetry_reduction_sound", 2, 3, 2, 0), ("symmetry_reduction_sound", 3, 1, 2, 1))


def selfcheck_verdicts(scopes=SELFCHECK_SCOPES, modes=(0, 1, 2), *, table: Table = DGAP) -> list[Verdict]:
    """The self-check verdicts per mode and scope (see the module docstring)."""
    out = []
    fns = {"fast_successors_match_model": fast_matches_model, "symmetry_self_test": symmetry_self_test,
           "symmetry_reduction_sound": reduction_sound}
    for mode in modes:
        m = MODE_NAMES[mode]
        for name, n_max, d_max, w, quits in scopes:
            fn = fns[name]
            scope = f"N<={n_max}, D<={d_max}, W={w}" + (f", quits<={quits}" if quits else "")
            t0 = time.perf_counter()
            count, bad, extra = 0, [], {}
            for n in range(1, n_max + 1):
                figures, b = fn(n, d_max, w, mode, table=table, quits=quits)
                if isinstance(figures, dict):
                    extra[n] = figures
                    count += figures["unreduced_states"]
                else:
                    count += figures
                bad += [(n, x) for x in b]
            per_n = {k: (v["reduced_states"], v["unreduced_states"]) for k, v in extra.items()}
            detail = (f"{len(bad)} mismatches, first: {bad[0]}" if bad else
                      {"fast_successors_match_model": f"equal on all {count} reachable reduced states",
                       "symmetry_self_test": f"equal on all {count} (state, permutation) pairs",
                       "symmetry_reduction_sound": "same states, sinks, verdicts and longest path "
                                                   f"(reduced/unreduced states per N: "
                                                   f"{per_n})"}[name])
            out.append(Verdict(name, METHOD, scope, m, "failed" if bad else "holds",
                               round(time.perf_counter() - t0, 3), count, None, detail))
    return out
