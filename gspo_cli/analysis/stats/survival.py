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
  (n_j - d_j) / (n_j - 1); Z = (O_a - E_a) / sqrt(V). O - E > 0: arm a has more events than
  equal hazards would give it. The two-sided p comes from the normal when both arms have more than
  EXACT_RUNS runs. With fewer the normal is far off (3 runs against 3 that all collapse first get
  p 0.025 from it), so p is exact: under equal hazards the run labels are exchangeable, and p is the
  share of the C(n, n_a) ways of labelling n_a of the n runs `a` whose |Z| is at least the observed
  one (Z taken as 0 where V = 0). All of them when there are at most EXACT_SPLITS, else
  PERMUTATIONS random labellings from a fixed seed, p = (1 + hits) / (1 + draws) (Phipson & Smyth
  2010). Its smallest value is 2 / C(n, n_a) for arms of equal size: 0.10 at 3 vs 3, 0.0079 at 5 vs 5.
Checked against scipy.stats.ecdf (censored data), scipy.stats.logrank and, for the exact p,
scipy.stats.permutation_test in the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from scipy import stats

from gspo_cli.analysis.stats.intervals import Estimate

EXACT_RUNS = 10  # an arm with this many runs or fewer: the permutation p
EXACT_SPLITS = 200_000  # every labelling up to this many (10 vs 10 is 184,756), else Monte Carlo
PERMUTATIONS = 20_000
RNG_SEED = 20261


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
    p_exact: float = math.nan  # the permutation p (module docstring); NaN when the normal is used
    splits: int = 0  # labellings the permutation p counted (all of them, or the random draws)
    enumerated: bool = True  # all labellings (False: a Monte Carlo sample of them)

    @property
    def z(self) -> float:
        return (self.observed - self.expected) / math.sqrt(self.variance) if self.variance > 0 else math.nan

    @property
    def p_normal(self) -> float:
        """Two-sided p from the normal; 1 when V = 0 with events (then O = E); NaN when no event
        happened in either arm (nothing to test)."""
        if math.isfinite(self.z):
            return float(2 * stats.norm.sf(abs(self.z)))
        return 1.0 if self.observed + self.expected > 0 else math.nan

    @property
    def p_value(self) -> float:
        """Two-sided: the permutation p for small arms, else the normal's (module docstring)."""
        return self.p_exact if math.isfinite(self.p_exact) else self.p_normal

    @property
    def method(self) -> str:
        what = f"log-rank, {self.n_a} vs {self.n_b} runs"
        if not math.isfinite(self.p_exact):
            return what
        if self.enumerated:
            return f"{what}, exact permutation p over all {self.splits} labellings"
        return f"{what}, permutation p from {self.splits} random labellings"

    def estimate(self) -> Estimate:
        """O - E as an `Estimate` with se sqrt(V) and infinite df: its t test is the log-rank
        test, so the statistics engine puts it in a Holm family with every other difference. No
        event in either arm: no interval. Events but V = 0 (every run at risk collapsed at once,
        or one arm had none left at risk): then O = E, se 0, p 1. Small arms: the estimate
        carries the permutation p, which its verdict uses; the interval stays the normal one."""
        se = math.sqrt(self.variance) if self.observed + self.expected > 0 else math.nan
        exact = self.p_exact if math.isfinite(se) else math.nan
        return Estimate(self.observed - self.expected, se, math.inf, self.method, 0, self.n_a, self.n_b, p_exact=exact)


def _statistics(times: np.ndarray, events: np.ndarray, labels_MN: np.ndarray) -> np.ndarray:
    """(M,) Z of the log-rank test for each labelling (rows of labels_MN: True = arm a) of the pooled
    runs (N,); 0 where V = 0 (then O = E)."""
    grid = np.unique(times[events])  # (J,) pooled event times
    risk_NJ = (times[:, None] >= grid[None, :]).astype(float)
    dead_NJ = (events[:, None] & (times[:, None] == grid[None, :])).astype(float)
    n_J, d_J = risk_NJ.sum(axis=0), dead_NJ.sum(axis=0)
    lab = labels_MN.astype(float)
    na_MJ, da_MJ = lab @ risk_NJ, lab @ dead_NJ
    frac = na_MJ / n_J
    o_e = (da_MJ - d_J * frac).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(n_J > 1, d_J * frac * (1 - frac) * (n_J - d_J) / (n_J - 1), 0.0).sum(axis=1)
        z = np.where(v > 1e-12, o_e / np.sqrt(np.where(v > 1e-12, v, 1.0)), 0.0)
    return z


def permutation_p(times_a, events_a, times_b, events_b) -> tuple[float, int, bool]:
    """The permutation p of the log-rank test (module docstring), the number of labellings it
    counted, and whether that was all of them. NaN when no run of either arm has the event."""
    ta, ea = _check(times_a, events_a)
    tb, eb = _check(times_b, events_b)
    t, e = np.r_[ta, tb], np.r_[ea, eb]
    if not e.any():
        return math.nan, 0, True
    n, k = len(t), len(ta)
    observed = abs(float(_statistics(t, e, (np.arange(n) < k)[None, :])[0]))
    total = math.comb(n, k)
    tol = 1e-9 * max(1.0, observed)  # ties of |Z| up to rounding count as at least as extreme
    if total <= EXACT_SPLITS:
        labels = np.zeros((total, n), dtype=bool)
        for row, pick in enumerate(combinations(range(n), k)):
            labels[row, list(pick)] = True
        hits = int((np.abs(_statistics(t, e, labels)) >= observed - tol).sum())
        return hits / total, total, True
    rng = np.random.default_rng(RNG_SEED)
    labels = np.argsort(rng.random((PERMUTATIONS, n)), axis=1) < k
    hits = int((np.abs(_statistics(t, e, labels)) >= observed - tol).sum())
    return (1 + hits) / (1 + PERMUTATIONS), PERMUTATIONS, False


def logrank(times_a, events_a, times_b, events_b, *, exact: bool | None = None) -> LogRank:
    """The log-rank test of arm a against arm b (module docstring); ValueError as kaplan_meier.
    `exact`: the permutation p (True), the normal's (False), or by the arms' sizes (None:
    permutation when an arm has at most EXACT_RUNS runs)."""
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
    small = min(len(ta), len(tb)) <= EXACT_RUNS if exact is None else exact
    p, splits, enumerated = permutation_p(ta, ea, tb, eb) if small and len(ta) and len(tb) else (math.nan, 0, True)
    return LogRank(float(obs), float(exp), float(var), len(ta), len(tb), p, splits, enumerated)


__all__ = ["EXACT_RUNS", "KaplanMeier", "LogRank", "kaplan_meier", "logrank", "permutation_p"]
