"""Statistics over seeds: the mean with its sample std and 95% t half-width, for one value per
seed (`seed_stats`) or for every point of a (points x seeds) frame (`curve_stats`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gspo_cli.analysis.stats.intervals import t975


@dataclass(frozen=True)
class Stats:
    """Mean over seeds with its sample std and 95% CI half-width; n counts finite values."""

    n: int
    mean: float
    std: float
    ci95: float


def seed_stats(values: list[float] | np.ndarray) -> Stats:
    """Statistics over the finite values (one per seed): std with ddof=1, CI = t * std / sqrt(n)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return Stats(0, math.nan, math.nan, math.nan)
    if n == 1:
        return Stats(1, float(x[0]), math.nan, math.nan)
    std = float(np.std(x, ddof=1))
    return Stats(n, float(np.mean(x)), std, t975(n - 1) * std / math.sqrt(n))


def curve_stats(frame: pd.DataFrame) -> pd.DataFrame:
    """Row-wise seed_stats of a (points x seeds) frame: columns n, mean, std, ci95."""
    n = frame.notna().sum(axis=1)
    std = frame.std(axis=1, ddof=1)
    t = n.map(lambda k: t975(int(k) - 1))
    return pd.DataFrame({"n": n, "mean": frame.mean(axis=1), "std": std, "ci95": t * std / np.sqrt(n.where(n > 0))})


__all__ = ["Stats", "curve_stats", "seed_stats"]
