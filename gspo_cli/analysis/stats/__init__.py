"""The statistics engine of `compare`, `report` and `plot`: torch-free, quantiles from scipy.stats.

- intervals: an arm's difference from a baseline over seeds (paired t, Welch when seeds do not pair)
- problems: held-out differences from problem records (seeds t + problem bootstrap)
- components: the variance decomposition (seeds, problems, sampling) and what would help most
- decisions: verdicts (better, worse, equivalent, not resolved), Holm over a family
- planning: seeds needed (paired, 80% power; and for equivalence)
- robust: probability of improvement and the interquartile mean
The methods, formulas and sources are in docs/guides/statistics.md.
"""

from gspo_cli.analysis.stats.components import Components
from gspo_cli.analysis.stats.decisions import ALPHA, PLAN_NOTE, VERDICTS, Difference, decide, holm, verdict
from gspo_cli.analysis.stats.intervals import Estimate, paired_t, seed_difference, t975, t_quantile, welch
from gspo_cli.analysis.stats.planning import seeds_for_equivalence, seeds_needed
from gspo_cli.analysis.stats.problems import ProblemScores, problem_difference, two_level
from gspo_cli.analysis.stats.robust import iqm, probability_of_improvement

__all__ = [
    "ALPHA",
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
