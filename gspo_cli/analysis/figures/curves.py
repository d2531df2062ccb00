"""The numbers `gspo plot` draws, from run directories alone (no matplotlib): per group, the
mean over seeds of a metric along an x axis (step or a compute axis: `rundata.compute`), each
seed EMA-smoothed first, with a band over seeds where at least two have the point; held-out
scores by evaluation step; and the smoothing weight `--smooth auto` picks from the run length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gspo_cli.analysis.rundata.compute import compute_series
from gspo_cli.analysis.rundata.runs import Group, Run, ema
from gspo_cli.analysis.stats.seeds import curve_stats
from gspo_cli.errors import SpecError

# Band over seeds: name -> what the legend says it is.
BANDS = {"ci": "mean ± 95% CI", "std": "mean ± 1 std", "range": "mean, band min-max", "none": "mean"}
SMOOTH_AUTO = "auto"
AUTO_WINDOW = 25  # --smooth auto: an EMA whose window (1 / (1 - weight)) is 1/25 of the longest run


@dataclass
class Curve:
    """Seed statistics along x: mean, band [lo, hi] (NaN where < 2 seeds), seeds per point n."""

    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    n: np.ndarray


def x_values(run: Run, x: str) -> pd.Series:
    """The run's x coordinate by step: the step or its cumulative compute (`compute.AXES`: responses
    or response tokens sampled, training seconds; `time` is `wall`)."""
    return compute_series(run, x)


def seed_curve(ys: dict[int, pd.Series], xs: dict[int, pd.Series], band: str = "ci") -> Curve | None:
    """Seed statistics of (points x seeds) values; the band (BANDS) is NaN where < 2 seeds."""
    if not ys:
        return None
    y = pd.DataFrame(ys).sort_index()
    xm = pd.DataFrame(xs).reindex(y.index).mean(axis=1).to_numpy()
    st = curve_stats(y)
    ok = np.isfinite(xm) & st["mean"].notna().to_numpy()
    if not ok.any():  # e.g. --x time on runs that log no time
        return None
    mean, n = st["mean"].to_numpy()[ok], st["n"].to_numpy()[ok]
    if band == "range":
        lo, hi = y.min(axis=1).to_numpy()[ok], y.max(axis=1).to_numpy()[ok]
    else:
        half = st["std" if band == "std" else "ci95"].to_numpy()[ok] * (np.nan if band == "none" else 1.0)
        lo, hi = mean - half, mean + half
    several = n >= 2
    return Curve(xm[ok], mean, np.where(several, lo, np.nan), np.where(several, hi, np.nan), n)


def metric_curve(group: Group, key: str, x: str, smooth: float, band: str = "ci") -> Curve | None:
    """Mean over the group's seeds of one metric, each seed EMA-smoothed first; None if no seed logs it.

    Seeds are aligned by step; for x = time or tokens the x of a point is the seeds' mean x.
    """
    ys, xs = {}, {}
    for i, run in enumerate(group.runs):
        y = run.series(key).dropna()
        if len(y):
            ys[i] = pd.Series(ema(y.to_numpy(), smooth), index=y.index)
            xs[i] = x_values(run, x).reindex(y.index)
    return seed_curve(ys, xs, band)


def auto_smooth(groups: list[Group]) -> float:
    """--smooth auto: the EMA weight whose window 1 / (1 - w) is 1/AUTO_WINDOW of the longest
    run's logged steps, rounded to 2 decimals: 0 (no smoothing) up to 25 steps, 0.75 at 100,
    0.9 at 250, 0.94 at 400, at most 0.99."""
    steps = max((len(r.metrics) for g in groups for r in g.runs), default=0)
    window = steps / AUTO_WINDOW
    return 0.0 if window <= 1 else min(0.99, round(1 - 1 / window, 2))


def eval_curve(group: Group, task: str, x: str, band: str = "ci") -> Curve | None:
    """Held-out score (first avg@K) by eval step; eval steps map to time/tokens through the run's metrics."""
    ys, xs = {}, {}
    for i, run in enumerate(group.runs):
        ev = run.eval_scores
        ev = ev[ev.task == task].dropna(subset=["score"]).drop_duplicates("step", keep="last")
        if ev.empty:
            continue
        ys[i] = pd.Series(ev.score.to_numpy(float), index=ev.step.to_numpy())
        xv = x_values(run, x).dropna()
        # Step 0 (before training) sits at x = 0 for every axis.
        xs[i] = pd.Series(np.interp(ev.step, [0, *xv.index], [0.0, *xv.to_numpy()]), index=ev.step.to_numpy())
    return seed_curve(ys, xs, band)


def resolve_smooth(groups: list[Group], smooth: float | str) -> float:
    """The EMA weight: a number in [0, 1), or "auto" (auto_smooth); anything else is a SpecError."""
    if isinstance(smooth, str):
        if smooth.strip().lower() == SMOOTH_AUTO:
            return auto_smooth(groups)
        try:
            smooth = float(smooth)
        except ValueError:
            raise SpecError(f"--smooth: {smooth!r} is neither 'auto' nor an EMA weight in [0, 1)") from None
    if not 0 <= smooth < 1:
        raise SpecError(f"--smooth: the EMA weight must be in [0, 1), got {smooth}")
    return float(smooth)
