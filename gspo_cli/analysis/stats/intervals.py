"""Differences of one arm from a baseline over seeds: paired when the seeds pair, Welch when not.

Two arms run with the same seed share the cold-start model, the training-problem stream and the
held-out problems, so their per-seed numbers are paired by construction. The interval is then on
the per-seed differences d_s = arm_s - base_s: mean(d) ± t_{0.975, n-1} sd(d) / sqrt(n). Seeds
that only one arm has cannot be paired; with at least two seeds in common they are left out (and
the method says how many), with fewer the two arms' seed means are compared by Welch's interval.
Every quantile comes from `scipy.stats`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from gspo_cli.analysis.stats.components import Components

NO_SPREAD = 1e-9  # a standard error below this fraction of |difference| is no spread (see Estimate)


def t_quantile(q: float, df: float) -> float:
    """Quantile q of Student's t with df degrees of freedom (df may be fractional; infinite: the
    normal, as a log-rank test's `Estimate` has); NaN for df <= 0 or NaN."""
    return float(stats.t.ppf(q, df)) if df > 0 and not math.isnan(df) else math.nan


def t975(df: float) -> float:
    """Upper 97.5% quantile of Student's t (a 95% two-sided interval); NaN for df < 1."""
    return t_quantile(0.975, df) if df >= 1 else math.nan


@dataclass(frozen=True)
class Estimate:
    """A difference arm - baseline with its standard error and degrees of freedom.

    `se` is NaN when the data cannot give one (a lone seed on a side); `sd_pairs` is the sample SD
    of the per-seed differences of a paired design (Welch: sqrt(sd_arm^2 + sd_base^2), what the
    differences would spread by without pairing), the number a plan for more seeds starts from.
    `components` holds the variance decomposition when problem records gave one; `diffs` the
    per-seed differences of a paired design (empty otherwise), for the checks that do not lean on a
    normal model (`stats.exact`). `p_exact` is an exact (permutation) p that the test uses instead
    of the t's when it is finite.
    """

    delta: float
    se: float
    df: float
    method: str
    n_paired: int
    n_arm: int
    n_base: int
    sd_pairs: float = math.nan
    components: Components | None = None
    p_exact: float = math.nan
    diffs: tuple[float, ...] = ()

    @property
    def no_spread(self) -> bool:
        """An interval of zero width: the standard error is 0, or below NO_SPREAD x |delta| (a t
        statistic above 1e9 is floating-point rounding of equal differences, never a measured
        noise). Such a row has no test: nothing measures how far its difference could be off."""
        return self.has_interval and self.se <= NO_SPREAD * abs(self.delta)

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.delta) and math.isfinite(self.se) and (self.se == 0 or self.df > 0)

    def ci(self, level: float = 0.95) -> tuple[float, float]:
        """Two-sided t interval at `level`; (NaN, NaN) without a standard error."""
        if not self.has_interval:
            return math.nan, math.nan
        if self.se == 0:
            return self.delta, self.delta
        half = t_quantile(0.5 + level / 2, self.df) * self.se
        return self.delta - half, self.delta + half

    @property
    def p_value(self) -> float:
        """Two-sided p of the t test of a zero difference; NaN without a standard error."""
        if not self.has_interval:
            return math.nan
        if self.no_spread:
            return 1.0 if self.delta == 0 else math.nan
        if math.isfinite(self.p_exact):
            return self.p_exact
        return float(2 * stats.t.sf(abs(self.delta) / self.se, self.df))

    def tost_p(self, margin: float) -> float:
        """Two one-sided tests (Schuirmann 1987) of |difference| >= margin: the larger of the two
        one-sided p-values. p < 0.05 is the same as the 90% interval lying inside ±margin."""
        if not self.has_interval or margin is None:
            return math.nan
        if self.no_spread:
            return math.nan
        lower = stats.t.sf((self.delta + margin) / self.se, self.df)  # H0: delta <= -margin
        upper = stats.t.cdf((self.delta - margin) / self.se, self.df)  # H0: delta >= +margin
        return float(max(lower, upper))


def _finite(values: dict[int, float]) -> dict[int, float]:
    return {s: float(v) for s, v in values.items() if v is not None and math.isfinite(v)}


def paired_t(d: np.ndarray, method: str, n_arm: int, n_base: int) -> Estimate:
    """The t interval on per-seed differences `d` (n-1 degrees of freedom)."""
    n = len(d)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, method, 0, n_arm, n_base)
    sd = float(np.std(d, ddof=1)) if n > 1 else math.nan
    if sd <= 1e-12 * max(1.0, float(np.abs(d).max())):  # equal differences up to rounding: no spread
        sd = 0.0
    diffs = tuple(float(x) for x in d)
    return Estimate(float(d.mean()), sd / math.sqrt(n), n - 1, method, n, n_arm, n_base, sd_pairs=sd, diffs=diffs)


def welch(arm: list[float] | np.ndarray, base: list[float] | np.ndarray, method: str = "") -> Estimate:
    """Difference of seed means with the Welch-Satterthwaite standard error and df (finite values
    only); no standard error when a side has fewer than two values."""
    x = np.asarray([v for v in arm if math.isfinite(v)], dtype=float)
    y = np.asarray([v for v in base if math.isfinite(v)], dtype=float)
    method = method or f"Welch, {len(x)} vs {len(y)} seeds"
    if len(x) == 0 or len(y) == 0:
        return Estimate(math.nan, math.nan, math.nan, method, 0, len(x), len(y))
    delta = float(x.mean() - y.mean())
    if len(x) < 2 or len(y) < 2:
        return Estimate(delta, math.nan, math.nan, method, 0, len(x), len(y))
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    se2 = va + vb
    df = se2**2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1)) if se2 > 0 else math.inf
    sd = math.sqrt(x.var(ddof=1) + y.var(ddof=1))
    return Estimate(delta, math.sqrt(se2), df, method, 0, len(x), len(y), sd_pairs=sd)


def seed_difference(arm: dict[int, float], base: dict[int, float]) -> Estimate:
    """arm - baseline from one number per seed ({seed: value}; NaN or None = the seed lacks it).

    Paired t over the seeds both arms have when there are at least two of them (unpaired seeds
    left out, and counted in the method); otherwise Welch over every seed.
    """
    a, b = _finite(arm), _finite(base)
    common = sorted(set(a) & set(b))
    if len(common) >= 2:
        left = len(a) + len(b) - 2 * len(common)
        method = f"paired t, {len(common)} seeds" + (f" ({left} unpaired left out)" if left else "")
        d = np.array([a[s] - b[s] for s in common])
        return paired_t(d, method, len(a), len(b))
    if not a or not b:
        return welch(list(a.values()), list(b.values()), f"no values: {len(a)} vs {len(b)} seeds have one")
    why = "no seed in common" if not common else "1 seed in common"
    return welch(list(a.values()), list(b.values()), f"Welch, {len(a)} vs {len(b)} seeds ({why})")


__all__ = ["NO_SPREAD", "Estimate", "paired_t", "seed_difference", "t975", "t_quantile", "welch"]
