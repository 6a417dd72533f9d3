"""The settings every rank's replicated decisions may read, and the construction check built from them.

A *replicated decision* is one every rank computes by itself and must get alike: the
round's target and the policy's proposal, the dealer's deals, each rank's intake bound,
the end game.  Such a decision may read only the gathered headers (`odb.core.header`)
and the fields of `Shared` (the rule `Table.validate` enforces inside the table, applied
to the code around it).  `Shared` is the whole list: `odb.core.replica.Replicated` gets
nothing else, and the construction check (`Shared.vector`, one fixed-shape all-gather per
loader) is generated from its fields, so no setting a replica reads can be left out of
the check.  A value that differs per rank but which a decision needs (each rank's
prefetch, ``ahead``) is gathered, never read locally: it rides in the same all-gather,
uncompared (`GATHERED`).
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

from ..protocol.table import MODES

__all__ = ["Shared", "GATHERED", "PARAMETERS", "describe_cost", "describe_policy", "mismatches"]

GATHERED = ("ahead",)  # per-rank values gathered with the check (each rank's own; not compared)
# the ODBDataLoader arguments behind each field, for messages
PARAMETERS = {"protocol": "the installed ODB version", "window": "buffer_size, placement", "mode": "mode",
              "sharding": "sharding", "header_len": "policy, buffer_size", "policy": "policy",
              "cost": "cost, token_budget", "loss_basis": "loss_basis", "shift_labels": "shift_labels",
              "order": "shuffle, seed, len(dataset)", "lanes": "placement", "exchange": "placement",
              "exchange_slack": "placement", "first_window": "first_window, buffer_size, placement"}


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


@dataclass(frozen=True, kw_only=True)
class Shared:
    """What every rank must set alike (see the module docstring).

    :param protocol: the ODB version and the table's hash (ranks running other code decide otherwise).
    :param window: the window the table runs with: ``buffer_size`` times ``lanes``.
    :param lanes: ranks per pool sharing one window (``placement``; `odb.core.placement`), 1 without pooling.
    :param mode: "pad" | "join" | "quota".
    :param sharding: "fixed" | "dealt".
    :param header_len: ints in one header (`odb.core.header.HeaderLayout.length`).
    :param policy: `describe_policy` of the alignment policy.
    :param cost: `describe_cost` of the cost model (budgets included).
    :param loss_basis: "label_tokens" | "tokens" | "samples" (the global counts every scale divides by).
    :param shift_labels: how label tokens are counted (the global label counts are sums of every rank's).
    :param exchange: the round exchange (`odb.core.rank`): the table's cfg ``xchg``.
    :param exchange_slack: its budget balance (`odb.batching.exchange`), basis points; the plan reads it.
    :param first_window: the table's cfg ``W0``: the window of a pass's first round, doubling each round up to
        `window` (``first_window`` times ``lanes``); 0: every round holds `window`.
    :param order: how the loader builds its own order (``"shuffle=True seed=0 positions=600"``), or
        "own" when each rank brings its own samples (a sampler, an IterableDataset).
    """

    protocol: str
    window: int
    mode: str
    sharding: str
    header_len: int
    policy: str
    cost: str
    loss_basis: str
    shift_labels: bool
    order: str
    lanes: int = 1
    exchange: bool = False
    exchange_slack: int = 0
    first_window: int = 0

    def table_cfg(self) -> dict[str, int]:
        """The table's cfg (`odb.protocol.table`) these settings run: every rank's alike."""
        return {"W": self.window, "W0": min(self.window, self.first_window or self.window),
                "mode": MODES[self.mode], "header_len": self.header_len, "xchg": int(self.exchange)}

    def vector(self) -> list[int]:
        """One int per field (strings as CRC-32), in field order: what the construction check gathers."""
        out = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out.append(_crc(v) if isinstance(v, str) else int(v))
        return out

    def describe(self) -> list[str]:
        """The fields as text, in field order (printed when the ranks disagree)."""
        return [repr(getattr(self, f.name)) for f in dataclasses.fields(self)]

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


def mismatches(rows: Sequence[Sequence[int]]) -> list[str]:
    """The `Shared` fields on which the gathered vectors (one per rank, `Shared.vector` first) differ."""
    names = Shared.names()
    return [name for j, name in enumerate(names) if len({row[j] for row in rows}) > 1]


def describe_policy(policy: Any) -> str:
    """The policy's class, summary length and public attributes (its parameters), each as `_canon` writes it.

    Underscored attributes are caches and are left out; a policy whose decisions depend on other state must
    expose it as a public attribute (a value, a container of values or an array) for the check to see it.
    """
    cls = type(policy)
    parts = [f"{cls.__module__}.{cls.__qualname__}", f"summary_len={policy.summary_len!r}"]
    params = {k: v for k, v in sorted(vars(policy).items()) if not k.startswith("_")} \
        if hasattr(policy, "__dict__") else {}
    parts += [f"{k}={_canon(v)}" for k, v in params.items()]
    return " ".join(parts)


def _plain(v: Any) -> bool:
    if isinstance(v, (bool, int, float, str)) or v is None:
        return True
    return isinstance(v, tuple) and all(_plain(x) for x in v)


def describe_cost(cost: Any) -> str:
    """The cost model as text: kinds and budgets of every resource; for a callable, its name,
    budgets, qualified name and a CRC of its code, constants, defaults and captured values."""
    from ..batching.cost import BudgetCost, CallableCost

    if isinstance(cost, BudgetCost):
        res = ", ".join(f"{r.name}:{r.kind}<={r.budget:g}" + (f" a={r.a!r} b={r.b!r}" if r.kind == "quadratic" else "")
                        for r in cost.resources)
        return f"{cost.name}({res})"
    if isinstance(cost, CallableCost):
        return f"callable {cost.name}(budgets={list(cost.budgets)}) {_describe_fn(cost.fn)}"
    cls = type(cost)
    text = repr(cost)
    own = " at 0x" not in text  # a default object repr holds an address, different on every rank
    return f"{cls.__module__}.{cls.__qualname__}" + (f" {text}" if own else "")


def _describe_fn(fn: Any) -> str:
    import functools

    if isinstance(fn, functools.partial):
        # the bound values as `_canon` writes them: an array by its bytes (its repr elides the middle), an
        # object whose repr holds an address by its type (the address differs on every rank)
        return f"partial({_describe_fn(fn.func)}, args={_canon(fn.args)}, keywords={_canon(dict(fn.keywords))})"
    code = getattr(fn, "__code__", None)
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    if code is None:
        return name
    cells = [_canon(getattr(c, "cell_contents", None)) for c in (fn.__closure__ or ())]
    blob = repr((code.co_code, code.co_consts, _canon(getattr(fn, "__defaults__", None)), cells))
    return f"{name} code={zlib.crc32(blob.encode()):08x}"


def _canon(v: Any, depth: int = 0) -> str:
    """A captured value as text that is equal on two ranks exactly when the values are: scalars (numpy's as
    Python's), containers element by element (a dict and a set in sorted order), arrays by dtype, shape and
    a CRC of their bytes, callables by `_describe_fn`; an object whose repr holds an address, by its type only
    (its state cannot be compared: a cost that depends on it must expose it as a plain value)."""
    if depth > 6:
        return "..."
    if _plain(v):
        return repr(v)
    item = getattr(v, "item", None)
    if getattr(v, "shape", None) == () and callable(item):  # a numpy (or torch) scalar
        return repr(item())
    if isinstance(v, (list, tuple)):
        return f"{type(v).__name__}[" + ", ".join(_canon(x, depth + 1) for x in v) + "]"
    if isinstance(v, (set, frozenset)):
        return "set[" + ", ".join(sorted(_canon(x, depth + 1) for x in v)) + "]"
    if isinstance(v, dict):
        items = sorted(f"{_canon(k, depth + 1)}: {_canon(x, depth + 1)}" for k, x in v.items())
        return "dict[" + ", ".join(items) + "]"
    tobytes = getattr(v, "tobytes", None)
    if callable(tobytes) and hasattr(v, "dtype"):  # a numpy array
        return f"array {v.dtype} {tuple(v.shape)} {zlib.crc32(tobytes()):08x}"
    if callable(v) and hasattr(v, "__code__") or hasattr(v, "func") and hasattr(v, "keywords"):
        return _describe_fn(v)
    text = repr(v)
    return type(v).__qualname__ + ("" if " at 0x" in text else f" {text}")
