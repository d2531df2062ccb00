"""One step's statistics, kept as parts that add up exactly across processes.

Every metric the trainer logs per step is recorded here with the reduction its
definition needs: a weighted mean (a total and a weight: tokens, responses, groups or
mini-batches), a minimum, a maximum, a sum, a value every process holds alike, or the
moments of a standard deviation. Under torchrun each rank records its own share, the
parts are gathered once per step and combined, so the logged numbers are the numbers
one process would log for the same global batch. With one process the same code runs
without any communication.
"""

from __future__ import annotations

import math

from gspo_cli import distributed
from gspo_cli.distributed import DistInfo


class StepStats:
    """Accumulates one step's metrics on one rank; `reduce` combines all ranks."""

    def __init__(self) -> None:
        self.parts: dict[str, tuple] = {}

    def mean(self, key: str, total: float, weight: float) -> None:
        """Add `total` (a sum of values) over `weight` units (tokens, responses, ...)."""
        _, t, w = self.parts.get(key, ("mean", 0.0, 0.0))
        self.parts[key] = ("mean", t + float(total), w + float(weight))

    def max(self, key: str, value: float) -> None:
        old = self.parts.get(key, ("max", -math.inf))[1]
        self.parts[key] = ("max", max(old, float(value)))

    def min(self, key: str, value: float) -> None:
        old = self.parts.get(key, ("min", math.inf))[1]
        self.parts[key] = ("min", min(old, float(value)))

    def sum(self, key: str, value: float) -> None:
        self.parts[key] = ("sum", self.parts.get(key, ("sum", 0.0))[1] + float(value))

    def same(self, key: str, value) -> None:
        """A value every rank holds alike (the step, the learning rate, agreed counts)."""
        self.parts[key] = ("same", value)

    def std(self, key: str, values: list[float]) -> None:
        """Sample standard deviation (n - 1) of all ranks' `values` together."""
        _, n, s1, s2 = self.parts.get(key, ("std", 0, 0.0, 0.0))
        self.parts[key] = ("std", n + len(values), s1 + sum(values), s2 + sum(v * v for v in values))

    def reduce(self, info: DistInfo) -> dict:
        """The step's metrics over every rank, as plain numbers."""
        ranks = distributed.gather_objects(self.parts, info)
        out = {}
        for key in dict.fromkeys(k for parts in ranks for k in parts):
            vals = [parts[key] for parts in ranks if key in parts]
            out[key] = _combine(vals)
        return {k: v for k, v in out.items() if v is not None}


def _combine(vals: list[tuple]):
    kind = vals[0][0]
    if kind == "mean":
        total, weight = sum(v[1] for v in vals), sum(v[2] for v in vals)
        return total / weight if weight > 0 else None
    if kind == "max":
        return max(v[1] for v in vals)
    if kind == "min":
        return min(v[1] for v in vals)
    if kind == "sum":
        return sum(v[1] for v in vals)
    if kind == "same":
        return vals[0][1]
    if kind == "std":
        n, s1, s2 = (sum(v[i] for v in vals) for i in (1, 2, 3))
        if n < 2:
            return 0.0
        return math.sqrt(max(s2 - s1 * s1 / n, 0.0) / (n - 1))
    raise ValueError(f"unknown reduction {kind!r}")
