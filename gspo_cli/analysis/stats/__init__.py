"""The statistics engine of `compare`, `report` and `plot`: torch-free, quantiles from scipy.stats;
numbers only, no output formatting.

- intervals: an arm's difference from a baseline over seeds (paired t, Welch when seeds do not pair)
- seeds: the mean over seeds with its std and 95% t half-width (one value per seed, or per point)
- problems: held-out differences from problem records (seeds t + problem bootstrap)
- components: the variance decomposition (seeds, problems, sampling) and what would help most
- decisions: verdicts (better, worse, equivalent, not resolved, descriptive), the families and
  Shaffer's step-down (Holm's, with equivalence) over each
- planning: seeds needed (paired, 80% power, for the smallest effect of interest; and for equivalence)
- robust: probability of improvement and the interquartile mean
- exact: outliers and two modes among per-seed differences, the sign-flip test, collapse rates
- sequential: group-sequential looks (alpha spending) for `gspo sweep --until-decided`
- survival: Kaplan-Meier curves and the log-rank test
- stability: each run's collapse (COLLAPSE_RULE) and collapse read as a time, per arm
- saturation: the saturating fit of a score against compute
- calibration: the arithmetic of calibrating verdicts (Clopper-Pearson, disjoint blocks)
The methods, formulas and sources are in docs/guides/statistics.md.

May import `rundata` (stability and saturation read runs and groups); never `tables`, `figures`
or `report`.
"""

from gspo_cli.analysis.stats.components import Components
from gspo_cli.analysis.stats.decisions import (
    ALPHA,
    DESCRIPTIVE,
    PLAN_NOTE,
    TESTED,
    VERDICTS,
    Difference,
    decide,
    describe,
    holm,
    shaffer,
    verdict,
)
from gspo_cli.analysis.stats.exact import (
    collapse_interval,
    one_collapse_reverses,
    shape_flags,
    sign_flip_p,
    smallest_sign_flip_p,
)
from gspo_cli.analysis.stats.intervals import Estimate, paired_t, seed_difference, t975, t_quantile, welch
from gspo_cli.analysis.stats.planning import sd_upper, seeds_for_effect, seeds_for_equivalence, seeds_needed
from gspo_cli.analysis.stats.problems import ProblemScores, problem_difference, two_level
from gspo_cli.analysis.stats.robust import iqm, probability_of_improvement

__all__ = [
    "ALPHA",
    "DESCRIPTIVE",
    "TESTED",
    "collapse_interval",
    "describe",
    "one_collapse_reverses",
    "sd_upper",
    "seeds_for_effect",
    "shaffer",
    "shape_flags",
    "sign_flip_p",
    "smallest_sign_flip_p",
    "Components",
    "Difference",
    "Estimate",
    "PLAN_NOTE",
    "ProblemScores",
    "VERDICTS",
    "decide",
    "holm",
    "iqm",
    "paired_t",
    "probability_of_improvement",
    "problem_difference",
    "seed_difference",
    "seeds_for_equivalence",
    "seeds_needed",
    "t975",
    "t_quantile",
    "two_level",
    "verdict",
    "welch",
]
