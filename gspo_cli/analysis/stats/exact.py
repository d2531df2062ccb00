"""Checks on per-seed differences that do not lean on a normal model: their shape (an outlier, two
modes), an exact sign-flip test, whether one collapsed seed would reverse a verdict, and how rare a
collapse the seeds can exclude.

- Outlier: seed i's difference against the mean and SD of the others (the externally studentised
  residual), r_i = (d_i - mean_-i) / (sd_-i sqrt(1 + 1/(n-1))), which is t with n - 2 degrees of
  freedom when the differences are normal; an outlier when |r_i| exceeds the t quantile at
  1 - FLAG_RATE / (2n) (Bonferroni over the seeds), so normal differences are flagged in at most
  FLAG_RATE (1%) of experiments. When at least 3 other seeds agree exactly, any seed off them is one
  (two equal values of 3 are common with scores in steps of 1/P and prove nothing).
- Two modes: the sorted differences split at their widest gap into two groups of at least 2 seeds
  each; two modes when the gap over the pooled SD inside the groups exceeds the 99th percentile of
  that ratio for n normal differences (simulated once per n from a fixed RNG seed), so again at
  most FLAG_RATE of normal experiments are flagged.
- Both checks run up to SHAPE_SEEDS (30) seeds.
- Sign-flip test (Fisher 1935; Pitman 1937): under "no difference" each per-seed difference is as
  likely positive as negative, so |sum of d| is compared with |sum of s_i d_i| over all 2^n sign
  patterns s; two-sided p = the share of patterns at least as extreme. The identity and the all-flip
  pattern always count, so p >= 2 / 2^n: 0.25 with 3 seeds, 0.0625 with 5, 0.0039 with 9: below 6
  seeds it cannot reach 0.05 at all. Exact up to EXACT_SEEDS seeds; above, SIGN_DRAWS random
  patterns from a fixed RNG seed, p = (1 + hits) / (1 + draws).
- Collapse rate (Clopper & Pearson 1934): k collapsed of n seeds, the exact two-sided 95% interval
  from the beta quantiles; with none, the one-sided 95% upper bound 1 - 0.05^(1/n) (the rate the seeds
  cannot exclude; ~3/n, the "rule of three"): 0 of 5 seeds, below 45%.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np
from scipy import stats

from gspo_cli.analysis.stats.calibration import clopper_pearson

FLAG_RATE = 0.01
SHAPE_SEEDS = 30
EXACT_SEEDS = 16
SIGN_DRAWS = 1 << 16
RNG_SEED = 20261207


def _tol(d: np.ndarray) -> float:
    """Differences closer than this are equal up to floating-point rounding."""
    return 1e-9 * max(1e-12, float(np.abs(d).max())) if len(d) else 0.0


def outliers(d) -> list[int]:
    """Indices of per-seed differences that are outliers (module docstring); none below 3 seeds."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n < 3:
        return []
    crit = float(stats.t.ppf(1 - FLAG_RATE / (2 * n), n - 2))
    out = []
    for i in range(n):
        rest = np.delete(d, i)
        off, sd = abs(d[i] - rest.mean()), float(rest.std(ddof=1))
        if off <= _tol(d):
            continue
        if sd <= _tol(d):  # the others agree exactly: an outlier if at least 3 of them do
            if n >= 4:
                out.append(i)
        elif off / (sd * math.sqrt(1 + 1 / (n - 1))) > crit:
            out.append(i)
    return out


def _gap_ratio(x: np.ndarray) -> np.ndarray:
    """(E, n) -> (E,): the widest gap leaving 2 seeds a side over the pooled SD of the two groups."""
    x = np.sort(x, axis=1)
    n = x.shape[1]
    gaps = np.diff(x, axis=1)[:, 1:-1]
    low = np.arange(n)[None, :] < (np.argmax(gaps, axis=1) + 2)[:, None]
    m_lo = (x * low).sum(1) / low.sum(1)
    m_hi = (x * ~low).sum(1) / (~low).sum(1)
    ss = ((x - m_lo[:, None]) ** 2 * low).sum(1) + ((x - m_hi[:, None]) ** 2 * ~low).sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return gaps.max(1) / np.sqrt(ss / (n - 2))


@lru_cache(maxsize=64)
def _two_mode_limit(n: int) -> float:
    normal = np.random.default_rng(RNG_SEED + n).normal(size=(20000, n))
    return float(np.quantile(_gap_ratio(normal), 1 - FLAG_RATE))


def two_modes(d) -> bool:
    """Whether the per-seed differences fall into two separated groups (module docstring); never
    below 4 seeds."""
    x = np.asarray(d, dtype=float)
    if len(x) < 4 or np.ptp(x) <= _tol(x):
        return False
    return bool(_gap_ratio(x[None, :])[0] > _two_mode_limit(len(x)))


def shape_flags(d) -> list[str]:
    """Words for an unusual spread of per-seed differences: "an outlying seed (+0.3)", "two modes";
    none above SHAPE_SEEDS seeds (there the mean of even a 10% collapse mixture is close enough to
    normal for the t test, and the checks would only cost time)."""
    d = np.asarray(d, dtype=float)
    if len(d) > SHAPE_SEEDS:
        return []
    out = [f"an outlying seed ({d[i]:+.3g})" for i in outliers(d)]
    if not out and two_modes(d):
        out.append("two modes")
    return out


def sign_flip_p(d, alternative: str = "two-sided") -> float:
    """p of the sign-flip permutation test of a zero mean of `d` (module docstring): "two-sided"
    (|sum| at least as large), "greater" (sum at least as large: a mean above 0) or "less". NaN for
    no values. Zeros are kept (their sign does not matter)."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n == 0:
        return math.nan
    stat = {"two-sided": np.abs, "greater": lambda x: x, "less": lambda x: -x}[alternative]
    observed = float(stat(np.array([d.sum()]))[0]) - _tol(d) * n
    if n <= EXACT_SEEDS:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))  # (2^n, n)
        return float(np.mean(stat(signs @ d) >= observed))
    rng = np.random.default_rng(RNG_SEED)
    hits = 0
    for _ in range(SIGN_DRAWS // 4096):
        signs = rng.choice((1.0, -1.0), size=(4096, n))
        hits += int((stat(signs @ d) >= observed).sum())
    return (1 + hits) / (1 + SIGN_DRAWS)


def smallest_sign_flip_p(n: int) -> float:
    """The smallest two-sided p the sign-flip test can give with n seeds: 2 / 2^n."""
    return 2.0 / 2**n if n > 0 else math.nan


def one_collapse_reverses(d, collapse: float, alpha: float) -> bool:
    """Whether a paired t verdict on `d` at level `alpha` would not survive one collapsed seed: the
    seed most favourable to the sign of the mean replaced by a difference of `collapse` (> 0, in
    the metric's units) against that sign (a collapse of the favoured arm at that seed), the t test
    is no longer below alpha in the same direction. False when the mean is 0 or there are fewer
    than 2 seeds."""
    d = np.asarray(d, dtype=float)
    mean = float(d.mean()) if len(d) else 0.0
    if len(d) < 2 or mean == 0 or not math.isfinite(collapse):
        return False
    e = d.copy()
    e[int(np.argmax(d * np.sign(mean)))] = -np.sign(mean) * abs(collapse)
    new_mean, sd = float(e.mean()), float(e.std(ddof=1))
    if np.sign(new_mean) != np.sign(mean):
        return True
    if sd == 0:
        return False
    p = 2 * stats.t.sf(abs(new_mean) / (sd / math.sqrt(len(e))), len(e) - 1)
    return not p < alpha


def collapse_interval(collapsed: int, seeds: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson interval of the collapse rate from `collapsed` of `seeds`: two-sided at `level`;
    with none collapsed, (0, the one-sided upper bound 1 - (1 - level)^(1/n)). (NaN, NaN) for no seeds."""
    if seeds <= 0:
        return math.nan, math.nan
    if collapsed == 0:
        return 0.0, 1.0 - (1.0 - level) ** (1.0 / seeds)
    return clopper_pearson(collapsed, seeds, level)


__all__ = [
    "EXACT_SEEDS",
    "collapse_interval",
    "one_collapse_reverses",
    "outliers",
    "shape_flags",
    "sign_flip_p",
    "smallest_sign_flip_p",
    "two_modes",
]
