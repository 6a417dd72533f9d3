"""One verdict of one engine on one property: the unit every report row is made of."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["Verdict"]


@dataclass
class Verdict:
    """:param result: "proved" / "holds" (exhaustive, within scope) / "found" (a sometimes witness) /
    "failed" / "unknown" / "not found".  Only "proved", "holds" and "found" are passes; z3
    ``unknown`` and a truncated search are failures."""

    property: str
    method: str          # e.g. "z3 all-N induction", "explicit BFS", "z3 ranking"
    scope: str           # e.g. "all N>=1, all W>=1, all d", "N<=6, D<=2, W=2"
    mode: str            # "pad" | "join" | "quota" | "all"
    result: str
    seconds: float
    states: int | None = None
    depth: int | None = None
    detail: str = ""
    extra: dict = field(default_factory=dict)

    PASS = ("proved", "holds", "found")

    @property
    def ok(self) -> bool:
        return self.result in self.PASS

    def to_json(self) -> dict:
        return asdict(self)
