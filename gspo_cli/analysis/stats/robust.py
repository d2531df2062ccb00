"""Summaries for metrics with collapses and outliers (Agarwal et al., "Deep Reinforcement Learning
at the Edge of the Statistical Precipice", NeurIPS 2021, the rliable paper).

- Probability of improvement: P(X_arm > X_base) over every (arm seed, baseline seed) pair, ties
  counting one half: the Mann-Whitney U statistic divided by n_arm n_base.
- Interquartile mean (IQM): the mean of the middle 50% of the seeds' values (25% trimmed from each
  end, `scipy.stats.trim_mean`), which a collapsed seed moves far less than the mean.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def _finite(values) -> np.ndarray:
    x = np.asarray(list(values), dtype=float)
    return x[np.isfinite(x)]


def probability_of_improvement(arm, base, direction: int = 1) -> float:
    """P(arm > baseline) over all seed pairs (ties half); `direction` -1 for lower-is-better
    metrics (then P(arm < baseline)). NaN when a side has no value."""
    x, y = _finite(arm), _finite(base)
    if len(x) == 0 or len(y) == 0:
        return math.nan
    if direction < 0:
        x, y = -x, -y
    diff = x[:, None] - y[None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


def iqm(values) -> float:
    """Interquartile mean of the finite values; NaN for none."""
    x = _finite(values)
    return float(stats.trim_mean(x, 0.25)) if len(x) else math.nan


__all__ = ["iqm", "probability_of_improvement"]
