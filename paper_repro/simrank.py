"""N ranks in one process, driven through the DGAP table, with an in-process collective.

Legend
    N        ranks; W window; mode "pad" | "join" | "quota"
    shard    the samples one rank's data source yields, in order (sizes tuples)
    round    every rank fills and posts, the collective completes, every rank
             returns and emits its batches

Every transition is ``odb.protocol.machine.step`` on ``odb.protocol.DGAP``; the
collective's inputs come from ``machine.collective_inputs``; the target handed
to the policy is the table's own ``Let("target")`` evaluated on those inputs.
Nothing here decides anything the table decides: this driver only plays the
environment (data source answers, the all-gather of headers + policy summaries)
and supplies the policy's choices (``use``, ``take``) inside the rows' bounds,
which ``machine.fire`` checks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from odb.batching import AlignmentPolicy, CostModel, call_partition, check_partition, default_policy
from odb.batching.deal import COST_SCALE, Dealer, intake_bound, policy_intake
from odb.errors import ProtocolError
from odb.protocol import DGAP, DONE, FILL, MODES, WAIT, Scope, evaluate, machine
from odb.protocol.expr import Let

__all__ = ["SimResult", "simulate"]


@dataclass
class SimResult:
    """``batches[rank][step]``: the (shard index) list of one batch, or None for a filler.

    In JOIN mode rows have different lengths (a finished rank emits nothing).
    ``unemitted[rank]`` lists shard indices never emitted (QUOTA only; empty otherwise).
    ``decision_s`` holds, per rank and round, the seconds spent in the policy
    (summarize + propose + partition).
    """

    batches: list[list[list[int] | None]]
    rounds: int
    unemitted: list[list[int]]
    decision_s: list[float] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)


def simulate(shards: Sequence[Sequence[tuple[int, ...]]], cost: CostModel, *, window: int, mode: str = "pad",
             policy: Callable[[], AlignmentPolicy] = default_policy, max_rounds: int = 10**7,
             deal: Sequence[tuple[int, ...]] | None = None, lead: int | None = None) -> SimResult:
    """Run N = len(shards) ranks to DONE through the table; return every rank's batches per step.

    With ``deal`` (the epoch's global order of sizes) the ``shards`` must be N
    empty lists: each rank's shard grows as `odb.batching.deal.Dealer` deals
    positions of ``deal`` after every round, and batches hold positions of
    ``deal``.  Each rank is topped up to its per-round bound
    (`odb.batching.deal.intake_bound` of what it posted, no prefetch), or, with
    ``lead``, to that fixed lead.

    Raises ProtocolError if a policy breaks the partition contract or the table
    rejects a choice, and RuntimeError past `max_rounds` (a hang guard).
    """
    table = DGAP
    n = len(shards)
    dealer = None
    if deal is not None:
        if any(len(s) for s in shards):
            raise ValueError("with deal=..., pass N empty shards")
        dealer = Dealer(len(deal), n, lead or window)
        posted: list[tuple[int, list[int]]] = [(0, [])] * n  # per rank: window size and intake sizes at the post
        shards = [[] for _ in range(n)]
        where: list[list[int]] = [[] for _ in range(n)]  # shard index -> position of deal

        def give(parts):
            for r, ps in enumerate(parts):
                where[r].extend(ps)
                shards[r].extend(deal[p] for p in ps)
        give(dealer.start())
        taken_cost = [0] * n
    pols = [policy() for _ in range(n)]
    cfg = {"W": window, "mode": MODES[mode], "header_len": 1 + pols[0].summary_len}
    locs = [machine.initial_local(table, cfg) for _ in range(n)]
    nxt = [0] * n                                   # next shard index of each rank's source
    win: list[list[int]] = [[] for _ in range(n)]  # shard indices in each rank's window
    out: list[list[list[int] | None]] = [[] for _ in range(n)]
    res = SimResult(out, 0, [[] for _ in range(n)])
    lets = table.let_map
    rounds = 0
    while not all(loc["ph"] == DONE for loc in locs):
        rounds += 1
        if rounds > max_rounds:
            raise RuntimeError(f"simulation did not finish within {max_rounds} rounds")
        headers, summaries, spent = [], [], [0.0] * n
        for r in range(n):
            shard = shards[r]
            def src(name, r=r, shard=shard):  # the FILL inputs: a simulated rank never quits
                if name == "quit":
                    return 0
                if name == "src_has":
                    if dealer is not None and nxt[r] >= len(shard) and not dealer.done:
                        raise ProtocolError(f"rank {r} ran out of dealt positions before the order was used up")
                    return nxt[r] < len(shard)
                raise ProtocolError(f"the simulated data source was asked for unknown input {name!r}")
            while True:
                st = machine.step(table, locs[r], src, cfg, _no_choice)
                locs[r] = st.after
                if st.effect == "fetch" and st.inputs.get("src_has"):
                    win[r].append(nxt[r])
                    if dealer is not None:
                        taken_cost[r] += round(cost.utilisation([shard[nxt[r]]]) * COST_SCALE)
                    nxt[r] += 1
                if st.effect == "post":
                    t0 = time.perf_counter()
                    window_sizes = [shard[i] for i in win[r]]
                    summaries.append(pols[r].summarize(window_sizes, cost, bool(locs[r]["x"])))
                    spent[r] += time.perf_counter() - t0
                    if dealer is not None and lead is None:
                        posted[r] = (len(win[r]), policy_intake(pols[r], window_sizes, cost, window))
                    headers.append(st.payload)
                    break
            assert locs[r]["ph"] == WAIT
        proposals = []
        for r in range(n):  # every rank computes the proposal from the same gathered summaries
            t0 = time.perf_counter()
            proposals.append(pols[r].propose(summaries, window))
            spent[r] += time.perf_counter() - t0
        if len(set(proposals)) != 1:
            raise ProtocolError(f"policy proposals differ across ranks for identical summaries: {proposals}")
        inputs = machine.collective_inputs(table, headers, proposals[0], cfg)
        target = int(evaluate(Let("target"), Scope(inputs=inputs, cfg=cfg, lets=lets)))
        res.targets.append(target)
        for r in range(n):
            _return_and_emit(table, r, locs, win, shards[r], pols[r], cost, inputs, cfg, target, out, spent,
                             summaries)
        res.decision_s.extend(spent)
        if dealer is not None:
            need = None if lead is not None else [intake_bound(window, k, u, target) for k, u in posted]
            give(dealer.deal(list(nxt), taken_cost, need=need))
    res.rounds = rounds
    if dealer is not None:
        res.batches = [[None if b is None else [where[r][i] for i in b] for b in row] for r, row in enumerate(out)]
    for r in range(n):
        res.unemitted[r] = list(win[r]) + list(range(nxt[r], len(shards[r])))
    return res


def _no_choice(row, choice, lo, hi, params):
    raise ProtocolError(f"row {row.name} asked for choice {choice.name} where the driver supplies none")


def _return_and_emit(table, r, locs, win, shard, pol, cost, inputs, cfg, target, out, spent,
                     summaries) -> None:
    groups: list[list[int]] = []

    def choose(row, choice, lo, hi, params):
        if choice.name == "use":
            real = lo  # the row's lower bound on `use` is the table's `real`
            window = [shard[i] for i in win[r]]
            t0 = time.perf_counter()
            parts = call_partition(pol, window, target, real, cost, summaries)
            spent[r] += time.perf_counter() - t0
            try:
                check_partition(parts, len(window), real, window, cost)
            except ValueError as e:
                raise ProtocolError(f"rank {r}: policy broke the partition contract: {e}") from e
            groups.extend(parts)
            return sum(len(g) for g in parts)
        if choice.name == "take":
            return len(groups[len(emitted)])
        raise ProtocolError(f"unknown choice {choice.name} of row {row.name}")

    emitted: list[list[int]] = []
    st = machine.step(table, locs[r], inputs, cfg, choose)
    locs[r] = st.after
    while locs[r]["ph"] not in (FILL, DONE):
        st = machine.step(table, locs[r], {}, cfg, choose)
        locs[r] = st.after
        if st.effect == "emit":
            g = groups[len(emitted)]
            emitted.append(g)
            out[r].append([win[r][p] for p in g])
        elif st.effect == "filler":
            out[r].append(None)
    if emitted:
        gone = {p for g in emitted for p in g}
        win[r] = [s for p, s in enumerate(win[r]) if p not in gone]
