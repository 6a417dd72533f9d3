"""One rank's round post: a header every rank all-gathers, and loss counts the collective reduces.

Legend
    S        the alignment policy's ``summary_len``
    L        ``len(odb.batching.intake.intake_ladder(W))``: 20 for W = 1024
    W        the window (``buffer_size``); a round emits at most W batches per rank
    length   ``7 + S + 4 + L`` ints (``+ W`` with ``exchange``), the gathered header, the same on every rank

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
              cost x ``COST_SCALE``, whether it ran dry, reserve positions it took itself; a stream's or a
              sampler's round 0 posts in ``cost`` a digest of the window's first samples (`odb.core.rank`:
              ``start_digest``), which no decision reads
    intake    L ints: `odb.batching.intake.policy_intake` of the window (zeros unless dealing)
    fills     W ints, only in a layout with ``exchange`` (`odb.core.rank`, the round exchange): the fill of
              each batch of the round before (``odb.batching.exchange.batch_fill``, pool batch order), -1 for
              a filler or a slot past the round's target

Beside the header each rank posts ``counts``, 3W ints: ``counts[3k + b]``, count b (tokens, label
tokens, samples) of its k-th batch of the PREVIOUS round (0 for fillers and absent batches); with
``exchange``, of the batches the exchange placed on the rank one collective earlier, at the steps they
run (a batch's counts are posted once, where it runs).  Only
their sum over the ranks is needed (exact loss scaling), and the largest rank's tokens per step
(the straggler estimate), so the collective reduces them (`Gathered`: a sum of 3W ints and a max of
W) instead of gathering N x 3W: the bytes a rank receives for them do not grow with N.

``epoch``, ``deal``, ``target`` and ``proposal`` are the *replicated fields*: every rank must
post the same values (`REPLICATED`); `odb.core.replica` checks them every round, so replicas
that diverge fail loudly on every rank, in the same round, before any sample they placed is
released.
"""

from __future__ import annotations

from collections import abc
from typing import NamedTuple, Sequence

import numpy as np

from ..batching.intake import intake_ladder
from .types import COUNTS_LEN

__all__ = ["Header", "HeaderLayout", "Headers", "Post", "Gathered", "REPLICATED", "reduce_posts", "header_layout"]

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
    fills: tuple[int, ...] = ()


class Headers(abc.Sequence):
    """One round's gathered headers, every rank's in rank order, held as one ``(N, length)`` int64 array
    (`HeaderLayout.decode_all`): what the round's decision reads a field at a time across the ranks, so
    that decoding N headers is not N x length Python ints.  ``headers[r]`` is rank r's `Header` (built when
    asked: error messages, traces); `column` a field of every rank as an array, `values` as a list of
    ints; `summaries` the policy's rows (tuples, built once and kept: the policy's memo compares them by
    identity), `summary_array` the same as one array.  Immutable: every rank's decision reads the same values."""

    __slots__ = ("layout", "array", "_lists", "_summaries", "_summary_array")

    def __init__(self, layout: "HeaderLayout", array: np.ndarray):
        self.layout, self.array = layout, array
        self.array.flags.writeable = False
        self._lists: dict[str, list[int]] = {}
        self._summaries: list[tuple[int, ...]] | None = None
        self._summary_array: np.ndarray | None = None

    def __len__(self) -> int:
        return self.array.shape[0]

    def __getitem__(self, r):
        if isinstance(r, slice):
            return Headers(self.layout, self.array[r])
        return self.layout._header(self.array[r].tolist())

    def column(self, name: str) -> np.ndarray:
        """Field `name` (a scalar field of `Header`) of every rank, in rank order."""
        return self.array[:, self.layout.index[name]]

    def values(self, name: str) -> list[int]:
        """`column` as a list of ints (kept)."""
        got = self._lists.get(name)
        if got is None:
            got = self._lists[name] = self.column(name).tolist()
        return got

    @property
    def summaries(self) -> list[tuple[int, ...]]:
        """Every rank's policy summary, as tuples (kept)."""
        if self._summaries is None:
            a, lay = self.array, self.layout
            self._summaries = list(map(tuple, a[:, lay._sum:lay._deal].tolist()))
        return self._summaries

    @property
    def summary_array(self) -> np.ndarray:
        """Every rank's policy summary, a row each: a read-only view of the headers (kept, so a policy's
        memo may compare it by identity)."""
        if self._summary_array is None:
            lay = self.layout
            self._summary_array = self.array[:, lay._sum:lay._deal]
        return self._summary_array

    @property
    def intake(self) -> np.ndarray:
        """Every rank's intake ladder, one row per rank."""
        return self.array[:, self.layout._intake:self.layout._fills]

    @property
    def fills(self) -> np.ndarray:
        """Every rank's batch fills (a layout with ``exchange``; no columns otherwise), one row per rank."""
        return self.array[:, self.layout._fills:]


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
    tokens_max = [max(c) for c in zip(*(p.counts[0::COUNTS_LEN] for p in posts))]  # each batch slot's tokens
    return Gathered([p.header for p in posts], totals, tokens_max)


class HeaderLayout:
    """Encode and decode headers of one shape (``summary_len``, ``W``, ``ladder_len``).

    ``lanes``: ranks sharing one window (`odb.core.placement`); each posts counts for its own batches, at
    most ``steps = W / lanes`` a round, so the counts are ``3 steps`` ints (``3W`` without pooling).
    ``exchange``: the round exchange's layout: W fills more in the header.  ``slack``: the exchange's budget
    balance (`odb.batching.exchange`, basis points of step time; 0: none): the fills are then keys
    (`odb.batching.exchange.pack_key`), the same W ints."""

    def __init__(self, summary_len: int, window: int, ladder_len: int, lanes: int = 1, exchange: bool = False,
                 slack: int = 0):
        self.summary_len, self.window, self.ladder_len = int(summary_len), int(window), int(ladder_len)
        if lanes < 1 or self.window % lanes:
            raise ValueError(f"a window of {window} does not split into {lanes} lanes")
        self.lanes, self.steps = int(lanes), self.window // int(lanes)
        self._sum = len(_SCALARS)
        self._deal = self._sum + self.summary_len
        self._intake = self._deal + len(_DEAL)
        self.exchange = bool(exchange)
        if isinstance(slack, bool) or int(slack) != slack or slack < 0 or (slack and not self.exchange):
            raise ValueError(f"an exchange slack is an int >= 0, and 0 without the exchange; got {slack!r}")
        self.slack = int(slack)
        self._fills = self._intake + self.ladder_len
        self.length = self._fills + (self.window if self.exchange else 0)
        self.counts_len = COUNTS_LEN * self.steps
        self.index = {name: k for k, name in enumerate(_SCALARS)}  # `Headers.column`
        self.index.update((name, self._deal + k) for k, name in enumerate(_DEAL))
        self.agreed = np.array([self.index[name] for name in ("round",) + REPLICATED])  # `Replicated._agree`

    def encode(self, *, st: int, round: int, n: int, epoch: int, digest: Sequence[int], summary: Sequence[int],
               taken: int, cost: int, dry: int, reserve: int, intake: Sequence[int],
               fills: Sequence[int] = ()) -> list[int]:
        """The int vector of one header; raises ValueError if a part has the wrong length."""
        for name, part, want in (("digest", digest, len(REPLICATED) - 1), ("summary", summary, self.summary_len),
                                 ("intake", intake, self.ladder_len),
                                 ("fills", fills, self.window if self.exchange else 0)):
            if len(part) != want:
                raise ValueError(f"header part {name} has {len(part)} ints, the layout holds {want}")
        out = [int(st), int(round), int(n), int(epoch), *map(int, digest), *map(int, summary),
               int(taken), int(cost), int(dry), int(reserve), *map(int, intake), *map(int, fills)]
        assert len(out) == self.length
        return out

    def decode(self, row: Sequence[int]) -> Header:
        """The named fields of one gathered row; raises ValueError on a row of another length."""
        if len(row) != self.length:
            raise ValueError(f"header of {len(row)} ints, the layout holds {self.length}")
        return self._header(list(map(int, row)))  # ints whatever the transport handed (tensor items, numpy ints)

    def _header(self, r: list[int]) -> Header:
        s, d, i, f = self._sum, self._deal, self._intake, self._fills
        return Header(*r[:s], tuple(r[s:d]), *r[d:i], tuple(r[i:f]), tuple(r[f:]))

    def flat(self, h: Header) -> list[int]:
        """A decoded header's ints, in the layout's order (`decode` undone)."""
        return [*h[:self._sum], *h.summary, *h[self._sum + 1:self._sum + 1 + len(_DEAL)], *h.intake, *h.fills]

    def decode_all(self, rows) -> Headers:
        """Every rank's header at once: `rows` an ``(N, length)`` int array (what the transport hands), a
        sequence of int vectors, of `Header`s, or `Headers` of this layout.  Raises ValueError on a row of
        another length, as `decode`."""
        if isinstance(rows, Headers):
            if rows.layout is self or rows.array.shape[1] == self.length:
                return rows
            raise ValueError(f"header of {rows.array.shape[1]} ints, the layout holds {self.length}")
        if not isinstance(rows, np.ndarray):
            rows = [self.flat(r) if isinstance(r, Header) else r for r in rows]
            for r in rows:
                if len(r) != self.length:
                    raise ValueError(f"header of {len(r)} ints, the layout holds {self.length}")
        if isinstance(rows, np.ndarray):
            a = np.asarray(rows, dtype=np.int64)  # the transport's buffer, not copied (it makes one per round)
        else:
            a = np.array(rows, dtype=np.int64).reshape(len(rows), -1) if rows else np.zeros((0, self.length), np.int64)
        if a.ndim != 2 or a.shape[1] != self.length:
            raise ValueError(f"header of {a.shape[-1]} ints, the layout holds {self.length}")
        return Headers(self, a)

    def check_reduced(self, g: Gathered) -> None:
        """ValueError unless the reduced counts have this layout's shape (``counts_len`` sums, a third as
        many maxima)."""
        if len(g.totals) != self.counts_len or len(g.tokens_max) != self.counts_len // 3:
            raise ValueError(f"reduced counts of {len(g.totals)} + {len(g.tokens_max)} ints, the layout holds "
                             f"{self.counts_len} + {self.counts_len // 3}")


def header_layout(summary_len: int, W: int, lanes: int = 1, exchange: bool = False, slack: int = 0) -> HeaderLayout:
    """The header layout of a loader with this policy summary length and window (per rank), `lanes` ranks per
    pool (`odb.core.placement`: the table's window is ``lanes * W``), the round exchange or not, and its budget
    balance's `slack` (basis points): what the loader, the simulation and the planner build theirs with."""
    return HeaderLayout(summary_len, lanes * W, len(intake_ladder(lanes * W)), lanes, exchange, slack)
