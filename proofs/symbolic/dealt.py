"""z3 proofs, for every number of ranks, of the reserve-class arithmetic of `odb.batching.deal.Dealer`.

Legend
    N        ranks (symbolic, N >= 1); ``total`` positions; ``cursor`` in [0, total]
    class r  positions ``total - 1 - (N k + r)``, k >= 0, 0 <= r < N (`Dealer.reserve_position`)
    s(r)     reserve takes of rank r (``Dealer.reserve[r]``, an uninterpreted function >= 0):
             rank r took the class positions k = 0 .. s(r) - 1 (`DealtOrder.key` takes them in order)
    span     ``total - 1 - cursor``; ``c_r`` the closed form's class count
             ``(span - r) // N + 1`` if ``span >= r`` else 0 (`Dealer.left`)

z3's ``div``/``mod`` are Euclidean; for a divisor N >= 1 and a dividend >= 0 (every use below)
they equal Python's ``//`` and ``%``.  Each obligation is one or a few z3 queries that must be
``unsat`` (with a timeout; ``unknown`` is a failure), and each query's hypotheses alone must be
``sat`` (else the claim is vacuous):

    reserve_classes_are_disjoint       N k + r = N k' + r' with 0 <= r, r' < N forces k = k' and
                                       r = r': no position lies in two classes, or twice in one
    reserved_at_is_exactly_the_takes   ``_reserved_at(p)`` (``(total-1-p) // N < s((total-1-p) % N)``)
                                       holds for 0 <= p < total iff p is one of the taken
                                       positions ``total - 1 - (N k + r)``, k < s(r): the skip
                                       steps over exactly the reported reserve takes
    left_class_count_is_exact          for each class r: the class positions at or past the cursor
                                       are exactly k in [0, c_r), and those also reserve-taken
                                       exactly k < min(s(r), c_r): the summand of `Dealer.left`
    a_used_up_class_stays_used_up      once ``reserve_position(r, k)`` lies below the cursor
                                       (None: the rank is dry), so does every later one, k' >= k,
                                       and the cursor only grows: a dry rank stays dry
    every_rank_dry_leaves_nothing      if every rank's next reserve position lies below the cursor
                                       (every rank dry), every position at or past the cursor is
                                       reserve-taken: nothing is left undealt (``Dealer.left == 0``)

Not proved here: that `Dealer.left`'s sum over the N classes adds up their counts (the classes
partition the positions at or past the cursor by the first two obligations, so the count of
reserve-taken ones is the sum of the per-class counts; the sum itself is over a symbolic number of
terms and is argued by hand), and that the Python source computes these expressions (the z3 terms
restate them).  Both are checked instead on concrete values: `tests/test_dealt.py` compares
`Dealer.left` with ``len(Dealer.undealt())`` for every N <= 4, total <= 10, cursor and reserve
vector, and the explicit dealt model checks it in every reachable state
(``left_counts_the_undealt_positions``).
"""

from __future__ import annotations

import time
from typing import Callable

import z3

from ..verdict import Verdict

__all__ = ["DEALER_SCOPE", "OBLIGATIONS", "prove_dealer", "class_count"]

DEALER_SCOPE = "all N>=1, total>=0, cursor in [0, total], reserve counts s(r)>=0"
METHOD = "z3 all-N (dealer arithmetic)"
TIMEOUT_MS = 10_000


def class_count(span, r, n):
    """`Dealer.left`'s summand before the min: class r's positions at or past the cursor."""
    return z3.If(span >= r, (span - r) / n + 1, 0)


def _ints(*names):
    return [z3.Int(x) for x in names]


def _disjoint(count) -> list[tuple[str, list]]:
    n, k, k2, r, r2 = _ints("N", "k", "k2", "r", "r2")
    base = [n >= 1, k >= 0, k2 >= 0, 0 <= r, r < n, 0 <= r2, r2 < n, n * k + r == n * k2 + r2]
    return [("N k + r = N k' + r' => k = k' and r = r'", base, z3.Or(k != k2, r != r2))]


def _reserved_at(count) -> list[tuple[str, list]]:
    n, total, p, k, r = _ints("N", "total", "p", "k", "r")
    s = z3.Function("s", z3.IntSort(), z3.IntSort())
    q = total - 1 - p
    reserved = q / n < s(q % n)
    take = [0 <= r, r < n, 0 <= k, k < s(r), p == total - 1 - (n * k + r)]
    base = [n >= 1, 0 <= p, p < total]
    return [
        ("a taken position is recognised: k < s(r), p = total-1-(N k + r) => _reserved_at(p)",
         base + take, z3.Not(reserved)),
        ("a recognised position was taken: _reserved_at(p) => p = total-1-(N k + r) with k = q // N < s(r), "
         "r = q % N", base + [reserved], z3.Not(z3.And(0 <= q % n, q % n < n, 0 <= q / n, q / n < s(q % n),
                                                       p == total - 1 - (n * (q / n) + q % n)))),
    ]


def _left(count) -> list[tuple[str, list]]:
    n, total, cursor, r, k, sr = _ints("N", "total", "cursor", "r", "k", "s_r")
    span = total - 1 - cursor
    c = count(span, r, n)
    base = [n >= 1, total >= 0, 0 <= cursor, cursor <= total, 0 <= r, r < n, k >= 0, sr >= 0]
    at_or_past = n * k + r <= span  # the class position total-1-(N k + r) is >= cursor
    return [
        ("class r's positions at or past the cursor are exactly k in [0, c_r)", base, at_or_past != (k < c)),
        ("c_r >= 0", base, c < 0),
        ("those reserve-taken are exactly k < min(s(r), c_r)", base,
         z3.And(k < sr, at_or_past) != (k < z3.If(sr < c, sr, c))),
    ]


def _stays_dry(count) -> list[tuple[str, list]]:
    n, total, cursor, cursor2, r, k, k2 = _ints("N", "total", "cursor", "cursor2", "r", "k", "k2")
    pos = lambda kk: total - 1 - (n * kk + r)  # noqa: E731
    base = [n >= 1, 0 <= r, r < n, 0 <= k, k <= k2, 0 <= cursor, cursor <= cursor2, pos(k) < cursor]
    return [("reserve_position(r, k) < cursor, k' >= k, cursor' >= cursor => reserve_position(r, k') < cursor'",
             base, pos(k2) >= cursor2)]


def _all_dry(count) -> list[tuple[str, list]]:
    n, total, cursor, p, j = _ints("N", "total", "cursor", "p", "j")
    s = z3.Function("s", z3.IntSort(), z3.IntSort())
    dry = z3.ForAll([j], z3.Implies(z3.And(0 <= j, j < n),
                                    z3.And(s(j) >= 0, total - 1 - (n * s(j) + j) < cursor)))
    q = total - 1 - p
    return [("every rank dry => every position p in [cursor, total) is _reserved_at",
             [n >= 1, 0 <= cursor, cursor <= total, cursor <= p, p < total, dry], z3.Not(q / n < s(q % n)))]


OBLIGATIONS: tuple[tuple[str, Callable], ...] = (
    ("reserve_classes_are_disjoint", _disjoint),
    ("reserved_at_is_exactly_the_takes", _reserved_at),
    ("left_class_count_is_exact", _left),
    ("a_used_up_class_stays_used_up", _stays_dry),
    ("every_rank_dry_leaves_nothing", _all_dry),
)


def _check(assertions: list, timeout_ms: int) -> tuple[str, z3.Solver]:
    sv = z3.Solver()
    sv.set("timeout", timeout_ms)
    sv.add(*assertions)
    return str(sv.check()), sv


def prove_dealer(count: Callable = class_count, timeout_ms: int = TIMEOUT_MS) -> list[Verdict]:
    """One verdict per obligation (module docstring); `count` is the closed form under test."""
    out = []
    for name, build in OBLIGATIONS:
        t0 = time.perf_counter()
        failures, queries = [], 0
        for what, hyps, negated in build(count):
            # two fresh solvers: z3's incremental mode uses other (weaker) tactics for nonlinear arithmetic
            vac = _check(hyps, timeout_ms)[0]  # the hypotheses alone must be satisfiable, or the claim is vacuous
            got, sv = _check(hyps + [negated], timeout_ms)
            queries += 2
            if vac != "sat":
                failures.append(f"- {what}: hypotheses {vac}, wanted sat (a vacuous claim proves nothing)")
            if got == "unknown":
                failures.append(f"- {what}: unknown (z3: {sv.reason_unknown()})")
            elif got == "sat":
                m = sv.model()
                ce = ", ".join(f"{d.name()}={m[d]}" for d in sorted(m.decls(), key=str) if d.arity() == 0)
                failures.append(f"- {what}: sat, counterexample {ce}")
        res = "proved" if not failures else "unknown" if all(": unknown" in f for f in failures) else "failed"
        detail = (f"{queries // 2} claims, each unsat with satisfiable hypotheses" if not failures
                  else "\n".join(failures))
        out.append(Verdict(name, METHOD, DEALER_SCOPE, "all", res, round(time.perf_counter() - t0, 3),
                           detail=detail, extra={"queries": queries}))
    return out
