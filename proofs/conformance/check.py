"""Trace conformance: replay real runtime traces through the table's own interpreter.

Legend
    run      one pass of one loader: the files ``L<loader>_it<pass>_rank<r>.jsonl`` of every rank
    event    one JSON line of a rank's trace (a fired row, an ``abort`` or a ``failure``)
    round    the index of a header collective (0, 1, ...)

A run conforms when, for every rank:

1. **Local replay.** The first state is ``machine.initial_local``; each event's
   ``before`` is the previous event's ``after``; exactly one row is enabled at
   ``before`` under the event's recorded inputs (``machine.enabled_rows``) and it
   is the logged row; ``machine.fire`` with the logged choices reproduces
   ``after``, the effect, the posted payload and the emitted count.
2. **Collectives.** Each rank posted rounds 0, 1, 2, ... in order; for every
   round that some rank collected, every rank posted (a header or an abort);
   the headers each rank received equal the payloads the ranks posted; the
   collective inputs each rank read equal ``machine.collective_inputs``
   recomputed from those payloads; all ranks got the same proposal, within the
   table's proposal bounds, and (for the default policy) equal to
   ``policy.propose`` of the posted summaries.
3. **TraceMatched.** Every line is consumed; nothing follows an abort but a
   failure; a run with no abort or failure ends in DONE on every rank.

Nothing here re-implements a row: guards, updates and decisions come from
`odb.protocol.machine`.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from odb.protocol import machine
from odb.protocol.expr import Scope, evaluate
from odb.protocol.table import DGAP, DONE, Table

__all__ = ["RunReport", "check_run", "check_dir", "assert_conformant"]

_NAME = re.compile(r"^L(\d+)_it(\d+)_rank(\d+)\.jsonl$")


@dataclass
class RunReport:
    """The verdict on one run.  ``ok`` only if `problems` is empty."""

    name: str
    world_size: int
    events: int = 0
    rounds: int = 0
    aborted: bool = False
    rows: Counter = field(default_factory=Counter)
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _load(path: str) -> tuple[dict, list[dict]]:
    with open(path, encoding="ascii") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines or "meta" not in lines[0]:
        raise ValueError(f"{path}: the first line must be the meta record")
    return lines[0]["meta"], lines[1:]


def _replay_rank(table: Table, rank: int, meta: dict, events: list[dict], rep: RunReport,
                 posts: dict, collects: dict, died: bool) -> None:
    cfg = meta["cfg"]
    local = machine.initial_local(table, cfg)
    ended = None  # "abort" / "failure" once seen
    for i, ev in enumerate(events):
        where = f"rank {rank} event {i}"
        if "failure" in ev:
            ended = "failure"
            continue
        if "abort" in ev:
            if ended == "abort":
                rep.problems.append(f"{where}: a second abort")
            ended = "abort"
            rep.aborted = True
            posts[rank].append(("abort", ev["round"], ev["abort"]))
            continue
        if ended is not None:
            rep.problems.append(f"{where}: row {ev.get('row')} after {ended}")
            continue
        if ev.get("table") != table.hash:
            rep.problems.append(f"{where}: table hash {ev.get('table')} != {table.hash}")
        if ev["before"] != local:
            rep.problems.append(f"{where}: before {ev['before']} != replayed state {local}")
            return
        try:
            enabled = [r.name for r in machine.enabled_rows(table, ev["before"], ev["inputs"], cfg)]
        except KeyError as e:
            rep.problems.append(f"{where}: a guard reads an input the trace does not record: {e}")
            return
        if enabled != [ev["row"]]:
            rep.problems.append(f"{where}: logged row {ev['row']} but the table enables {enabled}")
            return
        try:
            st = machine.fire(table, table.row(ev["row"]), ev["before"], ev["inputs"], cfg, ev["params"])
        except Exception as e:  # ProtocolError: a choice out of its contract
            rep.problems.append(f"{where}: {type(e).__name__}: {e}")
            return
        for key, got in (("after", st.after), ("effect", st.effect), ("payload", st.payload), ("count", st.count)):
            if ev[key] != got:
                rep.problems.append(f"{where}: {ev['row']} logged {key}={ev[key]} but the table gives {got}")
        if st.effect == "post":
            posts[rank].append(("post", ev["round"], ev["payload"], ev.get("summary")))
        if st.effect == "collect":
            collects[rank].append((ev["round"], ev["collective"], ev["inputs"], i))
        rep.rows[ev["row"]] += 1
        rep.events += 1
        local = ev["after"]
    if ended is None and local["ph"] != DONE and not died:
        rep.problems.append(f"rank {rank}: trace ends in phase {local['ph']} without DONE, abort or failure "
                            "(TraceMatched fails: the run stopped mid-protocol)")


def _check_collectives(table: Table, cfg: dict, n: int, posts: dict, collects: dict, rep: RunReport,
                       policy) -> None:
    by_round: dict[int, dict[int, tuple]] = defaultdict(dict)
    for rank in range(n):
        rounds = [p[1] for p in posts[rank]]
        if rounds != list(range(len(rounds))):
            rep.problems.append(f"rank {rank}: posted rounds {rounds}, expected 0, 1, 2, ... in order")
        for p in posts[rank]:
            by_round[p[1]][rank] = p
    lo = evaluate(table.proposal.lo, Scope(cfg=cfg))
    hi = evaluate(table.proposal.hi, Scope(cfg=cfg))
    for rank in range(n):
        for rnd, coll, read, i in collects[rank]:
            where = f"rank {rank} event {i} (round {rnd})"
            posted = by_round.get(rnd, {})
            if set(posted) != set(range(n)):
                rep.problems.append(f"{where}: collected a round that ranks {sorted(set(range(n)) - set(posted))} "
                                    "never posted")
                continue
            if any(posted[r][0] != "post" for r in range(n)):
                rep.problems.append(f"{where}: collected normally though ranks "
                                    f"{[r for r in range(n) if posted[r][0] != 'post']} aborted this round")
                continue
            expect = [{"n": posted[r][2]["n"], "shape": posted[r][2]["shape"]} for r in range(n)]
            if coll["headers"] != expect:
                rep.problems.append(f"{where}: received headers {coll['headers']} != posted {expect}")
            summaries = [posted[r][3] for r in range(n)]
            if coll["summaries"] != summaries:
                rep.problems.append(f"{where}: received summaries {coll['summaries']} != posted {summaries}")
            proposal = coll["inputs"]["proposal"]
            if not lo <= proposal <= hi:
                rep.problems.append(f"{where}: proposal {proposal} outside the table's bounds [{lo}, {hi}]")
            if policy is not None and policy.propose(summaries, cfg["W"]) != proposal:
                rep.problems.append(f"{where}: proposal {proposal} != policy.propose(posted summaries) = "
                                    f"{policy.propose(summaries, cfg['W'])}")
            want = machine.collective_inputs(table, expect, proposal, cfg)
            if coll["inputs"] != want:
                rep.problems.append(f"{where}: collective inputs {coll['inputs']} != recomputed {want}")
            for k, v in read.items():
                if k != "src_has" and want.get(k) != v:
                    rep.problems.append(f"{where}: read input {k}={v}, the collective gives {want.get(k)}")
        rep.rounds = max(rep.rounds, len(collects[rank]))
    proposals = defaultdict(set)
    for rank in range(n):
        for rnd, coll, _, _ in collects[rank]:
            proposals[rnd].add(coll["inputs"]["proposal"])
    for rnd, ps in sorted(proposals.items()):
        if len(ps) > 1:
            rep.problems.append(f"round {rnd}: ranks got different proposals {sorted(ps)}")
    shapes = {p[2]["shape"] for rank in range(n) for p in posts[rank] if p[0] == "post"}
    if len(shapes) > 1:
        rep.problems.append(f"posted header shapes differ: {sorted(shapes)}")


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
    posts: dict = defaultdict(list)
    collects: dict = defaultdict(list)
    for rank in range(n):
        meta, events = metas[rank]
        _replay_rank(table, rank, meta, events, rep, posts, collects, rank in died)
    policy = _default_policy_if(loaded[0][0].get("policy"))
    _check_collectives(table, loaded[0][0]["cfg"], n, posts, collects, rep, policy)
    return rep


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


def assert_conformant(trace_dir: str, *, allow_abort: bool = False, died: frozenset = frozenset()) -> Counter:
    """Raise AssertionError unless every run in `trace_dir` conforms; return the row coverage.

    With ``allow_abort=False`` a run that ended in an abort or failure is also a
    failure.  `died` names ranks that were killed on purpose (see `check_run`).
    """
    reports = check_dir(trace_dir, died=frozenset(died))
    if not reports:
        raise AssertionError(f"no traces in {trace_dir}")
    bad = [r for r in reports if not r.ok or (r.aborted and not allow_abort)]
    if bad:
        lines = [f"{r.name}: aborted={r.aborted}; " + "; ".join(r.problems[:5]) for r in bad]
        raise AssertionError("trace conformance failed:\n" + "\n".join(lines))
    rows: Counter = Counter()
    for r in reports:
        rows += r.rows
    return rows
