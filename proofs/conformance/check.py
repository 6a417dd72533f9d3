"""Trace conformance: replay real runtime traces through the table's own interpreter.

Legend
    run      one pass of one loader: the files ``L<loader>_it<pass>_rank<r>.jsonl`` of every rank
    event    one JSON line of a rank's trace: a fired row, a ``local_error`` (recorded; the rank goes on to the abort
             round) or a ``failure`` (the error that ended the rank's thread)
    round    the index of a header collective (0, 1, ...)

Aborts are ordinary rows of the table (``post_header`` posts ``st = in.quit``, ``return_abort`` fires on
``max_st > 0``), so they are replayed like every other row.  A run conforms when, for every rank:

1. **Local replay.** The first state is ``machine.initial_local``; each event's ``before`` is the previous event's
   ``after``; exactly one row is enabled at ``before`` under the event's recorded inputs (``machine.enabled_rows``)
   and it is the logged row; ``machine.fire`` with the logged choices reproduces ``after``, the effect, the posted
   payload (``n`` and ``st``) and the emitted count.  The ``quit`` a rank reads goes from 0 to one non-zero value at
   most once, and after a ``local_error`` the next read of ``quit`` is non-zero.
2. **Collectives.** Each rank posted rounds 0, 1, 2, ... in order and collected each round it posted; for every
   collected round every rank posted; the headers each rank received (``st``, ``n``, shape, summary, round slot)
   equal the payloads the ranks posted; the collective inputs each rank read (``max_st`` included) equal
   ``machine.collective_inputs`` recomputed from those payloads; all ranks got the same proposal, within the table's
   proposal bounds, and (for the default policy) equal to ``odb.core.round_proposal`` of the posted summaries
   (``policy.propose``, or the table's lower bound in an abort round).  The replicated fields each rank received
   (``epoch`` and the digest: dealer CRC, previous target, previous proposal; `odb.core.header.REPLICATED`) equal
   what the ranks posted, agree across ranks, and the digest's target and proposal equal the previous round's as
   recomputed here (the table's ``Let("target")`` on the collective inputs).  Ranks that finished agree on
   ``aborted``.
3. **TraceMatched.** Every line is consumed; nothing follows a ``failure``; every rank's trace ends in DONE, unless
   it ends with a ``failure`` line or the rank is known to have been killed (`died`).
5. **Exchange** (cfg ``xchg = 1``, the round exchange).  The fills each rank received equal what the ranks posted (a
   pool's: lane 0's); the round a collect planned has the target recomputed here for the round before; and each
   rank sent exactly the batches, and received exactly the ones, that ``odb.batching.exchange.exchange_plan``
   gives for the received fills (rank_fills; pooled, only the batches that leave their pool: a pool's replicas
   hold its batches), every send arriving at its receiver with the same positions.
4. **Happens-before.** The events of all ranks, in program order and joined by an edge from every rank's post to
   every rank's collect of each collective, form an acyclic graph in which all ranks' collectives line up in one
   total order (`hb.happens_before`, networkx).  Its critical path (collectives and events on the longest causal
   chain) is reported in ``RunReport.critical_path``.

Nothing here re-implements a row: guards, updates and decisions come from `odb.protocol.machine`.
"""
from __future__ import annotations

import glob
import json
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from odb.batching.exchange import exchange_plan, rank_fills
from odb.core.header import REPLICATED
from odb.core.replica import round_proposal, round_target
from odb.protocol import machine
from odb.protocol.expr import Scope, evaluate
from odb.protocol.table import DGAP, DONE, Table

from .hb import happens_before

__all__ = ["RunReport", "check_run", "check_dir", "assert_conformant"]

_NAME = re.compile(r"^L(\d+)_it(\d+)_rank(\d+)\.jsonl$")


@dataclass
class RunReport:
    """The verdict on one run.  ``ok`` only if `problems` is empty."""

    name: str
    world_size: int
    events: int = 0
    rounds: int = 0
    aborted: bool = False                                # some rank fired return_abort
    rows: Counter = field(default_factory=Counter)
    local_errors: list = field(default_factory=list)     # recorded local errors (the run went on to abort)
    failures: list = field(default_factory=list)         # errors that ended a rank's thread
    problems: list = field(default_factory=list)
    critical_path: dict | None = None                    # `hb.HappensBefore.summary` (None: HB has a cycle)

    @property
    def ok(self) -> bool:
        return not self.problems


def _load(path: str) -> tuple[dict, list[dict]]:
    with open(path, encoding="ascii") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines or "meta" not in lines[0]:
        raise ValueError(f"{path}: the first line must be the meta record")
    return lines[0]["meta"], lines[1:]


@dataclass
class _Rank:
    """What one rank's replay leaves for the cross-rank checks."""

    posts: list = field(default_factory=list)      # (round, payload, summary, event index, replicated)
    collects: list = field(default_factory=list)   # (round, collective record, inputs read, event index)
    fills: dict = field(default_factory=dict)      # the exchange: round -> the fills it posted
    moves: dict = field(default_factory=dict)      # the exchange: round -> (event index, its transfer record)
    final: dict | None = None                      # the last replayed state
    cut: bool = False                              # ended by a failure line or killed: may stop mid-round
    killed: bool = False                           # killed on purpose (`died`): its trace may end before a line


def _replay_rank(table: Table, rank: int, meta: dict, events: list[dict], rep: RunReport, died: bool) -> _Rank:
    cfg = meta["cfg"]
    out = _Rank(cut=died, killed=died)
    local = machine.initial_local(table, cfg)
    failed = False
    quit_seen = 0          # the non-zero quit this rank read, once it read one
    quit_due = False       # a local_error was recorded: the next read of quit must be non-zero
    for i, ev in enumerate(events):
        where = f"rank {rank} event {i}"
        if failed:
            rep.problems.append(f"{where}: {ev.get('row', sorted(ev))} after the failure that ended the rank")
            continue
        if "failure" in ev:
            failed = out.cut = True
            rep.failures.append(f"rank {rank}: {ev['failure'][:200]}")
            continue
        if "local_error" in ev:
            quit_due = True
            rep.local_errors.append(f"rank {rank}: {ev['local_error'][:200]}")
            continue
        if "row" not in ev:
            rep.problems.append(f"{where}: unknown event {sorted(ev)}")
            continue
        if ev.get("table") != table.hash:
            rep.problems.append(f"{where}: table hash {ev.get('table')} != {table.hash}")
        if ev["before"] != local:
            rep.problems.append(f"{where}: before {ev['before']} != replayed state {local}")
            return out
        try:
            enabled = [r.name for r in machine.enabled_rows(table, ev["before"], ev["inputs"], cfg)]
        except KeyError as e:
            rep.problems.append(f"{where}: a guard reads an input the trace does not record: {e}")
            return out
        if enabled != [ev["row"]]:
            rep.problems.append(f"{where}: logged row {ev['row']} but the table enables {enabled}")
            return out
        try:
            st = machine.fire(table, table.row(ev["row"]), ev["before"], ev["inputs"], cfg, ev["params"])
        except Exception as e:  # ProtocolError: a choice out of its contract
            rep.problems.append(f"{where}: {type(e).__name__}: {e}")
            return out
        for key, got in (("after", st.after), ("effect", st.effect), ("payload", st.payload), ("count", st.count)):
            if ev[key] != got:
                rep.problems.append(f"{where}: {ev['row']} logged {key}={ev[key]} but the table gives {got}")
        if "quit" in ev["inputs"]:
            q = ev["inputs"]["quit"]
            if quit_due and q == 0:
                rep.problems.append(f"{where}: read quit=0 after a local error (the rank must stop)")
            if quit_seen and q != quit_seen:
                rep.problems.append(f"{where}: read quit={q} after quit={quit_seen} (quit is set once)")
            quit_seen = quit_seen or q
        if st.effect == "post":
            out.posts.append((ev["round"], ev["payload"], ev.get("summary"), i, ev.get("replicated")))
            if "fills" in ev:
                out.fills[ev["round"]] = ev["fills"]
        if st.effect == "collect":
            out.collects.append((ev["round"], ev["collective"], ev["inputs"], i))
            out.moves[ev["round"]] = (i, ev.get("exchange") or {"send": [], "recv": []})
        if ev["row"] == "return_abort":
            rep.aborted = True
        rep.rows[ev["row"]] += 1
        rep.events += 1
        local = ev["after"]
    out.final = local
    if local["ph"] != DONE and not out.cut:
        rep.problems.append(f"rank {rank}: trace ends in phase {local['ph']} without DONE or a failure "
                            "(TraceMatched fails: the run stopped mid-protocol)")
    return out


def _pooled(posted: dict, n: int, lanes: int, rnd: int, rep: RunReport) -> dict:
    """The P pool posts the table read of the N ranks' posts of one round (`odb.core.placement.pool_rows`):
    lane 0's post with the largest status of its pool; a pool's lanes must have posted the same window,
    summary and replicated fields unless one of them stops."""
    out = {}
    for p in range(n // lanes):
        mine = [posted[p * lanes + j] for j in range(lanes)]
        st = max(m[1]["st"] for m in mine)
        if st == 0:
            for j, m in enumerate(mine[1:], 1):
                if (m[1], m[2], m[4]) != (mine[0][1], mine[0][2], mine[0][4]):
                    rep.problems.append(f"round {rnd}: rank {p * lanes + j} posted {m[1]}, {m[2]}, {m[4]}, "
                                        f"other than rank {p * lanes} of its pool {mine[0][1]}, {mine[0][2]}, "
                                        f"{mine[0][4]}")
        out[p] = (mine[0][0], {**mine[0][1], "st": st}, *mine[0][2:])
    return out


def _check_collectives(table: Table, cfg: dict, ranks: list[_Rank], rep: RunReport, policy, lanes: int = 1) -> dict:
    """Condition 2; with pooled windows (`odb.core.placement`) the collective's rows are the P pools'.  Returns
    rank -> round -> (target, proposal) as recomputed here."""
    n, pools = len(ranks), len(ranks) // lanes
    by_round: dict[int, dict[int, tuple]] = defaultdict(dict)
    for rank, rk in enumerate(ranks):
        rounds = [p[0] for p in rk.posts]
        if rounds != list(range(len(rounds))):
            rep.problems.append(f"rank {rank}: posted rounds {rounds}, expected 0, 1, 2, ... in order")
        got = [c[0] for c in rk.collects]
        if got != rounds and not (rk.cut and got == rounds[:-1]):
            rep.problems.append(f"rank {rank}: collected rounds {got} but posted rounds {rounds} "
                                "(every posted round must be collected)")
        for p in rk.posts:
            by_round[p[0]][rank] = p
    complete: dict[int, dict[int, tuple]] = {}  # round -> participant -> post, for rounds every rank posted
    for rnd, posted in sorted(by_round.items()):  # also a round no rank collected (a divergence ends it)
        if set(posted) != set(range(n)):
            continue
        complete[rnd] = posted = _pooled(posted, n, lanes, rnd, rep) if lanes > 1 else posted
        for j, name in enumerate(REPLICATED):
            vals = [posted[r][4][j] if posted[r][4] else None for r in range(pools)]
            if len(set(vals)) > 1:
                rep.problems.append(f"round {rnd}: ranks posted different {name!r}: {vals} by rank")
    lo = evaluate(table.proposal.lo, Scope(cfg=cfg))
    hi = evaluate(table.proposal.hi, Scope(cfg=cfg))
    proposals = defaultdict(set)
    decided: dict[int, dict[int, tuple]] = defaultdict(dict)   # rank -> round -> (target, proposal) recomputed
    collective = {i.name for i in table.inputs if i.source == "collective"}
    for rank, rk in enumerate(ranks):
        for rnd, coll, read, i in rk.collects:
            where = f"rank {rank} event {i} (round {rnd})"
            posted = complete.get(rnd, {})
            if set(posted) != set(range(pools)):
                missing = set(range(n)) - set(by_round.get(rnd, {}))
                if missing and all(ranks[m].killed and len(ranks[m].posts) == rnd for m in missing):
                    continue  # killed right after posting this round, before its trace line: nothing to compare
                rep.problems.append(f"{where}: collected a round that some rank never posted")
                continue
            expect = [{"st": posted[r][1]["st"], "n": posted[r][1]["n"], "shape": posted[r][1]["shape"]}
                      for r in range(pools)]
            if coll["headers"] != expect:
                rep.problems.append(f"{where}: received headers {coll['headers']} != posted {expect}")
            if coll.get("rounds") != [rnd] * pools:
                rep.problems.append(f"{where}: received round slots {coll.get('rounds')} != {[rnd] * pools}")
            summaries = [posted[r][2] for r in range(pools)]
            if coll["summaries"] != summaries:
                rep.problems.append(f"{where}: received summaries {coll['summaries']} != posted {summaries}")
            replicated = [posted[r][4] for r in range(pools)]
            if coll.get("replicated") != replicated:
                rep.problems.append(f"{where}: received replicated fields {coll.get('replicated')} != posted "
                                    f"{replicated}")
            proposal = coll["inputs"]["proposal"]
            proposals[rnd].add(proposal)
            if not lo <= proposal <= hi:
                rep.problems.append(f"{where}: proposal {proposal} outside the table's bounds [{lo}, {hi}]")
            if policy is not None:
                try:
                    recomputed = round_proposal(table, cfg, expect, summaries, policy, rnd, lanes)
                except Exception as e:  # noqa: BLE001 - a policy that raises on the posted summaries
                    recomputed = f"{type(e).__name__}: {e}"
                if recomputed != proposal:
                    rep.problems.append(f"{where}: proposal {proposal} != the policy's proposal for the posted "
                                        f"summaries = {recomputed}")
            want = machine.collective_inputs(table, expect, proposal, cfg)
            decided[rank][rnd] = (round_target(table, want, cfg), proposal)
            mine = replicated[rank // lanes]
            if rnd > 0 and mine and rnd - 1 in decided[rank]:
                if tuple(mine[2:4]) != decided[rank][rnd - 1]:
                    rep.problems.append(f"{where}: rank {rank} posted (target, proposal) = "
                                        f"{tuple(mine[2:4])} for round {rnd - 1}, which decided "
                                        f"{decided[rank][rnd - 1]}")
            if coll["inputs"] != want:
                rep.problems.append(f"{where}: collective inputs {coll['inputs']} != recomputed {want}")
            for k, v in read.items():
                if k in collective and want.get(k) != v:
                    rep.problems.append(f"{where}: read input {k}={v}, the collective gives {want.get(k)}")
        rep.rounds = max(rep.rounds, len(rk.collects))
    for rnd, ps in sorted(proposals.items()):
        if len(ps) > 1:
            rep.problems.append(f"round {rnd}: ranks got different proposals {sorted(ps)}")
    shapes = {p[1]["shape"] for rk in ranks for p in rk.posts}
    if len(shapes) > 1:
        rep.problems.append(f"posted header shapes differ: {sorted(shapes)}")
    done = {r: rk.final["aborted"] for r, rk in enumerate(ranks) if rk.final is not None and rk.final["ph"] == DONE}
    if len(set(done.values())) > 1:
        rep.problems.append(f"finished ranks disagree on the abort: ab per rank {done}")
    return decided


def _check_exchange(ranks: list[_Rank], rep: RunReport, decided: dict, lanes: int, slack: int = 0) -> None:
    """Condition 5: every collect's moves against the plan recomputed from the posted fills (with the run's
    budget-balance `slack`)."""
    n = len(ranks)
    sent: dict = {}   # (round, origin, to) -> positions, as the senders recorded them
    got: dict = {}    # (round, origin, to) -> positions, as the receivers recorded them
    for rank, rk in enumerate(ranks):
        for rnd, coll, _, i in rk.collects:
            where = f"rank {rank} event {i} (round {rnd})"
            if "fills" not in coll:
                rep.problems.append(f"{where}: a collect of the round exchange without its gathered fills")
                continue
            posted = [ranks[p * lanes].fills.get(rnd) for p in range(n // lanes)]
            if None not in posted and coll["fills"] != posted:
                rep.problems.append(f"{where}: received fills {coll['fills']} != posted {posted}")
            _, moves = rk.moves[rnd]
            T = coll.get("planned")
            if T is None:
                if moves["send"] or moves["recv"]:
                    rep.problems.append(f"{where}: batches moved after a collect that planned nothing")
                continue
            before = (0, None) if rnd == 0 else decided.get(rank, {}).get(rnd - 1)  # round 0 plans no batch
            if before is None or T != before[0]:
                rep.problems.append(f"{where}: planned a round of target {T}, the round before decided "
                                    f"{None if before is None else before[0]}")
                continue
            plan = exchange_plan(rank_fills(np.array(coll["fills"], dtype=np.int64), lanes, T), slack)
            home = range(rank // lanes * lanes, rank // lanes * lanes + lanes)  # a move inside a pool is in memory
            want_send = sorted((q, tuple(o)) for q, row in enumerate(plan) for o in row
                               if o is not None and o[0] == rank and q not in home)
            want_recv = sorted(tuple(o) for o in plan[rank] if o is not None and o[0] not in home)
            did_send = sorted((m[0], (m[1], m[2])) for m in moves["send"])
            lost = [(m[0], m[1]) for m in moves.get("lost", ())]
            if lost and not rep.aborted:
                rep.problems.append(f"{where}: lost the batches formed at {lost} in a run that did not abort")
            did_recv = sorted([(m[0], m[1]) for m in moves["recv"]] + lost)
            if did_send != want_send:
                rep.problems.append(f"{where}: sent {did_send}, the plan of the received fills sends {want_send}")
            if did_recv != want_recv:
                rep.problems.append(f"{where}: received {did_recv}, the plan of the received fills gives "
                                    f"{want_recv}")
            for q, r, k, pos in moves["send"]:
                sent[(rnd, (r, k), q)] = pos
            for r, k, pos in moves["recv"]:
                got[(rnd, (r, k), rank)] = pos
            for r, k in lost:
                got[(rnd, (r, k), rank)] = None  # no positions arrived (the sender's error says why)
    for key in sorted(set(sent) | set(got)):
        rnd, origin, to = key
        if key not in got:
            if not ranks[to].cut:
                rep.problems.append(f"round {rnd}: rank {origin[0]} sent the batch formed at {origin} to rank {to}, "
                                    "which did not record it")
        elif key not in sent:
            rep.problems.append(f"round {rnd}: rank {to} received the batch formed at {origin}, which rank "
                                f"{origin[0]} did not record sending")
        elif got[key] is not None and sent[key] != got[key]:
            rep.problems.append(f"round {rnd}: the batch formed at {origin} left rank {origin[0]} with positions "
                                f"{sent[key]} and reached rank {to} with {got[key]}")


def check_run(paths: list[str], table: Table = DGAP, died: frozenset = frozenset()) -> RunReport:
    """Check one run given every rank's trace file.

    `died`: ranks known to have been killed (their trace may stop mid-protocol;
    every line it has is still checked).
    """
    loaded = [_load(p) for p in paths]
    metas = {m["rank"]: (m, ev) for m, ev in loaded}
    n = loaded[0][0]["world_size"]
    name = os.path.basename(paths[0]).rsplit("_rank", 1)[0]
    rep = RunReport(name, n)
    if sorted(metas) != list(range(n)):
        rep.problems.append(f"traces for ranks {sorted(metas)}, world size {n}")
        return rep
    cfgs = {json.dumps(m["cfg"], sort_keys=True) for m, _ in loaded}
    if len(cfgs) > 1:
        rep.problems.append(f"ranks ran with different cfg: {sorted(cfgs)}")
        return rep
    for m, _ in loaded:
        if m["table"] != table.hash:
            rep.problems.append(f"rank {m['rank']}: table hash {m['table']} != {table.hash}")
    ranks = [_replay_rank(table, rank, metas[rank][0], metas[rank][1], rep, rank in died) for rank in range(n)]
    policy = _default_policy_if(loaded[0][0].get("policy"))
    lanes = {m.get("lanes", 1) for m, _ in loaded}
    if len(lanes) > 1 or n % max(lanes):
        rep.problems.append(f"ranks ran with pools of {sorted(lanes)} ranks, world size {n}")
        return rep
    lanes = lanes.pop()
    decided = _check_collectives(table, loaded[0][0]["cfg"], ranks, rep, policy, lanes)
    if loaded[0][0]["cfg"].get("xchg") == 1:
        slack = {m.get("exchange_slack", 0) for m, _ in loaded}
        if len(slack) > 1:
            rep.problems.append(f"ranks ran with exchange slacks {sorted(slack)}")
            return rep
        _check_exchange(ranks, rep, decided, lanes, slack.pop())
    _check_happens_before([metas[rank][1] for rank in range(n)], rep)
    return rep


def _check_happens_before(traces: list[list[dict]], rep: RunReport) -> None:
    """Condition 4 (`hb.happens_before`); without networkx the check fails, it is never skipped."""
    try:
        hb = happens_before(traces)
    except ImportError as e:
        rep.problems.append(f"happens-before check did not run: {e} (networkx is in the 'verify' and 'test' "
                            "extras: pip install -e '.[test]')")
        return
    rep.problems += hb.problems
    if hb.critical_events is not None:
        rep.critical_path = hb.summary()


def _default_policy_if(name: str | None):
    from odb.batching import default_policy

    pol = default_policy()
    return pol if type(pol).__name__ == name else None


def check_dir(trace_dir: str, table: Table = DGAP, died: frozenset = frozenset()) -> list[RunReport]:
    """Check every run found in `trace_dir` (files grouped by loader and pass)."""
    runs: dict[tuple[int, int], list[str]] = defaultdict(list)
    for p in glob.glob(os.path.join(trace_dir, "*.jsonl")):
        m = _NAME.match(os.path.basename(p))
        if m:
            runs[(int(m.group(1)), int(m.group(2)))].append(p)
    return [check_run(sorted(runs[k]), table, died) for k in sorted(runs)]


def _abnormal(r: RunReport) -> bool:
    return r.aborted or bool(r.local_errors) or bool(r.failures)


def assert_conformant(trace_dir: str, *, allow_abort: bool = False, died: frozenset = frozenset()) -> Counter:
    """Raise AssertionError unless every run in `trace_dir` conforms; return the row coverage.

    With ``allow_abort=False`` a run in which ``return_abort`` fired, or a rank
    recorded a local error or a failure, is also a failure.  `died` names ranks that were killed on purpose (see
    `check_run`).
    """
    reports = check_dir(trace_dir, died=frozenset(died))
    if not reports:
        raise AssertionError(f"no traces in {trace_dir}")
    bad = [r for r in reports if not r.ok or (_abnormal(r) and not allow_abort)]
    if bad:
        lines = [f"{r.name}: aborted={r.aborted} errors={r.local_errors + r.failures}; " + "; ".join(r.problems[:5])
                 for r in bad]
        raise AssertionError("trace conformance failed:\n" + "\n".join(lines))
    rows: Counter = Counter()
    for r in reports:
        rows += r.rows
    return rows
