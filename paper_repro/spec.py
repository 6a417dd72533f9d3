"""`RunSpec`: one `make repro` run (one torchrun job, every method side by side, repeated), typed.

Specs travel to the ranks as JSON; `RunSpec.of` turns a dict into the complete dict every reader
uses, refusing an unknown key (a typo fails loudly instead of falling back to a default) and a key
of the wrong type.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunSpec"]


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    name: str
    kind: str = "lengths"            # "lengths" (a paper distribution), "text" (the chat corpus), "mm" (images)
    dist: str | None = None          # kind="lengths": the distribution (`paper_repro.distributions`)
    paper_cv: float | None = None    # the paper dataset's CV this run stands for
    num_train: int = 256
    num_val: int = 64
    cutoff: int = 1024
    max_side: int = 448              # kind="mm": the largest image side
    length_scale: float = 16.0       # lengths divided by this (CV unchanged)
    seed: int = 0
    vocab: int = 2048
    net: dict = field(default_factory=lambda: {"dim": 64, "layers": 2, "heads": 4})
    lora: bool = False
    lora_r: int = 8
    lr: float = 2e-3
    lr_scaling: str = "sqrt"         # "sqrt" | "none"
    budget: int = 768
    epochs: int = 3
    window: int = 256
    attention: float | None = None   # ODB's policy attention term (`odb.batching.BalancedPolicy`); None: its default
    bmt_bucket: int = 4096
    methods: list = field(default_factory=list)
    timeout_s: float = 120
    accum_match: str = "odb_pad"
    accum_methods: list = field(default_factory=lambda: ["standard1", "standardB"])
    repeats: int = 3                 # interleaved rounds: every method once per round, the order rotated
    first_round: int = 0             # this job's rounds are first_round .. first_round + repeats - 1 (their
                                     # index and their rotation): `make repro` runs one job per round
    accums: dict = field(default_factory=dict)  # method -> micro-batches per optimizer step, fixed by the
                                     # workload's first job; a method not in it is matched in this job
    warmup_steps: int = 8            # unmeasured forward/backward steps before round 0 (kernels, gloo, allocator)
    max_load_cores: float = 0.15     # a run during which other programs kept more cores busy than this is
                                     # "loaded" (paper_repro.cpu) and is rerun at once, up to `retries` times,
    retries: int = 2                 # while the job's reruns have cost less than `retry_budget_s` (loop seconds);
    retry_budget_s: float = 60.0     # the least loaded attempt is kept, the others are recorded beside it
    cache_pipeline: str | None = None  # kind="lengths": the real pipeline ("text" | "mm") whose measured
                                       # per-sample cost prices GMT/BMT's length cache (paper_repro.cache_cost)

    @classmethod
    def of(cls, spec: dict) -> dict:
        """The complete spec dict; ValueError names an unknown key (with the valid ones) or a wrong type."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(spec) - set(names))
        if unknown:
            raise ValueError(f"run spec {spec.get('name')!r} has unknown keys {unknown}; valid: {sorted(names)}")
        full = dataclasses.asdict(cls(**spec))
        for k, v in full.items():
            want = _kinds(names[k].type)
            if v is not None and not isinstance(v, want):
                raise ValueError(f"run spec {spec.get('name')!r}: {k}={v!r} is not a {names[k].type}")
        return full


def _kinds(annotation: Any) -> tuple:
    kinds = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "dict": (dict,), "list": (list,)}
    return tuple(t for part in str(annotation).replace(" ", "").split("|") for t in kinds.get(part, ()))
