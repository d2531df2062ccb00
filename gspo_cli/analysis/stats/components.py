"""Where the noise of a held-out difference comes from: seeds, problems, sampling.

The per-problem difference of two arms at seed s on problem p is modelled as
    d_sp = delta + a_s + b_p + e_sp,
a_s the training noise of seed s (variance s2_seed), b_p how much more problem p favours the arm
than the average problem (s2_problem; shared by every seed, since every seed evaluates the same
held-out problems), e_sp the rest (s2_resid): the binomial noise of drawing K samples per problem
(s2_sampling, measured from the records) plus a seed-by-problem interaction. The mean difference
over S seeds and P problems then has the variance
    V = s2_seed / S + s2_problem / P + s2_resid / (S P).
Adding seeds shrinks the first and the last terms, more samples per problem only the sampling part
of the last, more problems the second and the last.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Components:
    """Variance components of a held-out difference (per seed, per problem, per cell) with the
    design they were measured on: S seeds, P problems, K samples per problem."""

    seed: float
    problem: float
    resid: float
    sampling: float
    seeds: int
    problems: int
    samples: int

    def variance(self, seeds=None, problems: int | None = None, samples: int | None = None):
        """Variance of the mean difference for another design (by default the measured one)."""
        S = self.seeds if seeds is None else seeds  # an int, or an array of designs
        P = self.problems if problems is None else problems
        K = self.samples if samples is None else samples
        sampling = self.sampling * self.samples / K  # binomial noise shrinks as 1/K
        resid = max(self.resid - self.sampling, 0.0) + sampling
        return self.seed / S + self.problem / P + resid / (S * P)

    def shares(self) -> dict[str, float]:
        """Share of the mean difference's variance from seeds, problems and sampling (sums to 1;
        the seed-by-problem interaction counts with seeds: it too shrinks only with seeds)."""
        S, P = self.seeds, self.problems
        parts = {
            "seeds": self.seed / S + max(self.resid - self.sampling, 0.0) / (S * P),
            "problems": self.problem / P,
            "sampling": min(self.sampling, self.resid) / (S * P),
        }
        total = sum(parts.values())
        return {k: (v / total if total > 0 else 0.0) for k, v in parts.items()}

    def advice(self) -> str:
        """Which doubling shrinks the interval most: seeds (training), samples per problem
        (evaluation only) or problems (a bigger held-out set)."""
        now = self.variance()
        if now <= 0:
            return "no noise measured"
        gain = {
            "seeds": 1 - self.variance(seeds=2 * self.seeds) / now,
            "samples per problem": 1 - self.variance(samples=2 * self.samples) / now,
            "problems": 1 - self.variance(problems=2 * self.problems) / now,
        }
        top = max(gain.values())
        best = [k for k, v in gain.items() if v >= top - 0.01]  # within a point of the best: a tie
        text = ", ".join(f"{k} {100 * v:.0f}%" for k, v in gain.items())
        if len(best) > 1:  # e.g. all noise is sampling: each doubling halves it; add the cheapest
            return f"doubling shrinks the variance by: {text}; {' and '.join(best)} help alike: add the cheapest"
        return f"doubling shrinks the variance by: {text}; most: more {best[0]}"


__all__ = ["Components"]
