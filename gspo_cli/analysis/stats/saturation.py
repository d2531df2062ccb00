"""A saturating curve of a score against compute, as ScaleRL fits it (Khatri et al. 2025, "The Art
of Scaling Reinforcement Learning Compute", arXiv 2510.13786):

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

R0 the score before training (C = 0: the mean step-0 score, held fixed), A the asymptote, B the
efficiency exponent (how sharply the score rises around the midpoint), C_mid the compute at which
half of the gain A - R0 is reached. Least squares (scipy.optimize.least_squares, several starts) on
every evaluation of every seed, compute scaled by its largest value. Intervals: 95%, from a seed
bootstrap (the seeds resampled with replacement, the curve refitted): the estimate ± t_{0.975, S-1}
x the bootstrap SD x sqrt(S / (S - 1)) (S seeds; on the log scale for B and C_mid). The factor: a
bootstrap over S units estimates the variance of a mean with divisor S where the unbiased one has
S - 1, so its SD is short by sqrt((S - 1) / S) (18% at 3 seeds).

A is where the curve would level off: an extrapolation beyond the compute reached (the fit only
sees the scores up to the largest compute; a curve that bends again later changes A), so it is
reported as such, beside the score the curve reaches at the largest compute (`reached`).

No test against a straight line: a line is not a model nested in the curve (it is a limit, B = 1
and C_mid and A going to infinity together), and the points of one seed are correlated, so an F
test on the pooled points rejects a true line far more often than 5% (33% at 5 seeds, 49% at 3,
with per-seed curvature). A line, or a curve seen before it bends, shows instead as a midpoint
beyond the compute reached or a midpoint interval that reaches beyond it (from the seed
bootstrap, which resamples whole seeds).

Identified only when the data can tell the parameters apart (IDENTIFY_RULE); otherwise the fit
says why and gives no numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

from gspo_cli.analysis.rundata.compute import eval_points
from gspo_cli.analysis.rundata.runs import Group

MIN_POINTS = 4  # evaluations after step 0, in the seed that has the most
B_BOUNDS = (0.05, 20.0)
MID_BOUNDS = (1e-4, 1e4)  # C_mid / the largest compute reached

IDENTIFY_RULE = f"""\
The fit is reported only when it is identified: at least {MIN_POINTS} evaluations after step 0 (a
step-0 evaluation fixes R0); the midpoint C_mid within the compute reached (else the curve has not
bent yet and A is an extrapolation), and with two seeds or more its 95% interval too; no parameter
at the edge of its range (A within the scores' range widened to [0, 1], B in [{B_BOUNDS[0]:g},
{B_BOUNDS[1]:g}]). Otherwise it says which condition failed and gives no numbers. A (the asymptote)
is an extrapolation beyond the compute reached, and is labelled so.
"""
EXTRAPOLATION = "an extrapolation beyond the compute reached"


def saturating(c, r0: float, a: float, b: float, c_mid: float) -> np.ndarray:
    """R(C) of the module docstring; R0 at C <= 0."""
    c = np.asarray(c, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(c > 0, r0 + (a - r0) / (1 + (c_mid / np.where(c > 0, c, 1.0)) ** b), r0)


@dataclass(frozen=True)
class Fit:
    """One arm's fit: `identified` False with `reason` when it is not (the numbers then mean
    nothing); intervals (low, high) per parameter from the seed bootstrap, NaN with one seed."""

    identified: bool
    reason: str = ""
    r0: float = math.nan
    a: float = math.nan
    b: float = math.nan
    c_mid: float = math.nan
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    points: int = 0
    seeds: int = 0
    c_max: float = math.nan  # the largest compute reached (the fit's data end there)

    def predict(self, c) -> np.ndarray:
        return saturating(c, self.r0, self.a, self.b, self.c_mid)

    @property
    def reached(self) -> float:
        """The fitted score at the largest compute reached: what the data support, unlike A."""
        return float(self.predict(self.c_max)) if math.isfinite(self.c_max) else math.nan


def _pool(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    xs = [np.asarray(x, float) for x, _ in curves]
    ys = [np.asarray(y, float) for _, y in curves]
    return (np.concatenate(xs), np.concatenate(ys)) if xs else (np.zeros(0), np.zeros(0))


def _least_squares(x, y, r0, a_bounds, starts) -> tuple[np.ndarray, float]:
    """Best (a, log b, log mid) over `starts`, x scaled to at most 1; its residual sum of squares."""

    def resid(p):
        return saturating(x, r0, p[0], math.exp(p[1]), math.exp(p[2])) - y

    lo = [a_bounds[0], math.log(B_BOUNDS[0]), math.log(MID_BOUNDS[0])]
    hi = [a_bounds[1], math.log(B_BOUNDS[1]), math.log(MID_BOUNDS[1])]
    best, best_sse = None, math.inf
    for p0 in starts:
        p0 = np.clip(p0, np.add(lo, 1e-9), np.subtract(hi, 1e-9))
        res = optimize.least_squares(resid, p0, bounds=(lo, hi), method="trf", x_scale="jac")
        sse = float(np.sum(res.fun**2))
        if sse < best_sse:
            best, best_sse = res.x, sse
    return best, best_sse


def _starts(y: np.ndarray, r0: float, a_bounds) -> list[np.ndarray]:
    top = float(np.max(y)) if float(np.max(y)) >= r0 else float(np.min(y))
    tops = [top, (top + (a_bounds[1] if top >= r0 else a_bounds[0])) / 2]
    return [np.array([a, math.log(b), math.log(m)]) for a in tops for b in (0.7, 1.5, 3.0) for m in (0.05, 0.3, 1.0)]


def fit_saturation(curves: list[tuple[np.ndarray, np.ndarray]], *, bootstrap: int = 200, rng_seed: int = 0) -> Fit:
    """Fit R(C) to one arm's seeds: `curves` holds per seed (compute, score) at its evaluations,
    compute 0 for step 0. `bootstrap` seed resamples for the intervals (0: none). Never raises on
    data: a fit that cannot be made or identified says why in `reason`."""
    curves = [(np.asarray(x, float), np.asarray(y, float)) for x, y in curves if len(x)]
    zero = [float(v) for x, y in curves for v in y[x <= 0]]
    most = max((int((x > 0).sum()) for x, _ in curves), default=0)
    if not zero:
        return Fit(False, "no step-0 evaluation to fix R0", seeds=len(curves))
    if most < MIN_POINTS:
        return Fit(False, f"too few points: {most} evaluations after step 0 (needs {MIN_POINTS})", seeds=len(curves))
    r0 = float(np.mean(zero))
    x, y = _pool([(cx[cx > 0], cy[cx > 0]) for cx, cy in curves])
    scale = float(x.max())
    a_bounds = (min(0.0, float(y.min()), r0), max(1.0, float(y.max()), r0))
    p, _ = _least_squares(x / scale, y, r0, a_bounds, _starts(y, r0, a_bounds))
    a, b, mid = float(p[0]), math.exp(p[1]), math.exp(p[2])
    base = dict(r0=r0, a=a, b=b, c_mid=mid * scale, points=len(x), seeds=len(curves), c_max=scale)
    reason = ""
    if mid > 1:
        reason = f"no saturation within the compute reached: the midpoint fits at {mid:.3g} x the largest compute"
    elif min(a - a_bounds[0], a_bounds[1] - a) < 1e-3 or not (B_BOUNDS[0] * 1.01 < b < B_BOUNDS[1] / 1.01):
        reason = "the fit runs to the edge of a parameter's range (A or B)"
    if reason:
        return Fit(False, reason, **base)
    ci = _bootstrap(curves, p, a_bounds, scale, bootstrap, rng_seed)
    if ci["c_mid"][1] > scale:  # NaN (no bootstrap) compares False
        top = ci["c_mid"][1] / scale
        reason = f"the midpoint's 95% interval reaches {top:.3g} x the largest compute: the bend is not pinned down"
        return Fit(False, reason, ci=ci, **base)
    return Fit(True, "", ci=ci, **base)


def _bootstrap(curves, p, a_bounds, scale, n_boot, rng_seed) -> dict[str, tuple[float, float]]:
    nan = (math.nan, math.nan)
    if n_boot <= 0 or len(curves) < 2:
        return {"a": nan, "b": nan, "c_mid": nan}
    rng = np.random.default_rng(rng_seed)
    draws = []
    for _ in range(n_boot):
        pick = [curves[i] for i in rng.integers(0, len(curves), len(curves))]
        zero = [float(v) for x, y in pick for v in y[x <= 0]]
        x, y = _pool([(cx[cx > 0], cy[cx > 0]) for cx, cy in pick])
        r0 = float(np.mean(zero))
        q, _ = _least_squares(x / scale, y, r0, a_bounds, [p, _starts(y, r0, a_bounds)[4]])  # warm start + one
        draws.append((q[0], math.exp(q[1]), math.exp(q[2]) * scale))
    # The bootstrap's spread with a t quantile over seeds (S - 1 df), not its percentiles: a few
    # seeds give few distinct resamples and percentiles that are too narrow (measured in the guide).
    # B and C_mid are positive and skewed: their interval is taken on the log scale. The factor
    # sqrt(S / (S - 1)): the bootstrap's variance over S seeds has divisor S, not S - 1.
    d = np.asarray(draws)
    S = len(curves)
    t = float(stats.t.ppf(0.975, S - 1)) * math.sqrt(S / (S - 1))
    est = (float(p[0]), math.exp(p[1]), math.exp(p[2]) * scale)
    out = {"a": (est[0] - t * float(d[:, 0].std(ddof=1)), est[0] + t * float(d[:, 0].std(ddof=1)))}
    for i, k in ((1, "b"), (2, "c_mid")):
        half = t * float(np.log(d[:, i]).std(ddof=1))
        out[k] = (est[i] * math.exp(-half), est[i] * math.exp(half))
    return out


def arm_fit(group: Group, task: str, axis: str, bootstrap: int = 200) -> Fit:
    """The saturating fit of the group's held-out score on `task` against `axis` (every seed's
    evaluations; intervals from `bootstrap` seed resamples)."""
    return fit_saturation([eval_points(r, task, axis) for r in group.runs], bootstrap=bootstrap)


__all__ = ["EXTRAPOLATION", "IDENTIFY_RULE", "MIN_POINTS", "Fit", "arm_fit", "fit_saturation", "saturating"]
