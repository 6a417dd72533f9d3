"""One rank's round post: a header every rank all-gathers, and loss counts the collective reduces.

Legend
    S        the alignment policy's ``summary_len``
    L        ``len(odb.batching.deal.intake_ladder(W))``: 20 for W = 1024
    W        the window (``buffer_size``); a round emits at most W batches per rank
    length   ``7 + S + 4 + L`` ints, the gathered header, the same on every rank (`HeaderLayout.length`)

Header fields, in order (`Header`):

    st        the table's payload ``st = in.quit`` (0 healthy, 1 closed, 2 failed)
    round     the index of this collective in the pass (a diagnostic the table does not read)
    n         the table's payload ``n = buf`` (the window at the post)
    epoch     the loader epoch of this pass
    deal      digest (CRC-32) of this rank's dealer replica after the previous round (0: no dealing)
    target    the previous round's target as this rank computed it (0 before the first round)
    proposal  the previous round's proposal as this rank computed it (0 before the first round)
    summary   S ints: the policy's summary of the window
    taken, cost, dry, reserve
              dealt sharding: items the rank's source returned this epoch, their summed
              cost x ``COST_SCALE``, whether it ran dry, reserve positions it took itself
    intake    L ints: `odb.batching.deal.policy_intake` of the window (zeros unless dealing)

Beside the header each rank posts ``counts``, 3W ints: ``counts[3k + b]``, count b (tokens, label
tokens, samples) of its k-th batch of the PREVIOUS round (0 for fillers and absent batches).  Only
their sum over the ranks is needed (exact loss scaling), and the largest rank's tokens per step
(the straggler estimate), so the collective reduces them (`Gathered`: a sum of 3W ints and a max of
W) instead of gathering N x 3W: the bytes a rank receives for them do not grow with N.

``epoch``, ``deal``, ``target`` and ``proposal`` are the *replicated fields*: every rank must
post the same values (`REPLICATED`); `odb.core.replica` checks them every round, so replicas
that diverge fail loudly on every rank, in the same round, before any sample they placed is
released.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

__all__ = ["Header", "HeaderLayout", "Post", "Gathered", "REPLICATED", "reduce_posts"]

REPLICATED = ("epoch", "deal", "target", "proposal")  # fields every rank must post alike
_SCALARS = ("st", "round", "n") + REPLICATED
_DEAL = ("taken", "cost", "dry", "reserve")


class Header(NamedTuple):
    """One rank's decoded header (the module docstring gives each field)."""

    st: int
    round: int
    n: int
    epoch: int
    deal: int
    target: int
    proposal: int
    summary: tuple[int, ...]
    taken: int
    cost: int
    dry: int
    reserve: int
    intake: tuple[int, ...]


class Post(NamedTuple):
    """What one rank hands the round's collective: its encoded header (gathered) and its 3W counts
    (reduced)."""

    header: list[int]
    counts: list[int]


class Gathered(NamedTuple):
    """What the round's collective returns, alike on every rank: every rank's header in rank order
    (int vectors or decoded `Header`s), ``totals[3k + b]`` = count b of the ranks' k-th batches summed
    over the ranks, and ``tokens_max[k]`` = the largest rank's tokens in its k-th batch."""

    rows: Sequence
    totals: Sequence[int]
    tokens_max: Sequence[int]


def reduce_posts(posts: Sequence[Post]) -> Gathered:
    """The collective's result computed in one process (a simulation, a world of one): what
    `odb.runtime.transport.HeaderGather` computes with an all-gather and two all-reduces."""
    totals = [sum(c) for c in zip(*(p.counts for p in posts))]
    tokens_max = [max(c) for c in zip(*(p.counts[0::3] for p in posts))]
    return Gathered([p.header for p in posts], totals, tokens_max)


class HeaderLayout:
    """Encode and decode headers of one shape (``summary_len``, ``W``, ``ladder_len``).

    ``lanes``: ranks sharing one window (`odb.core.pool`); each posts counts for its own batches, at
    most ``steps = W / lanes`` a round, so the counts are ``3 steps`` ints (``3W`` without pooling)."""

    def __init__(self, summary_len: int, window: int, ladder_len: int, lanes: int = 1):
        self.summary_len, self.window, self.ladder_len = int(summary_len), int(window), int(ladder_len)
        if lanes < 1 or self.window % lanes:
            raise ValueError(f"a window of {window} does not split into {lanes} lanes")
        self.lanes, self.steps = int(lanes), self.window // int(lanes)
        self._sum = len(_SCALARS)
        self._deal = self._sum + self.summary_len
        self._intake = self._deal + len(_DEAL)
        self.length = self._intake + self.ladder_len
        self.counts_len = 3 * self.steps

    def encode(self, *, st: int, round: int, n: int, epoch: int, digest: Sequence[int], summary: Sequence[int],
               taken: int, cost: int, dry: int, reserve: int, intake: Sequence[int]) -> list[int]:
        """The int vector of one header; raises ValueError if a part has the wrong length."""
        for name, part, want in (("digest", digest, len(REPLICATED) - 1), ("summary", summary, self.summary_len),
                                 ("intake", intake, self.ladder_len)):
            if len(part) != want:
                raise ValueError(f"header part {name} has {len(part)} ints, the layout holds {want}")
        out = [int(st), int(round), int(n), int(epoch), *map(int, digest), *map(int, summary),
               int(taken), int(cost), int(dry), int(reserve), *map(int, intake)]
        assert len(out) == self.length
        return out

    def decode(self, row: Sequence[int]) -> Header:
        """The named fields of one gathered row; raises ValueError on a row of another length."""
        if len(row) != self.length:
            raise ValueError(f"header of {len(row)} ints, the layout holds {self.length}")
        r = list(map(int, row))  # ints whatever the transport handed (tensor items, numpy ints)
        s, d, i = self._sum, self._deal, self._intake
        return Header(*r[:s], tuple(r[s:d]), *r[d:i], tuple(r[i:]))

    def check_reduced(self, g: Gathered) -> None:
        """ValueError unless the reduced counts have this layout's shape (3 steps sums, steps maxima)."""
        if len(g.totals) != self.counts_len or len(g.tokens_max) != self.steps:
            raise ValueError(f"reduced counts of {len(g.totals)} + {len(g.tokens_max)} ints, the layout holds "
                             f"{self.counts_len} + {self.steps}")
