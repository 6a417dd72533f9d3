"""One rank's round collective on the loader's own gloo group: every rank's header and the loss counts.

Each round every rank posts one `odb.core.header.Post`: an int64 header of the same length H on every
rank (`odb.core.header.HeaderLayout.length`) and 3W int64 counts; `collect` returns the same `Gathered`
on every rank (the N headers, the counts summed over the ranks, each batch's largest token count), in one
of two ways fixed at construction from N and W alone (`counts_mode`), so every rank takes the same one:

    gather   one all-gather of header + counts (N (H + 3W) ints received); sums and maxima computed
             locally.  While that is at most `GATHER_LIMIT` ints: the cheapest round here.
    reduce   two all-reduces: a SUM of one vector holding N header slots (each rank writes its own, the
             others are zero, so the sum is every rank's header) followed by the 3W counts, and a MAX of
             the W token counts.  A rank receives 2 (N-1)/N x (N H + 4W) ints: the counts' share does not
             grow with N.

Both are fixed-shape collectives in a fixed order on every rank; measured side by side in
docs/decisions/2026-12-01-counts-reduced.md (mixing an all-gather with all-reduces in one round was the
slowest on loopback gloo).  `HeaderGather` is what the engine runs and what ``make bench`` times
(`paper_repro.bench_runtime.collective_scaling`), so the measured cost of a round is the runtime's.

`BatchTransfer` moves the round exchange's batches (`odb.core.rank`, `odb.batching.exchange`) after the
collective that planned them: point-to-point, between the pairs of ranks the plan names and no others.
Every rank computed the same plan from the gathered fills, so each send has its receive; the sends and
receives are all posted at once (no order between pairs, so no pair waits on another).
"""

from __future__ import annotations

import io
import pickle
import time
from datetime import timedelta

import torch

from ..core.header import Gathered, Post, reduce_posts
from ..core.types import COUNTS_LEN, Batch
from ..errors import ProtocolError, SampleError

__all__ = ["HeaderGather", "BatchTransfer", "counts_mode", "GATHER_LIMIT"]

GATHER_LIMIT = 1 << 17  # ints a rank may receive per round in the all-gather (1 MiB); above it, reduce


def counts_mode(world_size: int, header_len: int, window: int) -> str:
    """"gather" or "reduce" for N ranks, headers of `header_len` ints and window W (module docstring)."""
    return "gather" if world_size * (header_len + COUNTS_LEN * window) <= GATHER_LIMIT else "reduce"


def _remedy(placement: str) -> str:
    """What a user can do when the exchange cannot move a sample, naming the setting as they passed it."""
    return (f"The round exchange ({placement}{', on 2 ranks or more' if 'auto' in placement else ''}) moves "
            "batches between ranks: make every sample picklable by any rank, or pass placement=None to keep each "
            "batch on its rank")


def _few(indices: list, n: int = 8) -> str:
    return str(indices) if len(indices) <= n else f"{indices[:n]} and {len(indices) - n} more"

class HeaderGather:
    """Post a rank's `Post`, then collect the round's `Gathered` (``group`` None: world size 1, the rank's own).

    ``post`` starts the round's collectives (`counts_mode`) and returns at once; ``collect`` waits at most
    ``timeout_s`` for all of them together and returns the N headers as an ``(N, H)`` int64 array with the reduced
    counts, raising what gloo raises (timeout, a peer closed the connection).  One post, then one collect,
    per round, in the same order on every rank."""

    def __init__(self, group, world_size: int, mode: str = "reduce"):
        if mode not in ("gather", "reduce"):
            raise ValueError(f"mode must be 'gather' or 'reduce', not {mode!r}")
        self.group, self.world_size, self.mode = group, world_size, mode
        self.rank = 0 if group is None else torch.distributed.get_rank(group=group)
        self._works = self._sums = self._maxes = self._recv = self._solo = None
        self._h = 0

    def post(self, post: Post) -> None:
        """SYNC: every rank must reach this, once per round, in the same order."""
        if self.group is None:
            self._solo, self._works = reduce_posts([post]), None
            return
        n, h = self.world_size, len(post.header)
        self._h = h
        dist, op = torch.distributed, torch.distributed.ReduceOp
        if self.mode == "gather":
            send = torch.tensor([*post.header, *post.counts], dtype=torch.int64)
            self._recv = [torch.empty_like(send) for _ in range(n)]
            # SYNC: every rank must reach this (one fixed-shape all-gather per round)
            self._works = [dist.all_gather(self._recv, send, group=self.group, async_op=True)]
            return
        self._sums = torch.zeros(n * h + len(post.counts), dtype=torch.int64)
        self._sums[self.rank * h:(self.rank + 1) * h] = torch.tensor(post.header, dtype=torch.int64)
        self._sums[n * h:] = torch.tensor(post.counts, dtype=torch.int64)
        self._maxes = torch.tensor(post.counts[0::COUNTS_LEN], dtype=torch.int64)  # each batch's tokens
        # SYNC: every rank must reach these, in this order (two fixed-shape all-reduces per round)
        self._works = [dist.all_reduce(self._sums, op=op.SUM, group=self.group, async_op=True),
                       dist.all_reduce(self._maxes, op=op.MAX, group=self.group, async_op=True)]

    def collect(self, timeout_s: float) -> Gathered:
        if self._works is None:
            return self._solo
        deadline = time.monotonic() + timeout_s
        try:
            for w in self._works:  # one deadline for the round, not one per collective
                w.wait(timeout=timedelta(seconds=max(0.001, deadline - time.monotonic())))
        finally:
            self._works = None
        n, h = self.world_size, self._h
        if self.mode == "gather":  # every rank's header and counts: the sums and maxima computed here
            a = torch.stack(self._recv).numpy()
            return Gathered(a[:, :h], a[:, h:].sum(axis=0).tolist(), a[:, h::3].max(axis=0).tolist())
        # the headers as the (N, H) int64 array (decoded a field at a time: `odb.core.header.Headers`)
        return Gathered(self._sums[:n * h].view(n, h).numpy(), self._sums[n * h:].tolist(), self._maxes.tolist())

    def release(self) -> None:
        """Drop the hold on the group and the buffers (a group kept alive past the pass would be destroyed
        during interpreter finalization)."""
        self.group = self._works = self._sums = self._maxes = self._recv = self._solo = None


_LEN, _DATA = 1, 2  # the p2p tags of a transfer: a message's length, then the message


class BatchTransfer:
    """One rank's side of the round exchange's moves on the loader's gloo group (module docstring).

    `move(send, expect, timeout_s)`: `send` is ``(rank, origin slot, Batch)`` per batch this rank hands to
    another (`odb.core.rank.Out.send`), `expect` ``(rank, origin slot)`` per batch it receives
    (`odb.core.rank.Out.expect`).  Each peer gets one message: its batches pickled (samples, positions,
    dataset indices, sizes, counts), preceded by the message's length.  Returns the received batches by
    origin slot, for `odb.core.rank.RankCore.receive`, and the errors of this transfer that are the data's
    (a batch that cannot be pickled: the peer gets a message saying so instead, so it never waits for it;
    a peer's such message): the caller stops this rank through the table, as for any sample error.
    Raises what gloo raises (a peer closed the connection, ``timeout_s`` passed: one deadline for the
    whole transfer), and ProtocolError if a peer sent a batch the plan does not name."""

    def __init__(self, group, placement: str = "placement='auto' (the default)"):
        self.group, self.remedy = group, _remedy(placement)
        self.rank = 0 if group is None else torch.distributed.get_rank(group=group)
        self.bytes_sent = self.bytes_received = 0

    def move(self, send, expect, timeout_s: float) -> tuple[dict, list[BaseException]]:
        if not send and not expect:
            return {}, []
        if self.group is None:
            raise ProtocolError("a transfer between ranks in a world of one")
        dist = torch.distributed
        deadline = time.monotonic() + timeout_s
        out: dict[int, list] = {}
        for q, origin, b in send:  # in the plan's order: the same message however the batches were held
            out.setdefault(int(q), []).append((tuple(origin), b.samples, b.positions, b.indices, b.sizes, b.counts))
        errors: list[BaseException] = []
        works, keep = [], []
        for q, items in out.items():
            try:
                data = _dumps(("batches", items))
            except Exception as e:  # the samples' own objects: the peer is told, and this rank stops
                what = [int(i) for it in items for i in (it[3] or ())]
                errors.append(SampleError(f"rank {self.rank}: the round exchange cannot send dataset indices "
                                          f"{_few(what)} to rank {q}: pickling their samples raised "
                                          f"{type(e).__name__}: {e}. {self.remedy}"))
                data = pickle.dumps(("error", f"rank {self.rank} could not pickle dataset indices {what} "
                                              f"({type(e).__name__}: {str(e)[:200]})"))
            blob = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            size = torch.tensor([blob.numel()], dtype=torch.int64)
            keep += [blob, size]
            self.bytes_sent += blob.numel()
            works.append(dist.isend(size, group=self.group, group_dst=q, tag=_LEN))
            works.append(dist.isend(blob, group=self.group, group_dst=q, tag=_DATA))
        sizes = {r: torch.empty(1, dtype=torch.int64) for r in sorted({int(r) for r, _ in expect})}
        _wait([dist.irecv(t, group=self.group, group_src=r, tag=_LEN) for r, t in sizes.items()], deadline)
        blobs = {r: torch.empty(int(t.item()), dtype=torch.uint8) for r, t in sizes.items()}
        _wait([dist.irecv(t, group=self.group, group_src=r, tag=_DATA) for r, t in blobs.items()] + works, deadline)
        got, want = {}, {tuple(o): int(r) for r, o in expect}
        for r, blob in blobs.items():
            self.bytes_received += blob.numel()
            try:
                kind, items = pickle.loads(blob.numpy().tobytes())
            except Exception as e:  # the samples' own objects (a class only the sender has, memory): the data's
                errors.append(SampleError(f"rank {self.rank}: the round exchange cannot read the batches rank {r} "
                                          f"sent: unpickling them raised {type(e).__name__}: {str(e)[:300]}; every "
                                          f"rank stops in the next round. {self.remedy}"))
                continue
            if kind == "error":
                errors.append(SampleError(f"rank {self.rank}: the round exchange lost the batches of rank {r}: "
                                          f"{items}; every rank stops in the next round"))
                continue
            for origin, samples, positions, indices, sizes_, counts in items:
                if want.get(origin) != r or origin in got:
                    raise ProtocolError(f"rank {self.rank}: rank {r} sent the batch formed at {origin}, which the "
                                        "plan does not have it send here (the ranks' plans differ)")
                got[origin] = Batch(samples, positions, indices, sizes_, counts)
        return got, errors

    def release(self) -> None:
        self.group = None


class _Pickler(pickle.Pickler):
    """Pickles a plain CPU tensor as its own bytes, its dtype's name and its shape, not through torch's storage
    reduction: that one serializes each storage with ``torch.save`` (about 10x slower on samples of token ids),
    sends a view's whole storage (a row of a memory-mapped table: the table), and cannot be unpickled for
    some dtypes (uint16 to uint64, float8: issue 50).  Every dtype takes this one path; a tensor that requires
    grad, a sparse, quantized or non-CPU one, and every other object take pickle's own."""

    def reducer_override(self, obj):
        if type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.layout == torch.strided and \
                not obj.requires_grad and not obj.is_quantized:
            flat = obj.detach().contiguous().reshape(-1)
            data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
            return _tensor, (data, str(obj.dtype).removeprefix("torch."), tuple(obj.shape))
        return NotImplemented


def _tensor(data: bytes, dtype: str, shape: tuple) -> torch.Tensor:
    """A tensor of `dtype` and `shape` over a fresh buffer holding `data` (what `_Pickler` sent)."""
    dt = getattr(torch, dtype)
    if not data:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dt).reshape(shape)


def _dumps(obj) -> bytes:
    f = io.BytesIO()
    _Pickler(f, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return f.getvalue()


def _wait(works, deadline: float) -> None:
    for w in works:  # one deadline for the transfer, not one per message
        w.wait(timeout=timedelta(seconds=max(0.001, deadline - time.monotonic())))
