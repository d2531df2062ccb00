"""Where the noise of a held-out difference comes from: seeds, problems, sampling.

The per-problem difference of two arms at seed s on problem p is modelled as
    d_sp = delta + a_s + b_p + e_sp,
a_s the training noise of seed s (variance s2_seed), b_p how much more problem p favours the arm
than the average problem (s2_problem; shared by every seed, since every seed evaluates the same
held-out problems), e_sp the rest (s2_resid): the binomial noise of drawing K samples per problem
(the sampling part) plus a seed-by-problem interaction. The mean difference over S seeds and P
problems then has the variance
    V = s2_seed / S + s2_problem / P + s2_resid / (S P).
Adding seeds shrinks the first and the last terms, more samples per problem only the sampling part
of the last, more problems the second and the last.

What is measured and what is only bounded:
- The seed and problem components come from mean squares (MS_seed with S - 1 degrees of freedom,
  MS_problem with P - 1, MS_resid with (S - 1)(P - 1)), so they carry the chi-square uncertainty of
  those. Their 95% intervals, and those of each share and of each doubling's gain, come from a
  parametric bootstrap of the mean squares: MS* = MS chi2_df / df, DRAWS draws from RNG_SEED, the
  components (cut at 0) recomputed from each draw, the 2.5% and 97.5% points taken.
- The sampling part is not identified from per-problem counts. `sampling` (from the records) is
  the sum of both arms' binomial variances: the sampling variance of the difference if the arms
  drew their samples independently. Evaluations use common random numbers (the same draws for
  both arms at equal seed and step), so the two arms' sampling errors are positively correlated
  and partly cancel in the difference: its sampling variance lies between 0 and min(sampling,
  s2_resid). What doubling the samples per problem buys is therefore an upper bound, and the
  seeds' share (the interaction counts with seeds: it too shrinks only with seeds) a lower one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

DRAWS = 4000  # parametric bootstrap draws of the mean squares
RNG_SEED = 20262
LEVEL = 0.95


@dataclass(frozen=True)
class Components:
    """Variance components of a held-out difference (per seed, per problem, per cell) with the
    design they were measured on: S seeds, P problems, K samples per problem; `sampling` the
    independent-arms binomial variance of a cell (an upper bound, module docstring). The mean
    squares, when given, make the intervals; without them (NaN) the intervals are the points."""

    seed: float
    problem: float
    resid: float
    sampling: float
    seeds: int
    problems: int
    samples: int
    ms_seed: float = math.nan
    ms_problem: float = math.nan
    ms_resid: float = math.nan

    def variance(self, seeds=None, problems: int | None = None, samples: int | None = None):
        """Variance of the mean difference for another design (by default the measured one),
        taking the sampling part at its upper bound."""
        S = self.seeds if seeds is None else seeds  # an int, or an array of designs
        P = self.problems if problems is None else problems
        K = self.samples if samples is None else samples
        sampling = min(self.sampling, self.resid) * self.samples / K  # binomial noise shrinks as 1/K
        resid = max(self.resid - self.sampling, 0.0) + sampling
        return self.seed / S + self.problem / P + resid / (S * P)

    def shares(self) -> dict[str, float]:
        """Share of the mean difference's variance from seeds, problems and sampling (sums to 1),
        the sampling part at its upper bound (so the seeds' share is a lower bound)."""
        S, P = self.seeds, self.problems
        parts = {
            "seeds": self.seed / S + max(self.resid - self.sampling, 0.0) / (S * P),
            "problems": self.problem / P,
            "sampling": min(self.sampling, self.resid) / (S * P),
        }
        total = sum(parts.values())
        return {k: (v / total if total > 0 else 0.0) for k, v in parts.items()}

    @cached_property
    def _draws(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(seed, problem, resid) components, (DRAWS,) each, from the parametric bootstrap."""
        S, P = self.seeds, self.problems
        ms = (self.ms_seed, self.ms_problem, self.ms_resid)
        if not all(math.isfinite(m) for m in ms) or S < 2 or P < 2:
            one = np.ones(1)
            return self.seed * one, self.problem * one, self.resid * one
        rng = np.random.default_rng(RNG_SEED)
        dfs = (S - 1, P - 1, (S - 1) * (P - 1))
        seed_ms, prob_ms, res_ms = (m * rng.chisquare(df, DRAWS) / df for m, df in zip(ms, dfs))
        return np.maximum(0.0, (seed_ms - res_ms) / P), np.maximum(0.0, (prob_ms - res_ms) / S), res_ms

    def _range(self, values: np.ndarray) -> tuple[float, float]:
        q = (1 - LEVEL) / 2
        return float(np.quantile(values, q)), float(np.quantile(values, 1 - q))

    def share_intervals(self) -> dict[str, tuple[float, float]]:
        """95% intervals of each share: the mean squares' uncertainty (parametric bootstrap) and,
        for seeds and sampling, the unknown sampling covariance (sampling from 0 to its bound)."""
        seed, prob, res = self._draws
        S, P = self.seeds, self.problems
        total = seed / S + prob / P + res / (S * P)
        total = np.where(total > 0, total, np.inf)
        top = np.minimum(self.sampling, res) / (S * P)  # the sampling part at its bound
        lo_q, hi_q = (1 - LEVEL) / 2, 1 - (1 - LEVEL) / 2
        return {
            "seeds": (
                float(np.quantile((seed / S + res / (S * P) - top) / total, lo_q)),
                float(np.quantile((seed / S + res / (S * P)) / total, hi_q)),
            ),
            "problems": self._range(prob / P / total),
            "sampling": (0.0, float(np.quantile(top / total, hi_q))),
        }

    def gains(self) -> dict[str, tuple[float, float, float]]:
        """What doubling each would cut from the variance, as a share of it: (point, low, high),
        95%. Seeds and problems: measured (their gains do not depend on how the residual splits).
        Samples per problem: the point is the upper bound (half the sampling part at its bound),
        the interval runs from 0 to the 97.5% point of that bound."""
        seed, prob, res = self._draws
        S, P = self.seeds, self.problems
        now = self.variance()
        total = seed / S + prob / P + res / (S * P)
        total = np.where(total > 0, total, np.inf)
        seeds = (seed / S + res / (S * P)) / 2 / total
        problems = (prob / P + res / (S * P)) / 2 / total
        samples = np.minimum(self.sampling, res) / (S * P) / 2 / total
        point = {
            "seeds": 1 - self.variance(seeds=2 * S) / now,
            "problems": 1 - self.variance(problems=2 * P) / now,
            "samples per problem": 1 - self.variance(samples=2 * self.samples) / now,
        }
        return {
            "seeds": (point["seeds"], *self._range(seeds)),
            "problems": (point["problems"], *self._range(problems)),
            "samples per problem": (point["samples per problem"], 0.0, self._range(samples)[1]),
        }

    def advice(self) -> str:
        """What doubling seeds (training), problems (a bigger held-out set) or samples per problem
        (evaluation only) would cut from the variance: the first two with 95% intervals, the last
        as an upper bound (module docstring)."""
        if self.variance() <= 0:
            return "no noise measured"
        g = self.gains()
        pct = lambda v: f"{100 * v:.0f}%"  # noqa: E731

        def measured(k: str) -> str:
            point, lo, hi = g[k]
            return f"the {k} by {pct(point)}" + (f" [{pct(lo)}, {pct(hi)}]" if hi - lo >= 0.005 else "")

        text = (
            f"doubling {measured('seeds')}, {measured('problems')} (95% intervals); doubling the samples "
            f"per problem by at most {pct(g['samples per problem'][0])} (a bound: the arms share their "
            "sampling draws, so part of their sampling noise cancels)"
        )
        top = max(g["seeds"][0], g["problems"][0])
        best = [k for k in ("seeds", "problems") if g[k][0] >= top - 0.01]
        if len(best) > 1:  # e.g. all the noise is in the residual: each doubling halves it
            return f"{text}; seeds and problems help alike: add the cheaper"
        return f"{text}; most: more {best[0]}"


__all__ = ["Components"]
