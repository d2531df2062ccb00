"""The `tune:` section: the same tuning budget for every arm, selected on one evaluation set and
compared on another (`gspo tune SPEC`).

Each arm lists the grid of its own settings (spec paths; `arm.X` is a field of that arm). Every
arm gets one budget: each of its grid's points trained on `seeds` for `steps` steps; the budgets
must be equal (grid sizes equal) unless `gspo tune --unequal`. The selection rule, the same for
every arm: the point with the highest mean over `seeds` of `metric` on `selection_set` at the
runs' last evaluation (ties: the first in grid order). The selected points are then trained on
`final_seeds` (fresh) for train.steps and compared on `test_set`.
"""

from __future__ import annotations

import itertools
import math
from typing import Annotated, Any

from pydantic import Field, model_validator

from gspo_cli.spec.base import _Strict

SELECTION_RULE = (
    "highest mean over the selection seeds of {metric} on {selection_set} at the last evaluation of each "
    "run (ties: the first point in grid order); the same rule for every arm"
)


class TuneConfig(_Strict):
    """Tune every arm on the same budget: a grid per arm, selection on one evaluation set, the
    comparison of the selected settings on another (`gspo tune SPEC`)."""

    grids: dict[str, dict[str, list[Any]]] = Field(
        description="arm name -> its grid: spec path -> values (`arm.clip_high` is that arm's field, "
        "`optimizer.lr` the experiment's); every combination is one setting"
    )
    selection_set: str = Field(description="the task.eval_sets name the settings are selected on (validation)")
    test_set: str = Field(description="the task.eval_sets name the selected settings are compared on; disjoint")
    metric: str | None = Field(None, description="the score selected on (default avg@K, K = the set's samples)")
    seeds: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: [1000], min_length=1, description="seeds of every tuning run (each grid point)"
    )
    steps: int | None = Field(None, ge=1, description="steps of every tuning run (default train.steps)")
    final_seeds: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: [0, 1, 2],
        min_length=2,
        description="fresh seeds the selected settings are trained on (none of `seeds`)",
    )

    @model_validator(mode="after")
    def _check(self):
        problems = [] if self.grids else ["grids: needs every arm's grid (it is empty: nothing to tune)"]
        for arm, grid in self.grids.items():
            if not grid:
                problems.append(f"grids.{arm}: needs at least one setting path")
            for key, values in grid.items():
                if not values:
                    problems.append(f"grids.{arm}.{key}: needs at least one value")
                seen = [str(v) for v in values]
                if dups := sorted({v for v in seen if seen.count(v) > 1}):
                    problems.append(
                        f"grids.{arm}.{key}: {', '.join(dups)} listed twice; each value is one setting (two would "
                        "train the same runs on one path and count its budget twice)"
                    )
        if self.selection_set == self.test_set:
            problems.append(
                f"test_set: {self.test_set} is also the selection set; selecting and comparing on the same "
                "problems decides the comparison before it starts: name two disjoint task.eval_sets"
            )
        if shared := sorted(set(self.seeds) & set(self.final_seeds)):
            problems.append(f"final_seeds: {shared} are also tuning seeds; the final runs need fresh seeds")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def points(self, arm: str) -> list[dict[str, Any]]:
        """The arm's grid points in grid order (the last key varying fastest)."""
        grid = self.grids[arm]
        keys = list(grid)
        return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]

    def budget(self, arm: str, train_steps: int) -> int:
        """Training steps the arm's tuning spends: points x seeds x steps."""
        return len(self.points(arm)) * len(self.seeds) * (self.steps or train_steps)

    def rule(self, metric: str) -> str:
        return SELECTION_RULE.format(metric=metric, selection_set=self.selection_set)


def grid_position(values: list[Any], chosen: Any) -> tuple[int, bool]:
    """Where `chosen` sits among `values`: its rank by value (numbers sorted; else list order) and
    whether it is at an edge (the smallest or largest of three or more values: two values have no
    inside, so their edge says nothing about the grid being too narrow)."""
    nums = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
    order = sorted(values) if nums else list(values)
    rank = order.index(chosen)
    return rank, len(order) >= 3 and rank in (0, len(order) - 1)


__all__ = ["SELECTION_RULE", "TuneConfig", "grid_position"]
