"""Time to an event with censoring: the Kaplan-Meier curve and the log-rank test.

Each run gives one time t and whether the event (a collapse) happened then (`event` True) or the
run was last seen without it at t (censored: it may still collapse later; it counts as at risk up
to and including t). A mean of collapse steps would have to drop or invent the censored runs;
these two use them as what they are.

- Kaplan-Meier (1958): S(t) = prod over event times t_j <= t of (1 - d_j / n_j), d_j events at
  t_j, n_j at risk (time >= t_j). Greenwood's variance, var S(t) = S(t)^2 sum d_j / (n_j (n_j - d_j)),
  and a 95% interval on the log(-log) scale, exp(-exp(log(-log S) ± z se)), se = sqrt(sum d_j /
  (n_j (n_j - d_j))) / |log S|, which stays inside [0, 1] (undefined where S is 0 or 1: NaN).
- Log-rank (Mantel 1966): at each event time of the pooled sample, arm a's expected events
  E_j = d_j n_aj / n_j and the hypergeometric variance V_j = d_j (n_aj / n_j)(1 - n_aj / n_j)
  (n_j - d_j) / (n_j - 1); Z = (O_a - E_a) / sqrt(V), two-sided p from the normal. O - E > 0:
  arm a has more events than equal hazards would give it.
Checked against scipy.stats.ecdf (censored data) and scipy.stats.logrank in the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from gspo_cli.analysis.stats.intervals import Estimate


@dataclass(frozen=True)
class KaplanMeier:
    """The curve at each distinct time (event or censoring), ascending: `survival` S(t) just
    after t, `low`/`high` its 95% log(-log) interval, `at_risk` n(t), `events` d(t)."""

    times: np.ndarray
    survival: np.ndarray
    low: np.ndarray
    high: np.ndarray
    at_risk: np.ndarray
    events: np.ndarray
    greenwood: np.ndarray  # var S(t)

    @property
    def median(self) -> float:
        """The first time S(t) <= 0.5; NaN when the curve never gets there (more than half last)."""
        hit = np.nonzero(self.survival <= 0.5)[0]
        return float(self.times[hit[0]]) if len(hit) else math.nan

    def at(self, t: float) -> float:
        """S(t): 1 before the first time, the value of the last time <= t after it."""
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        return 1.0 if i < 0 else float(self.survival[i])


def _check(times, events) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(times, dtype=float)
    e = np.asarray(events, dtype=bool)
    if t.shape != e.shape or t.ndim != 1:
        raise ValueError(f"times and events must be 1-D and of one length, got {t.shape} and {e.shape}")
    if not np.isfinite(t).all():
        raise ValueError("times must be finite")
    return t, e


def kaplan_meier(times, events, level: float = 0.95) -> KaplanMeier:
    """The Kaplan-Meier curve of `times` (one per subject) with `events` (True: the event happened
    at that time; False: censored there). ValueError for unequal lengths or non-finite times."""
    t, e = _check(times, events)
    grid = np.unique(t)
    n = np.array([(t >= u).sum() for u in grid])
    d = np.array([(e & (t == u)).sum() for u in grid])
    surv = np.cumprod(1.0 - d / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(d > 0, d / (n * (n - d)), 0.0)  # inf where every subject at risk has it
        total = np.cumsum(terms)
        greenwood = surv**2 * total
        z = stats.norm.ppf(0.5 + level / 2)
        se = np.sqrt(total) / np.abs(np.log(surv))
        centre = np.log(-np.log(surv))
        low, high = np.exp(-np.exp(centre + z * se)), np.exp(-np.exp(centre - z * se))
    undefined = (surv <= 0) | (surv >= 1)
    low, high = np.where(undefined, np.nan, low), np.where(undefined, np.nan, high)
    greenwood = np.where(surv <= 0, 0.0, greenwood)
    return KaplanMeier(grid, surv, low, high, n, d, greenwood)


@dataclass(frozen=True)
class LogRank:
    """Arm a against arm b: observed and expected events of a, the variance of O - E, Z and p."""

    observed: float
    expected: float
    variance: float
    n_a: int
    n_b: int

    @property
    def z(self) -> float:
        return (self.observed - self.expected) / math.sqrt(self.variance) if self.variance > 0 else math.nan

    @property
    def p_value(self) -> float:
        """Two-sided; 1 when V = 0 with events (then O = E); NaN when no event happened in either
        arm (nothing to test)."""
        if math.isfinite(self.z):
            return float(2 * stats.norm.sf(abs(self.z)))
        return 1.0 if self.observed + self.expected > 0 else math.nan

    def estimate(self) -> Estimate:
        """O - E as an `Estimate` with se sqrt(V) and infinite df: its t test is the log-rank
        test, so the statistics engine puts it in a Holm family with every other difference. No
        event in either arm: no interval. Events but V = 0 (every run at risk collapsed at once,
        or one arm had none left at risk): then O = E, se 0, p 1."""
        se = math.sqrt(self.variance) if self.observed + self.expected > 0 else math.nan
        method = f"log-rank, {self.n_a} vs {self.n_b} runs"
        return Estimate(self.observed - self.expected, se, math.inf, method, 0, self.n_a, self.n_b)


def logrank(times_a, events_a, times_b, events_b) -> LogRank:
    """The log-rank test of arm a against arm b (module docstring); ValueError as kaplan_meier."""
    ta, ea = _check(times_a, events_a)
    tb, eb = _check(times_b, events_b)
    grid = np.unique(np.r_[ta[ea], tb[eb]])
    obs = exp = var = 0.0
    for u in grid:
        na, nb = (ta >= u).sum(), (tb >= u).sum()
        da, db = (ea & (ta == u)).sum(), (eb & (tb == u)).sum()
        n, d = na + nb, da + db
        obs += da
        exp += d * na / n
        if n > 1:
            var += d * (na / n) * (nb / n) * (n - d) / (n - 1)
    return LogRank(float(obs), float(exp), float(var), len(ta), len(tb))


__all__ = ["KaplanMeier", "LogRank", "kaplan_meier", "logrank"]
