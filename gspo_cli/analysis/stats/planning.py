"""How many seeds a difference needs: a plan from a small pilot, not a promise.

The plan that counts is made for the smallest effect of interest (SESOI, Lakens 2017: the
comparison's `effect`, else its equivalence margin), with the pilot's SD replaced by its 80% upper
confidence bound, sd sqrt(df / chi2_{0.2, df}) (the one-sided chi-square bound on a variance), at the
level the row is tested at after the correction (Holm's first step: alpha / m). Plugging in the
pilot's own difference and SD is post-hoc power (Hoenig & Heisey 2001): with 3 seeds both are so
noisy that the plan scatters over two orders of magnitude and, averaged over pilots, falls short of
the power it promises; that plan is still shown, labelled "at the observed difference".

Paired design, two-sided test at level alpha, power 1 - beta: the smallest n whose noncentral-t
power reaches it,
    P(|T| > t_{1-alpha/2, n-1}),  T ~ t'(n - 1, delta / se_n),  se_n = sd / sqrt(n),
with delta and sd (of the per-seed differences) as observed. With a variance decomposition se_n
comes from it instead (the problem share does not shrink with seeds, so some differences cannot
be resolved on the held-out set at hand by any number of seeds). For equivalence within ±margin
(two one-sided tests at alpha each) the power is the Owen-style bound
    P(T+ > t_{1-alpha, n-1}) + P(T- < -t_{1-alpha, n-1}) - 1,  T± ~ t'(n - 1, (delta ± margin) / se_n).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import stats

MAX_SEEDS = 1000


def _first(n: np.ndarray, power: np.ndarray, target: float) -> int | None:
    hit = np.nonzero(power >= target)[0]
    return int(n[hit[0]]) if len(hit) else None


def _search(n: np.ndarray, normal_power: np.ndarray, t_power, target: float) -> int | None:
    """The first n whose t power (`t_power(n_subset)`) reaches target. The normal power (known
    variance) is never below the t power, so the scan starts where the normal one reaches it
    and looks at a short window first: the noncentral t is slow to evaluate."""
    start = _first(n, normal_power, target)
    if start is None:
        return None
    i = int(np.searchsorted(n, start))
    window = n[i : i + 16]
    found = _first(window, t_power(window), target)
    if found is None and i + 16 < len(n):
        rest = n[i + 16 :]
        found = _first(rest, t_power(rest), target)
    return found


def _tail(p: np.ndarray) -> np.ndarray:
    """A noncentral-t tail probability; scipy returns NaN for a tail far from a large noncentrality
    (e.g. cdf(-4.3, 2, 11.3)), where the probability is ~0."""
    return np.nan_to_num(p, nan=0.0)


def _se(n: np.ndarray, sd: float, var_at: Callable[[np.ndarray], np.ndarray] | None) -> np.ndarray:
    return np.sqrt(var_at(n)) if var_at is not None else sd / np.sqrt(n)


def seeds_needed(
    delta: float,
    sd: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    var_at: Callable[[np.ndarray], np.ndarray] | None = None,
    max_seeds: int = MAX_SEEDS,
) -> int | None:
    """Seeds per arm (paired) for `power` to find `delta`; None when no n <= max_seeds does (or
    the inputs are not finite, or delta is 0). `var_at(n)`: the variance of the mean difference
    with n seeds, when a decomposition gives it (then sd is ignored)."""
    if not math.isfinite(delta) or delta == 0 or (var_at is None and not (math.isfinite(sd) and sd >= 0)):
        return None
    n = np.arange(2, max_seeds + 1)
    se = _se(n, sd, var_at)
    if not np.all(np.isfinite(se)):
        return None
    if np.all(se == 0):
        return 2
    nc = abs(delta) / np.maximum(se, 1e-300)
    z = stats.norm.ppf(1 - alpha / 2)
    normal = stats.norm.sf(z - nc) + stats.norm.cdf(-z - nc)

    def t_power(m: np.ndarray) -> np.ndarray:
        crit, k = stats.t.ppf(1 - alpha / 2, m - 1), nc[m - 2]
        return _tail(stats.nct.sf(crit, m - 1, k)) + _tail(stats.nct.cdf(-crit, m - 1, k))

    return _search(n, normal, t_power, power)


def seeds_for_equivalence(
    delta: float,
    sd: float,
    margin: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    var_at: Callable[[np.ndarray], np.ndarray] | None = None,
    max_seeds: int = MAX_SEEDS,
) -> int | None:
    """Seeds per arm (paired) for `power` to show |difference| < margin if the true difference is
    `delta`; None when |delta| >= margin (equivalence is then not the likely outcome) or no
    n <= max_seeds reaches it."""
    if not (math.isfinite(delta) and margin is not None and abs(delta) < margin):
        return None
    if var_at is None and not (math.isfinite(sd) and sd >= 0):
        return None
    n = np.arange(2, max_seeds + 1)
    se = np.maximum(_se(n, sd, var_at), 1e-300)
    lo, hi = (delta + margin) / se, (delta - margin) / se
    z = stats.norm.ppf(1 - alpha)
    normal = stats.norm.sf(z - lo) + stats.norm.cdf(-z - hi) - 1

    def t_power(m: np.ndarray) -> np.ndarray:
        crit, i = stats.t.ppf(1 - alpha, m - 1), m - 2
        return _tail(stats.nct.sf(crit, m - 1, lo[i])) + _tail(stats.nct.cdf(-crit, m - 1, hi[i])) - 1

    return _search(n, normal, t_power, power)


SD_BOUND = 0.8  # the one-sided confidence level of the SD a plan assumes


def sd_upper(sd: float, df: float, level: float = SD_BOUND) -> float:
    """The one-sided `level` upper confidence bound of an SD estimated with df degrees of freedom:
    sd sqrt(df / chi2_{1 - level}(df)); NaN without an SD or df. Infinite df: sd itself."""
    if not (math.isfinite(sd) and sd >= 0 and df > 0) or math.isnan(df):
        return math.nan
    if math.isinf(df):
        return sd
    return sd * math.sqrt(df / float(stats.chi2.ppf(1 - level, df)))


def seeds_for_effect(
    effect: float,
    sd: float,
    df: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    var_at: Callable[[np.ndarray], np.ndarray] | None = None,
    max_seeds: int = MAX_SEEDS,
) -> int | None:
    """Seeds per arm (paired) for `power` to find a true difference of `effect` at level `alpha`,
    with the pilot's SD (df degrees of freedom) taken at its SD_BOUND upper confidence bound; with a
    decomposition `var_at(n)` the whole variance is scaled by the same factor df / chi2_{0.2}(df).
    None when the pilot gives no SD (or a zero one: there is no noise to plan from) or no
    n <= max_seeds reaches the power."""
    if not (math.isfinite(effect) and effect != 0):
        return None
    if var_at is not None:
        if not (df > 0) or math.isnan(df):
            return None
        scale = 1.0 if math.isinf(df) else df / float(stats.chi2.ppf(1 - SD_BOUND, df))
        if not np.all(np.isfinite(var_at(np.arange(2, 4)))) or var_at(np.array([2]))[0] <= 0:
            return None
        return seeds_needed(
            effect, math.nan, alpha=alpha, power=power, var_at=lambda n: scale * var_at(n), max_seeds=max_seeds
        )
    up = sd_upper(sd, df)
    if not (math.isfinite(up) and up > 0):
        return None
    return seeds_needed(effect, up, alpha=alpha, power=power, max_seeds=max_seeds)


__all__ = ["MAX_SEEDS", "SD_BOUND", "sd_upper", "seeds_for_effect", "seeds_for_equivalence", "seeds_needed"]
