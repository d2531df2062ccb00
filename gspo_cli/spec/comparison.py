"""The experiment's primary comparison: which arm is measured against which baseline, on what
metric, with what equivalence margin and smallest effect of interest, and the design of `gspo sweep
--until-decided` (max_seeds, round_seeds), so its stopping rule is fixed before the first look. Fixed
before the runs, it is the pre-registered primary hypothesis: tested at the full alpha, every other
difference in a family of its own. Analysis reads it (`gspo compare`, `gspo report`,
`gspo sweep --until-decided`); training ignores it, so changing it never makes a completed run
"of a different spec"."""

from __future__ import annotations

from pydantic import Field, model_validator

from gspo_cli.spec.base import _Problems, _Strict


class ComparisonConfig(_Strict):
    """The primary comparison: `arm` against `baseline`, on `metric`, `equivalent` when the
    difference is shown to lie within +-`margin`; seeds planned for a difference of `effect`."""

    baseline: str = Field(description="the arm compared against (e.g. grpo)")
    arm: str = Field(description="the arm measured (e.g. gspo)")
    metric: str | None = Field(
        None,
        description="null: the held-out score gspo compare shows first (avg@K of the held-out split or the first "
        "evaluation set); `collapse` (or `collapse:<set>`): time to collapse on that held-out set, by the log-rank "
        "test (exact with 10 runs or fewer per arm); or a metric key",
    )
    margin: float | None = Field(
        None,
        ge=0,
        description="equivalence margin in the metric's units (e.g. 0.02): the arms are called equivalent when the "
        "difference is shown to lie within +-margin; null: no equivalence verdict",
    )

    effect: float | None = Field(
        None,
        gt=0,
        description="the smallest effect of interest, in the metric's units (e.g. 0.03): seeds needed are planned "
        "to find a difference this large; null: the margin when there is one, else the observed difference",
    )

    max_seeds: int | None = Field(
        None,
        ge=2,
        description="gspo sweep --until-decided: the most seeds per arm (the last look); fixed here, before the "
        "first look, so the stopping rule is set in advance with the margin; null: --max-seeds gives it",
    )
    round_seeds: int | None = Field(
        None,
        ge=1,
        description="gspo sweep --until-decided: new seeds per arm in each round (the looks: the spec's seeds, then "
        "every round_seeds more, then max_seeds); null: --round-seeds, default 1",
    )

    @model_validator(mode="after")
    def _two_arms(self):
        if self.arm == self.baseline:
            raise _Problems(f"arm: {self.arm!r} is also the baseline; compare two different arms")
        return self


def names_arm(comparison: ComparisonConfig | None, arm: str) -> bool:
    """Whether a one-arm spec of `arm` (one run's) can keep `comparison`: it names that arm."""
    return comparison is not None and arm in (comparison.baseline, comparison.arm)
