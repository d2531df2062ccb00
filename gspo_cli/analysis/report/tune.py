"""`gspo tune`'s selection and report: each arm's setting chosen on the selection set by one rule,
then the selected settings compared on the test set by the statistics engine.

The rule (`spec.tune.SELECTION_RULE`), the same for every arm: the grid point with the highest mean
over the tuning seeds of the selection score at each run's last evaluation of the selection set;
ties go to the first point in grid order; a point none of whose runs has that score is skipped.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gspo_cli.analysis.rundata.runs import group_runs, load_run
from gspo_cli.analysis.tables.compare import build_columns
from gspo_cli.analysis.tables.differences import build_differences
from gspo_cli.errors import RunError
from gspo_cli.files import write_report_file
from gspo_cli.runs import RunDir, format_setting
from gspo_cli.spec.tune import grid_position


def last_score(run_dir: Path, set_name: str, metric: str) -> float:
    """`metric` of the run's last evaluation of `set_name`; NaN when it has none."""
    recs = [r for r in RunDir(run_dir).evals() if r.get("set", r.get("task")) == set_name and "step" in r]
    if not recs:
        return math.nan
    value = max(recs, key=lambda r: int(r["step"])).get("scores", {}).get(metric)
    return float(value) if isinstance(value, (int, float)) else math.nan


@dataclass
class Point:
    """One grid point of one arm: its settings, run name and per-seed selection scores."""

    arm: str
    settings: dict[str, Any]
    name: str
    scores: dict[int, float] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        vals = [v for v in self.scores.values() if math.isfinite(v)]
        return sum(vals) / len(vals) if vals else math.nan


def select(points: list[Point]) -> Point:
    """The selection rule: the highest mean, ties to the first in grid order; RunError when no
    point has a score (its runs failed or never evaluated the selection set)."""
    best = None
    for p in points:
        if math.isfinite(p.mean) and (best is None or p.mean > best.mean):
            best = p
    if best is None:
        arm = points[0].arm if points else "?"
        raise RunError(f"tune: no setting of arm {arm} has a selection score (did its tuning runs fail?)")
    return best


def position_notes(grid: dict[str, list[Any]], chosen: dict[str, Any]) -> tuple[list[str], bool]:
    """Where the chosen point sits in each key's values, and whether any is at an edge."""
    notes, edge = [], False
    for key, values in grid.items():
        rank, at_edge = grid_position(values, chosen[key])
        edge |= at_edge
        if len(values) == 1:
            where = "one value (not tuned)"
        elif len(values) == 2:
            where = "one of 2 values (two values have no inside: a third shows whether the best lies between)"
        elif at_edge:
            where = f"{'lowest' if rank == 0 else 'highest'} of {len(values)} values (edge: the grid may be too narrow)"
        else:
            where = f"{rank + 1} of {len(values)}"
        notes.append(f"{key} = {format_setting(chosen[key])}: {where}")
    return notes, edge


def compare_final(final_dirs: list[Path], test_set: str, baseline: str, margin: float | None):
    """The statistics engine on the final runs: each arm's held-out final score on the test set
    against the baseline (problem records where every run has them)."""
    runs = [load_run(RunDir(d)) for d in final_dirs if RunDir(d).status() == "completed"]
    if not runs:
        raise RunError("tune: no final run completed; nothing to compare")
    groups = group_runs(runs)
    cols = build_columns(["eval_final"], runs, last=10, threshold=None)
    metric = f"eval_final:{test_set}"
    return build_differences(groups, cols, baseline=baseline, margin=margin, metrics=[metric])


def _f(x: float | None, fmt: str = ".4f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, fmt)


def render(info: dict[str, Any], selection: dict[str, list[Point]], chosen: dict[str, Point], table) -> str:
    """REPORT.md: budgets, grids, selection, positions, the test-set comparison."""
    L = [f"# Tuning: {info['experiment']}", "", f"Written by `gspo tune {info['spec']}`.", ""]
    L += [f"**Selection rule** (every arm): {info['rule']}.", ""]
    L += [
        f"Selection set `{info['selection_set']}` ({info['sizes'][0]} problems) and test set `{info['test_set']}` "
        f"({info['sizes'][1]} problems): disjoint (checked). Tuning seeds {info['seeds']}, final seeds "
        f"{info['final_seeds']} (fresh).",
        "",
        "## Budgets",
        "",
        "| arm | settings | seeds x steps per setting | budget (training steps) |",
        "|---|---|---|---|",
    ]
    for arm, b in info["budgets"].items():
        L.append(f"| {arm} | {len(selection[arm])} | {len(info['seeds'])} x {info['steps']} | {b} |")
    if len(set(info["budgets"].values())) > 1:
        L += ["", "**The budgets are unequal** (`--unequal`): the arm tuned with more runs had more chances."]
    L += ["", "## Grids and selection", ""]
    for arm, points in selection.items():
        seeds = sorted({s for p in points for s in p.scores})
        L += [f"### {arm}", "", "| setting | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | |"]
        L.append("|---|" + "---|" * len(seeds) + "---|---|")
        for p in points:
            setting = ", ".join(f"{k}={format_setting(v)}" for k, v in p.settings.items())
            cells = " | ".join(_f(p.scores.get(s, math.nan)) for s in seeds)
            L.append(f"| {setting} | {cells} | {_f(p.mean)} | {'selected' if p is chosen[arm] else ''} |")
        notes, edge = position_notes(info["grids"][arm], chosen[arm].settings)
        tied = [p.name for p in points if p is not chosen[arm] and p.mean == chosen[arm].mean]
        tie = f" Tied with {', '.join(tied)}: the first in grid order is taken." if tied else ""
        L += ["", f"Selected for {arm}: " + "; ".join(notes) + "." + tie, ""]
        if edge:
            L += [f"**Edge**: {arm}'s choice is at the edge of its grid; a wider grid may find a better setting.", ""]
    L += ["## Test-set comparison", ""]
    L += [
        f"The selected settings trained on the final seeds for {info['train_steps']} steps, held-out final score "
        f"on `{info['test_set']}`, each arm against `{info['baseline']}` (the statistics engine: paired over seeds, "
        "problem bootstrap from problem records, Holm over the rows).",
        "",
        "| arm | difference | 95% CI | method | verdict | p (Holm) | seeds needed |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in table.rows:
        lo, hi = d.ci95
        need = d.seeds_needed if d.seeds_needed is not None else ""
        L.append(
            f"| {d.arm} − {d.baseline} | {_f(d.delta, '+.4f')} | [{_f(lo, '+.4f')}, {_f(hi, '+.4f')}] | {d.method} | "
            f"{d.verdict} | {_f(d.p_adjusted, '.3g')} | {need} |"
        )
    for d in table.rows:
        if why := d.resolution():
            L.append(f"\n{d.arm}: {why}")
    return "\n".join(L) + "\n"


def write(out: Path, info: dict[str, Any], selection: dict[str, list[Point]], chosen: dict[str, Point], table) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    if (kept := write_report_file(out / "REPORT.md", render(info, selection, chosen, table))) is not None:
        warnings.warn(
            f"{out / 'REPORT.md'}: written by hand or edited since gspo wrote it: kept as {kept}", stacklevel=2
        )
    data = {
        **info,
        "selection": {
            arm: [
                {"settings": p.settings, "scores": p.scores, "mean": p.mean, "selected": p is chosen[arm]} for p in pts
            ]
            for arm, pts in selection.items()
        },
        "differences": [d.to_dict() for d in table.rows],
    }
    (out / "tune.json").write_text(json.dumps(_finite(data), indent=1, default=str))
    return out / "REPORT.md"


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


__all__ = ["Point", "compare_final", "last_score", "position_notes", "render", "select", "write"]
