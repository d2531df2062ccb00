"""Calibration arithmetic: the exact binomial interval of a false-positive rate, disjoint blocks
of runs, and the records a calibration keeps (`Verdicts` of one pseudo-experiment, a `Rate`). The
pseudo-experiments themselves, which ask compare's differences table for its verdicts, are in
`analysis.report.calibration`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

FALSE = ("better", "worse")


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval for k successes in n trials (Clopper and Pearson 1934)."""
    if n <= 0:
        return math.nan, math.nan
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


@dataclass(frozen=True)
class Verdicts:
    """One pseudo-experiment's rows: metric column id -> (verdict, delta, ci_low, ci_high, sd_pairs)."""

    rows: dict[str, tuple[str, float, float, float, float]]

    def any_false(self) -> bool:
        return any(v[0] in FALSE for v in self.rows.values())

    def verdict(self, metric: str) -> str:
        return self.rows[metric][0]


def disjoint_blocks(n: int, k: int) -> list[list[int]]:
    """Indices 0..n-1 cut into consecutive blocks of k (a remainder is left out)."""
    return [list(range(i, i + k)) for i in range(0, n - k + 1, k)]


@dataclass
class Rate:
    hits: int
    n: int
    ci: tuple[float, float]
    how: str

    @property
    def rate(self) -> float:
        return self.hits / self.n if self.n else math.nan


__all__ = ["FALSE", "Rate", "Verdicts", "clopper_pearson", "disjoint_blocks"]
