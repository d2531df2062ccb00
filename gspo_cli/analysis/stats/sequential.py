"""Adding seeds until a comparison is decided, without inflating the false-positive rate.

The data are paired differences d_1, d_2, ... (arm minus baseline, one per seed both arms have).
They are looked at after every round of new seeds, at n_1 < n_2 < ... <= N (N = --max-seeds):
looking K times with an ordinary 95% interval would declare a difference that is not there far
more often than 5% of the time. The method here is a group-sequential design with alpha
spending (Lan & DeMets 1983, "Discrete sequential boundaries for clinical trials", Biometrika
70:659-663) and the O'Brien-Fleming-like spending function

    alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)),     t = n / N (the information fraction),

which spends almost nothing at the first looks and nearly all of alpha at the last. Look k gets
the boundary c_k for which the chance, with no true difference, of crossing for the first time
at look k is alpha(t_k) - alpha(t_{k-1}). Lan-DeMets needs neither the number nor the timing of
looks in advance, only N: each boundary depends on the looks made so far.

The statistic is the paired t, T_k = mean(d) / (s / sqrt(n_k)) with the SD s estimated from the
same n_k seeds, not a z with a known SD. Boundaries computed for z (the joint normal law of the
looks' z statistics, `z_boundaries`) and turned into t quantiles at the same nominal level
(Jennison & Turnbull 1999, section 11.4) are anti-conservative at few degrees of freedom: over
looks at 3, 5, ..., 13, 14 seeds they give 5.38% false positives. The joint null law of T_1..T_K
has no free parameter (t is scale-free), so the boundaries here come from it directly: SIMULATIONS
null experiments (standard normal differences, a fixed RNG seed) give T at every look, and c_k is
the quantile of |T_k| among the experiments not yet stopped that spends exactly the alpha the
function allots to look k (Jennison & Turnbull 2000, ch. 3, for simulated and exact t boundaries).
A look whose allotment is under MIN_CROSSINGS / SIMULATIONS (the first looks of a long design spend
1e-5 or less) takes the t quantile of its allotment alone. The Monte Carlo error of the overall
level this leaves is about sqrt(alpha (1 - alpha) / SIMULATIONS) = 0.05 percentage points; the
boundaries are cached per design (the same seed gives the same boundaries every time).
The repeated confidence interval is mean(d) +- c_k s / sqrt(n_k).

Verdicts at each look: `better` (the 95% repeated interval lies above 0; below: `worse`),
`equivalent` (the 90% repeated interval, spent the same way, lies inside +-margin: two one-sided
tests at 5% each, Schuirmann 1987), else the experiment goes on; at N, `not resolved`. The
simulations in tests/test_sequential.py measure the false-positive rate over all looks.

numpy and scipy.stats only; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize, special, stats

from gspo_cli.analysis.stats.intervals import Estimate, t_quantile

ALPHA = 0.05  # two-sided: better or worse when there is no difference, over all looks
EQUIVALENCE_ALPHA = 0.10  # the TOST interval: 5% on each side
VERDICTS = ("better", "worse", "equivalent", "not resolved")
_GRID = 801  # points of the integration grid (in units of the information's SD)
SIMULATIONS = 200_000  # null experiments behind the t boundaries of a design
MIN_CROSSINGS = 20  # a look allotted fewer crossings than this takes the t quantile of its allotment
RNG_SEED = 20264


def spent(fraction: float, alpha: float = ALPHA) -> float:
    """The O'Brien-Fleming-like Lan-DeMets spending function: the share of `alpha` spent by
    information fraction `fraction` in (0, 1] (alpha at 1)."""
    if fraction <= 0:
        return 0.0
    z = stats.norm.isf(alpha / 2)
    return float(min(alpha, 2 * stats.norm.sf(z / np.sqrt(min(fraction, 1.0)))))


def z_boundaries(fractions: Sequence[float], alpha: float = ALPHA) -> np.ndarray:
    """Two-sided z boundaries c_1..c_K for looks at increasing information `fractions` (the last
    <= 1): with no true difference, the chance that |Z_k| >= c_k at some look is `alpha`(t_K).

    The z statistics of the looks are those of a Brownian motion S(t) = Z sqrt(t); the density
    of S among the paths not yet stopped is carried from look to look on a grid."""
    fr = np.asarray(fractions, dtype=float)
    if fr.ndim != 1 or not len(fr) or fr[0] <= 0 or np.any(np.diff(fr) <= 0) or fr[-1] > 1 + 1e-12:
        raise ValueError(f"fractions must increase within (0, 1], got {list(fractions)}")
    grid = np.linspace(-8, 8, _GRID)  # S in units where Var S(1) = 1: +-8 SD holds everything
    h = grid[1] - grid[0]
    density = None  # density of S at the previous look over the continuation region
    prev_t, prev_spent = 0.0, 0.0
    out = []
    for t in fr:
        dt = t - prev_t
        target = spent(t, alpha) - prev_spent

        if density is None:

            def crossing(c: float) -> float:
                return 2 * stats.norm.sf(c)

        else:

            def crossing(c: float, density=density, dt=dt, t=t) -> float:
                bound = c * np.sqrt(t)  # |S_t| >= bound
                up = special.ndtr((grid - bound) / np.sqrt(dt))  # P(S_t >= bound | S_prev = grid)
                down = special.ndtr((-bound - grid) / np.sqrt(dt))
                return float(np.sum(density * (up + down)) * h)

        c = optimize.brentq(lambda c, target=target: crossing(c) - target, 0.0, 40.0) if target > 1e-15 else 40.0
        out.append(c)
        # the density at this look over |S| < c sqrt(t), from the previous one (or the start)
        if density is None:
            new = stats.norm.pdf(grid, scale=np.sqrt(t))
        else:
            kernel = stats.norm.pdf((grid[:, None] - grid[None, :]) / np.sqrt(dt)) / np.sqrt(dt)
            new = kernel @ density * h
        density = np.where(np.abs(grid) < c * np.sqrt(t), new, 0.0)
        prev_t, prev_spent = t, prev_spent + crossing(c)
    return np.array(out)


def look_schedule(start: int, round_seeds: int, max_seeds: int) -> list[int]:
    """The numbers of paired seeds at which the comparison is looked at: `start` (at least 2),
    then every `round_seeds` more, and `max_seeds` last."""
    if round_seeds < 1:
        raise ValueError("round_seeds must be >= 1")
    first = max(start, 2)
    if max_seeds < first:
        raise ValueError(f"max_seeds ({max_seeds}) must be at least {first}")
    looks = list(range(first, max_seeds + 1, round_seeds))
    return looks if looks[-1] == max_seeds else [*looks, max_seeds]


@lru_cache(maxsize=64)
def t_boundaries(looks: tuple[int, ...], max_seeds: int, alpha: float = ALPHA) -> np.ndarray:
    """Two-sided boundaries c_1..c_K for the paired t statistic at `looks` (increasing numbers of
    paired seeds, the first at least 2, the last at most `max_seeds`): with no true difference, the
    chance that |T_k| >= c_k at some look is the spending function's alpha(looks[-1] / max_seeds),
    from the simulated joint null law of the looks' t statistics (module docstring)."""
    n = np.asarray(looks, dtype=int)
    if n.ndim != 1 or not len(n) or n[0] < 2 or np.any(np.diff(n) <= 0) or n[-1] > max_seeds:
        raise ValueError(f"looks must increase from at least 2 to at most max_seeds ({max_seeds}), got {list(looks)}")
    rng = np.random.default_rng(RNG_SEED)
    M = SIMULATIONS
    t_MK = np.empty((M, len(n)))
    s1, s2, k = np.zeros(M), np.zeros(M), 0
    for i in range(1, int(n[-1]) + 1):  # one seed's difference at a time: memory (M, K), not (M, N)
        x = rng.standard_normal(M)
        s1 += x
        s2 += x * x
        if i == n[k]:
            mean = s1 / i
            sd = np.sqrt(np.maximum(s2 - i * mean**2, 0.0) / (i - 1))
            t_MK[:, k] = np.abs(mean) / (sd / np.sqrt(i))
            k += 1
    alive = np.ones(M, dtype=bool)
    used, out = 0.0, []
    for k, nk in enumerate(n):
        target = spent(nk / max_seeds, alpha) - used  # what this look may spend
        if target * M < MIN_CROSSINGS:  # too few null crossings to place it: its allotment alone
            c = float(stats.t.isf(max(target, 1e-300) / 2, nk - 1))
        else:
            c = float(np.quantile(np.where(alive, t_MK[:, k], 0.0), 1 - target / 1.0))
        crossed = alive & (t_MK[:, k] >= c)
        used += crossed.mean()
        alive &= ~crossed
        out.append(c)
    return np.array(out)


@dataclass(frozen=True)
class Design:
    """The t boundaries of a look schedule: `critical[k]` for the 95% repeated interval at look
    k (n = `looks[k]` paired seeds), `critical_eq[k]` for the 90% one (equivalence)."""

    looks: tuple[int, ...]
    max_seeds: int
    critical: np.ndarray
    critical_eq: np.ndarray

    @classmethod
    def of(cls, looks: Sequence[int], max_seeds: int | None = None) -> Design:
        """The t boundaries (`t_boundaries`) of `looks` for a design of `max_seeds` (default the
        last look), for the 95% and the 90% repeated intervals."""
        key = tuple(int(x) for x in looks)
        N = int(max_seeds or key[-1])
        return cls(key, N, t_boundaries(key, N, ALPHA), t_boundaries(key, N, EQUIVALENCE_ALPHA))


def verdicts(diffs_EN: np.ndarray, design: Design, margin: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The sequential verdict of each of E experiments (rows of paired differences, arm minus
    baseline, higher = better, at least `design.looks[-1]` columns) and the look (index into
    `design.looks`) at which it was reached: the first look whose 95% repeated interval excludes
    0 (`better`/`worse`) or whose 90% one lies inside +-`margin` (`equivalent`), else
    `not resolved` at the last look. Differences without any spread (all equal: coarse scores
    on few problems) decide nothing, since their interval of width 0 claims a precision that a
    few seeds cannot have. Vectorised over experiments."""
    d = np.asarray(diffs_EN, dtype=float)
    E = d.shape[0]
    verdict = np.full(E, "not resolved", dtype=object)
    at = np.full(E, len(design.looks) - 1)
    open_ = np.ones(E, dtype=bool)
    for k, n in enumerate(design.looks):
        x = d[:, :n]
        mean = x.mean(axis=1)
        se = x.std(axis=1, ddof=1) / np.sqrt(n)
        lo, hi = mean - design.critical[k] * se, mean + design.critical[k] * se
        decided = {"better": lo > 0, "worse": hi < 0}
        if margin is not None:
            w = design.critical_eq[k] * se
            decided["equivalent"] = (mean - w > -margin) & (mean + w < margin) & ~(lo > 0) & ~(hi < 0)
        for name, hit in decided.items():
            now = open_ & hit & (se > 0)  # seeds that agree exactly tell nothing of the spread: no decision
            verdict[now], at[now] = name, k
            open_ &= ~now
    return verdict, at


@dataclass(frozen=True)
class Look:
    """One look of a sequential comparison: n paired seeds, the difference, the 95% repeated
    interval, the verdict (`continue` while seeds are still to come), the look's boundary for the
    seeds' paired t (|t| >= `boundary`), and the estimate the interval is on (`method`)."""

    n: int
    delta: float
    ci_low: float
    ci_high: float
    verdict: str
    boundary: float = math.nan
    method: str = ""


def _half(c: float, n: int, se_pairs: float, est: Estimate | None, level: float) -> float:
    """The half-width of a look's repeated interval: the seeds' paired t at boundary c, and with
    `est` (the fixed-design estimate) also that estimate at the same nominal level and its own
    fixed-design interval at `level`, the widest of them (never narrower than what compare shows)."""
    half = c * se_pairs
    if est is not None and est.has_interval:
        nominal = 2 * stats.t.sf(c, n - 1)  # the two-sided level the boundary spends at this look
        half = max(half, t_quantile(1 - nominal / 2, est.df) * est.se, t_quantile(0.5 + level / 2, est.df) * est.se)
    return half


def sequential_looks(
    diffs: Sequence[float],
    design: Design,
    margin: float | None = None,
    estimates: Sequence[Estimate | None] | None = None,
) -> list[Look]:
    """Every look of `design` that the paired differences `diffs` (in seed order) reach, up to
    the first decided one; the last look's verdict is `not resolved` when it is the design's
    last, `continue` when more seeds are planned.

    `estimates[k]`, when given, is the fixed-design estimate of look k's seeds that `gspo compare`
    shows (e.g. the seeds x problems model from problem records): the look then decides on it,
    centred on its difference, with the widest of three half-widths: the paired t at the look's
    boundary, that estimate at the boundary's nominal level on its own degrees of freedom, and
    its fixed-design interval (95%, and 90% for equivalence). So a look never decides on an
    interval narrower than the one compare shows for the same runs."""
    d = np.asarray(diffs, dtype=float)
    out = []
    for k, n in enumerate(design.looks):
        if n > len(d):
            break
        x = d[:n]
        est = estimates[k] if estimates is not None and k < len(estimates) else None
        se = float(x.std(ddof=1) / np.sqrt(n))
        if se <= 1e-12 * max(1.0, float(np.abs(x).max())):  # equal differences: no spread
            se = 0.0
        centre = float(est.delta) if est is not None and est.has_interval else float(x.mean())
        c, c_eq = float(design.critical[k]), float(design.critical_eq[k])
        half, half_eq = _half(c, n, se, est, 0.95), _half(c_eq, n, se, est, 0.90)
        verdict = "not resolved" if k == len(design.looks) - 1 else "continue"
        if se > 0:  # seeds that agree exactly tell nothing of the spread: no decision
            if centre - half > 0:
                verdict = "better"
            elif centre + half < 0:
                verdict = "worse"
            elif margin is not None and centre - half_eq > -margin and centre + half_eq < margin:
                verdict = "equivalent"
        method = est.method if est is not None and est.has_interval else f"paired t, {n} seeds"
        out.append(Look(n, centre, centre - half, centre + half, verdict, c, method))
        if verdict not in ("continue", "not resolved"):
            break
    return out
