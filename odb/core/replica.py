"""The replicated round decision: what every rank computes alike from the gathered headers.

Legend
    rows      the round's gathered headers (`odb.core.header.Headers`: every rank's, in rank order,
              read a field at a time), identical on every rank
    shared    `odb.core.shared.Shared`: the settings the construction check compared
    aheads    each rank's inner-DataLoader prefetch, gathered at construction
    digest    what a rank posts of its replicated state (`Replicated.digest`): its dealer's
              CRC and the previous round's target and proposal

`Replicated.decide(rows)` is the whole decision of a round, in order:

1. *agreement*: every row carries this round's index, the same epoch and the same digest
   (`odb.core.header.REPLICATED`); otherwise every rank raises in this same round, naming
   the field and which rank posted what (`ConfigError` for the epoch, a user mistake;
   `ProtocolError` for a digest, a replicated decision that read a rank-local value);
2. the table's collective inputs (`machine.collective_inputs`) and the policy's proposal,
   ``policy.propose(summaries, W)`` checked against the table's bounds (`round_proposal`;
   when the table's ``abort`` holds the proposal is not asked for: a failing rank's
   summary may be a placeholder, and the round ends anyway);
3. the round's target, the table's own ``Let("target")`` (`round_target`);
4. dealt sharding: the deal, from the gathered ``taken, cost, dry, reserve`` and each
   rank's need (`odb.batching.intake.round_needs` of the gathered window, intake ladder and
   prefetch).

Its inputs are the rows, `Shared`, the gathered ``aheads``, the policy (compared by
`odb.core.shared.describe_policy`), the epoch's dealt order (built from compared settings
and the positions every rank gathered at the pass start) and the epoch (posted and checked
every round).  It holds nothing else, so a rank-local value cannot reach a replicated
decision except through one of these; a divergence that gets through anyway shows in the
next round's digest, before any sample placed by the diverged decision is released (the
batches of round r are released after round r + 1's collective).  Pure: no torch.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from ..batching.base import summaries_for
from ..batching.dealt_order import DealtOrder
from ..batching.intake import Posted, round_needs
from ..errors import ConfigError, ProtocolError
from ..protocol import machine
from ..protocol.expr import Let, Scope, evaluate
from ..protocol.table import DGAP, Table
from .header import REPLICATED, Header, Headers
from .placement import lane_proposal
from .shared import Shared

__all__ = ["Decision", "Replicated", "proposal_bounds", "round_proposal", "round_target", "table_headers"]


class Decision(NamedTuple):
    """One round's replicated decision."""

    inputs: dict       # the table's collective inputs (what the WAIT rows read)
    proposal: int
    target: int        # the table's Let("target") on `inputs`


def table_headers(rows: "Headers | Sequence[Header]", length: int) -> "dict[str, list] | list[dict]":
    """The table's view of the gathered headers: the payload (``st``, ``n``) and the shape; `Headers` as
    columns (`odb.protocol.machine.collective_inputs` reads either), decoded headers one mapping each."""
    if isinstance(rows, Headers):  # a 2-D array: every row has the layout's length
        return {"st": rows.column("st"), "n": rows.column("n"), "shape": [length] * len(rows)}
    return [{"st": h.st, "n": h.n, "shape": length} for h in rows]


def proposal_bounds(table: Table, cfg: Mapping[str, int]) -> tuple[int, int]:
    """The table's bounds on the policy's proposal."""
    s = Scope(cfg=cfg)
    return int(evaluate(table.proposal.lo, s)), int(evaluate(table.proposal.hi, s))


def round_target(table: Table, inputs: Mapping, cfg: Mapping[str, int]) -> int:
    """The round's target: the table's own ``Let("target")`` on the collective inputs."""
    return int(evaluate(Let("target"), Scope(inputs=inputs, cfg=cfg, lets=table.let_map)))


def round_proposal(table: Table, cfg: Mapping[str, int], headers: list[dict], summaries: Sequence[Sequence[int]],
                   policy: Any, round_index: int, lanes: int = 1) -> int:
    """The round's proposal: the table's lower bound when its ``abort`` holds on `headers`, else
    ``policy.propose(summaries, W)`` (ProtocolError when outside the table's bounds), made a multiple
    of `lanes` (pooled windows: `odb.core.placement.lane_proposal`)."""
    return _decide(table, cfg, headers, summaries, policy, round_index, lanes)[0]


def _decide(table: Table, cfg: Mapping[str, int], headers: list[dict], summaries: Sequence[Sequence[int]],
            policy: Any, round_index: int, lanes: int = 1) -> tuple[int, dict]:
    """(`round_proposal`, the collective inputs with it): the aggregates are computed once."""
    lo, hi = proposal_bounds(table, cfg)
    inputs = machine.collective_inputs(table, headers, lo, cfg)
    if evaluate(Let("abort"), Scope(inputs=inputs, cfg=cfg, lets=table.let_map)):
        return lo, inputs
    proposal = int(policy.propose(summaries, cfg["W"]))
    if not lo <= proposal <= hi:
        raise ProtocolError(f"policy {type(policy).__name__} proposed {proposal}, outside the table's bounds "
                            f"[{lo}, {hi}] in round {round_index}")
    if lanes > 1:  # pooled: a multiple of the pool size (the default placement calls nothing here)
        proposal = lane_proposal(proposal, lanes, hi)
    inputs["proposal"] = proposal  # the aggregates do not depend on the proposal
    return proposal, inputs


def _dealer_crc(order: DealtOrder | None) -> int:
    if order is None:
        return 0
    return order.dealer.digest()


class Replicated:
    """This rank's replica of the round decision (see the module docstring).

    :param shared: the compared settings.
    :param world_size: participants in the table: ranks in the loader's group, or pools of
        ``shared.lanes`` ranks (`odb.core.placement`; the rows are then the pool rows).
    :param aheads: every participant's prefetch, gathered (rank order; a pool's: `odb.core.placement.pool_aheads`).
    :param policy: the alignment policy (its `propose` must be a pure function of its arguments).
    :param order: the epoch's `DealtOrder` with its first deal applied, or None (fixed shards).
    :param epoch: the pass's epoch, posted every round.
    """

    def __init__(self, shared: Shared, *, world_size: int, aheads: Sequence[int], policy: Any,
                 order: DealtOrder | None, epoch: int, table: Table = DGAP):
        if len(aheads) != world_size:
            raise ValueError(f"{len(aheads)} prefetch values for {world_size} ranks")
        self.shared, self.world_size, self.aheads = shared, int(world_size), tuple(map(int, aheads))
        self._aheads = np.array(self.aheads, dtype=np.int64)  # what `round_needs` reads every round
        self.policy, self.order, self.epoch, self.table = policy, order, int(epoch), table
        self.cfg = shared.table_cfg()
        self.round = 0            # the index of the next collective
        self.last = (0, 0)        # the previous round's (target, proposal)

    def digest(self) -> tuple[int, int, int]:
        """What this rank posts of its replicated state: (dealer CRC, last target, last proposal)."""
        return (_dealer_crc(self.order), *self.last)

    def decide(self, rows: Headers) -> Decision:
        """The round's decision from every rank's header (module docstring); advances the round."""
        if len(rows) != self.world_size:
            raise ProtocolError(f"round {self.round}: {len(rows)} headers for {self.world_size} ranks")
        self._agree(rows)
        headers = table_headers(rows, self.shared.header_len)
        summaries = summaries_for(self.policy, rows)  # kept by rows: the policy's memo compares them by identity
        proposal, inputs = _decide(self.table, self.cfg, headers, summaries, self.policy, self.round,
                                   self.shared.lanes)
        target = round_target(self.table, inputs, self.cfg)
        if self.order is not None and not self.order.done:
            need = round_needs(self.shared.window, target, Posted(rows.column("n"), rows.intake), self._aheads,
                               as_array=True)
            self.order.deal(rows.column("taken"), rows.column("cost"), rows.column("dry"), rows.column("reserve"),
                            need=need)
        self.round += 1
        self.last = (target, proposal)
        return Decision(inputs, proposal, target)

    def _agree(self, rows: Headers) -> None:
        rnd = self.round
        at = rows.layout.agreed  # the round's index, then the REPLICATED fields' columns
        a = rows.array
        if (a[:, at[0]] == rnd).all() and (a[:, at[1:]] == a[0, at[1:]]).all():
            return  # the common case in one pass; otherwise name the field and the ranks below
        rounds = rows.column("round")
        if (rounds != rnd).any():  # every rank sees the same headers, so every rank raises this
            raise ProtocolError(f"collective mismatch in round {rnd}: ranks posted rounds {rounds.tolist()}")
        for name in REPLICATED:
            col = rows.column(name)
            if (col == col[0]).all():
                continue
            by = {}
            for r, v in enumerate(col.tolist()):
                by.setdefault(v, []).append(r)
            what = "; ".join(f"{v} on ranks {rs}" for v, rs in sorted(by.items()))
            if name == "epoch":
                raise ConfigError(f"the ranks iterate different epochs in round {rnd} ({what}); every rank "
                                  "must call loader.set_epoch(e) with the same e before iterating (a different "
                                  "epoch is a different sample order: samples would repeat and be lost)")
            raise ProtocolError(
                f"replicated state diverged before round {rnd}: field {name!r} is {what}. A decision every rank "
                "must compute alike read a rank-local value (a bug in ODB or in a custom alignment policy); "
                "every rank stops in this round, before any sample placed by the diverged decision is released")
