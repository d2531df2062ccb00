"""The paired benchmark's statistics, pure: per-round ratios, their median with a bootstrap
confidence interval, the box's drift from a reference workload, and the thread probe's choice.

Why a paired bootstrap: on a loaded 2-core machine the time of a step drifts by up to half from one
ten-second window to the next, so two medians measured minutes apart say little. Each round
times both sides back to back; the ratio of the two is the round's observation, and the
median of the rounds' ratios with a percentile bootstrap interval over rounds (resampling whole
rounds, a fixed seed so a report re-renders the same) says how sure the run is.

No torch, no numpy: these run in the orchestrator and in the tests.
"""

from __future__ import annotations

import math
import random
import statistics


def paired_ratios(a: dict, b: dict) -> dict:
    """{round: a[round] / b[round]} over the rounds both sides measured (a value that is None
    or a b of 0 drops its round). `a`, `b`: {round id: seconds per step}."""
    return {k: a[k] / b[k] for k in a if k in b and a[k] is not None and b[k] not in (None, 0)}


def bootstrap_ci(values: list[float], level: float = 0.95, n_boot: int = 10000, seed: int = 0, stat=None):
    """(low, high): the percentile bootstrap interval of `stat` (default: the median) of
    `values`, resampling them with replacement `n_boot` times with random.Random(seed). One
    value gives (v, v); none raises ValueError. The low/high ends are the (1-level)/2 and
    (1+level)/2 quantiles of the resampled statistics (nearest rank, so the ends are always
    values some resample gave)."""
    if not values:
        raise ValueError("bootstrap_ci of no values")
    stat = stat or statistics.median
    rng = random.Random(seed)
    n = len(values)
    boots = sorted(stat([values[rng.randrange(n)] for _ in range(n)]) for _ in range(n_boot))
    lo_i = max(0, math.ceil((1 - level) / 2 * n_boot) - 1)
    hi_i = min(n_boot - 1, math.ceil((1 + level) / 2 * n_boot) - 1)
    return boots[lo_i], boots[hi_i]


def summarize_ratio(ratios: dict, target: float | None = None, level: float = 0.95, seed: int = 0) -> dict:
    """A comparison's verdict from its per-round ratios (`paired_ratios`): n rounds, the
    median, the bootstrap interval (`bootstrap_ci`), whether the interval excludes 1.0 (and on
    which side: "faster" when it lies below 1, "slower" above, None when it straddles 1), and,
    given a `target` ratio, whether the median meets it (<= target) and whether the whole
    interval does (high <= target). No rounds: every figure None."""
    vals = [ratios[k] for k in sorted(ratios)]
    if not vals:
        return {"n": 0, "median": None, "ci": None, "per_round": {}, "excludes_1": None, "target": target}
    lo, hi = bootstrap_ci(vals, level=level, seed=seed)
    side = "faster" if hi < 1 else "slower" if lo > 1 else None
    out = {
        "n": len(vals),
        "median": statistics.median(vals),
        "ci": [lo, hi],
        "level": level,
        "per_round": {str(k): ratios[k] for k in sorted(ratios)},
        "excludes_1": side is not None,
        "side_of_1": side,
        "target": target,
    }
    if target is not None:
        out["median_meets_target"] = out["median"] <= target
        out["ci_meets_target"] = hi <= target
    return out


def drift(times: list[float]) -> dict | None:
    """How much the box drifted, from the times of one fixed reference workload run between
    rounds: n, median, min, max, max/min, and the coefficient of variation (stdev/mean; 0 for
    one time). None without times."""
    if not times:
        return None
    mean = statistics.fmean(times)
    return {
        "n": len(times),
        "median": statistics.median(times),
        "min": min(times),
        "max": max(times),
        "max_over_min": max(times) / min(times),
        "cv": statistics.stdev(times) / mean if len(times) > 1 else 0.0,
    }


def pick_by_min(per_count: dict) -> tuple[int, dict]:
    """The thread count whose fastest round is fastest: (count, {count: min s/step}), from
    {count: [s/step of each probe round]}. The minimum, not one block or a median: on a shared
    box a round is only ever slowed by others' work, so the fastest round is the closest to what
    a count can do. Ties go to the smaller count; an empty dict raises ValueError."""
    mins = {n: min(v) for n, v in per_count.items() if v}
    if not mins:
        raise ValueError("pick_by_min: no probe rounds")
    best = min(sorted(mins), key=lambda n: mins[n])
    return best, mins
