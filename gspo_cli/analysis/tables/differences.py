"""`gspo compare --baseline ARM`: each arm's difference from a baseline arm, with a verdict.

The values are compare's own per-seed numbers (a column's value for each run); the statistics are
`gspo_cli.analysis.stats`: paired over the seeds both arms have (Welch when none pair), the held-out
score from problem records where every run has them at its final evaluation (seeds t + problem
bootstrap), Holm over every row shown, equivalence with a margin, seeds needed where not resolved.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field, replace

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gspo_cli.analysis.rundata.runs import Group, Run
from gspo_cli.analysis.stats import (
    PLAN_NOTE,
    Difference,
    Estimate,
    ProblemScores,
    decide,
    iqm,
    probability_of_improvement,
    problem_difference,
    seed_difference,
    verdict,
)
from gspo_cli.analysis.stats.stability import COLLAPSE_PREFIX, survival_items, survival_label
from gspo_cli.analysis.tables.compare import Comparison, render
from gspo_cli.errors import SpecError

COLUMNS = ("arm", "baseline", "metric", "delta", "ci_low", "ci_high", "method", "verdict", "p_adjusted", "seeds_needed")
# Which way is better, by compare column id (a prefix ends in ":"): up for rewards and scores, down
# for divergence, cost and time to a threshold. Anything else has no direction (higher / lower).
_UP = ("reward", "accuracy", "eval_best:", "eval_final:", "eval_budget:", "eval_reward:", "reward:")
_DOWN = ("kl", "step_time", "wall", "threshold_step", "threshold_time", "tool_errors", "tool_timeouts")


def metric_direction(column_id: str) -> int:
    """+1 when higher is better, -1 when lower is better, 0 when the metric has no direction."""
    if column_id in _UP or any(p.endswith(":") and column_id.startswith(p) for p in _UP):
        return 1
    return -1 if column_id in _DOWN else 0


@dataclass
class DifferenceTable:
    rows: list[Difference]
    labels: dict[str, str]  # column id -> header label
    notes: list[str] = field(default_factory=list)
    robust: bool = False
    sequential: list[dict] = field(default_factory=list)  # until_decided.json decisions of these runs


def problem_records(run: Run, task: str) -> ProblemScores | None:
    """The problem records of the run's last evaluation of `task` (None if that evaluation has none:
    a run written before they existed)."""
    recs = [r for r in run.evals if "step" in r and str(r.get("set") or r.get("task", "eval")) == task]
    if not recs:
        return None
    last = max(recs, key=lambda r: int(r["step"]))
    probs, samples = last.get("problems"), last.get("samples")
    if not isinstance(probs, dict) or not isinstance(samples, int) or samples < 1:
        return None
    ids, correct = probs.get("id") or [], probs.get("correct") or []
    if not ids or len(ids) != len(correct):
        return None
    return ProblemScores(tuple(map(str, ids)), np.asarray(correct, dtype=float), samples)


def spec_comparison(groups: list[Group]) -> dict:
    """The runs' spec section `comparison` (baseline, arm, metric, margin), {} without one: read as
    plain YAML, so runs written before the section existed compare as before."""
    for g in groups:
        for r in g.runs:
            sec = r.spec.get("comparison")
            if isinstance(sec, dict):
                return sec
    return {}


def _per_seed(group: Group, value) -> dict[int, float]:
    return {r.seed: value(r) for r in group.runs}


def estimate(arm: Group, base: Group, column) -> Estimate:
    """arm - base on one compare column: from problem records for a held-out final score when every
    run has them, else from the per-seed values (paired where the seeds pair)."""
    if column.id.startswith("eval_final:"):
        task = column.id.split(":", 1)[1]
        a = {r.seed: problem_records(r, task) for r in arm.runs}
        b = {r.seed: problem_records(r, task) for r in base.runs}
        if all(v is not None for v in (*a.values(), *b.values())):
            est = problem_difference(a, b)
            if est is not None:
                return est
        est = seed_difference(_per_seed(arm, column.value), _per_seed(base, column.value))
        return replace(est, method=est.method + " (no problem records)") if est.n_paired else est
    return seed_difference(_per_seed(arm, column.value), _per_seed(base, column.value))


def default_metrics(columns) -> list[str]:
    """The family compare shows by default: each held-out set's final score (and, with --budget, its
    score at equal compute), then the train reward."""
    held_out = [c.id for c in columns if c.id.startswith(("eval_final:", "eval_budget:"))]
    return held_out + [c.id for c in columns if c.id == "reward"]


def family_metrics(columns, *, explicit: bool, spec_metric: str | None = None) -> list[str] | None:
    """Which columns the differences cover: the spec's comparison.metric when it is a column shown;
    every column shown but `steps` when --metrics chose them; else None (`default_metrics`)."""
    ids = [c.id for c in columns]
    if spec_metric in ids:
        return [spec_metric]
    return [i for i in ids if i != "steps"] if explicit else None


def build_differences(
    groups: list[Group],
    columns,
    *,
    baseline: str | None,
    margin: float | None = None,
    pairs: bool = False,
    metrics: list[str] | None = None,
    robust: bool = False,
) -> DifferenceTable:
    """Every arm against `baseline` (or, with `pairs`, every pair of arms) on `metrics` (column ids;
    default `default_metrics`), one Holm family. SpecError for an unknown baseline or metric."""
    by_name = {g.name: g for g in groups}
    if margin is not None and margin < 0:
        raise SpecError(f"--margin: must be >= 0, got {margin:g}")
    if pairs:
        couples = [(groups[j], groups[i]) for i in range(len(groups)) for j in range(i + 1, len(groups))]
    else:
        if baseline not in by_name:
            raise SpecError(f"--baseline: no arm {baseline!r} among the runs (arms: {', '.join(by_name)})")
        couples = [(g, by_name[baseline]) for g in groups if g.name != baseline]
    cols = {c.id: c for c in columns}
    wanted = metrics or default_metrics(columns)
    if unknown := [m for m in wanted if m not in cols]:
        raise SpecError(f"comparison metric {unknown[0]!r} is not a column shown (columns: {', '.join(cols)})")
    items, raw = [], []
    for arm, base in couples:
        for m in wanted:
            items.append((arm.name, base.name, m, metric_direction(m), estimate(arm, base, cols[m])))
            raw.append(([cols[m].value(r) for r in arm.runs], [cols[m].value(r) for r in base.runs]))
    surv = survival_items(couples, [m.split(":", 1)[1] for m in wanted if m.startswith("eval_final:")])
    items, raw = items + surv, raw + [([], [])] * len(surv)
    # A margin is in the metric's units; O − E of a log-rank row has none: no equivalence verdict.
    rows = [
        replace(d, verdict=verdict(d.estimate, d.p_adjusted, -1, None), margin=None, seeds_equivalence=None)
        if d.metric.startswith(COLLAPSE_PREFIX)
        else d
        for d in decide(items, margin=margin)
    ]
    if robust:
        rows = [
            replace(
                d, prob_improvement=probability_of_improvement(a, b, d.direction or 1), iqm_arm=iqm(a), iqm_base=iqm(b)
            )
            for d, (a, b) in zip(rows, raw)
        ]
    labels = {c.id: c.label for c in columns} | {
        d.metric: survival_label(d.metric) for d in rows[len(rows) - len(surv) :]
    }
    return DifferenceTable(rows, labels, _notes(rows, labels, margin, robust), robust)


def _notes(rows: list[Difference], labels: dict[str, str], margin: float | None, robust: bool) -> list[str]:
    words = {1: "higher is better", -1: "lower is better", 0: "no direction (higher / lower)"}
    shown = dict.fromkeys((d.metric, d.direction) for d in rows)
    notes = [
        "Differences: arm − baseline, 95% CI (unadjusted); verdicts from Holm-adjusted p-values over the "
        f"{len(rows)} rows"
        + (f", equivalent = 90% CI inside ±{margin:g} (TOST)" if margin is not None else "")
        + ". "
        + "; ".join(f"{labels.get(m, m)}: {words[d]}" for m, d in shown)
        + ".",
        PLAN_NOTE + ".",
    ]
    if robust:
        notes.append(
            "P(improve): P(arm better than baseline) over every pair of their seeds (ties half); IQM: "
            "interquartile mean over seeds (Agarwal et al. 2021)."
        )
    for d in rows:
        comp = d.estimate.components
        if comp is not None:
            sh, ci = comp.shares(), comp.share_intervals()
            pct = lambda k, sh=sh, ci=ci: f"{100 * sh[k]:.0f}% [{100 * ci[k][0]:.0f}%, {100 * ci[k][1]:.0f}%]"  # noqa: E731
            notes.append(
                f"{d.arm} − {d.baseline}, {labels.get(d.metric, d.metric)}: variance from seeds at least "
                f"{pct('seeds')}, problems {pct('problems')}, sampling at most {pct('sampling')} (95% intervals; "
                "the arms share their sampling draws, so the sampling share is a bound; "
                f"{comp.seeds} seeds x {comp.problems} problems x {comp.samples} samples)"
            )
        if why := d.resolution():
            notes.append(f"{d.arm} − {d.baseline}, {labels.get(d.metric, d.metric)}: not resolved; {why}.")
    return notes


# --------------------------------------------------------------------------- rendering


def _f(x: float | None, fmt: str = "+.3g") -> str:
    return format(x, fmt) if x is not None and math.isfinite(x) else "—"


def text_rows(table: DifferenceTable) -> tuple[list[str], list[list[str]]]:
    header = ["arm", "baseline", "metric", "difference", "95% CI", "method", "verdict", "adj. p", "seeds needed"]
    if table.robust:
        header += ["P(improve)", "IQM arm", "IQM base"]
    rows = []
    for d in table.rows:
        lo, hi = d.ci95
        need = "—"
        if d.verdict == "not resolved":
            planned = d.estimate.has_interval and math.isfinite(d.estimate.sd_pairs)
            need = str(d.seeds_needed) if d.seeds_needed is not None else ("> 1000" if planned else "—")
            need += f" (equiv. {d.seeds_equivalence})" if d.seeds_equivalence is not None else ""
        row = [d.arm, d.baseline, table.labels.get(d.metric, d.metric), _f(d.delta)]
        row += [f"[{_f(lo)}, {_f(hi)}]" if math.isfinite(lo) else "—", d.method, d.verdict, _f(d.p_adjusted, ".3g")]
        row.append(str(need))
        if table.robust:
            row += [_f(d.prob_improvement, ".2f"), _f(d.iqm_arm, ".3g"), _f(d.iqm_base, ".3g")]
        rows.append(row)
    return header, rows


def to_csv(table: DifferenceTable) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    extra = ["seeds_equivalence", "direction"] + (
        ["prob_improvement", "iqm_arm", "iqm_baseline"] if table.robust else []
    )
    w.writerow([*COLUMNS, *extra])
    for d in table.rows:
        rec = d.to_dict()
        w.writerow(["" if rec[k] is None else rec[k] for k in (*COLUMNS, *extra)])
    return buf.getvalue()


def to_json(table: DifferenceTable) -> list[dict]:
    return [d.to_dict() for d in table.rows]


def render_with_differences(comp: Comparison, table: DifferenceTable, fmt: str) -> str:
    """compare's output with the differences: under the arms table (table, markdown), a
    `differences` list (json), or the differences rows alone (csv: one table per file)."""
    if fmt == "csv":
        return to_csv(table)
    if fmt == "json":
        doc = json.loads(render(comp, "json"))
        doc["differences"] = to_json(table)
        doc["difference_notes"] = table.notes
        if table.sequential:
            doc["sequential"] = table.sequential
        return json.dumps(doc, indent=2) + "\n"
    header, rows = text_rows(table)
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return render(comp, fmt) + "\n" + "\n".join(lines + [""] + [f"- {n}" for n in table.notes]) + "\n"
    console = Console(file=io.StringIO(), width=1000, color_system=None, force_terminal=False)
    console.print(rich_table(table))
    text = "\n".join(line.rstrip() for line in console.file.getvalue().splitlines())
    return render(comp, fmt) + "\n" + text + "\n" + "".join(f"{n}\n" for n in table.notes)


def rich_table(table: DifferenceTable) -> Table:
    """One column per difference (like compare's arms table), so a few fit a terminal."""
    header, rows = text_rows(table)
    out = Table(title="differences from the baseline")
    out.add_column(Text(""))
    for r in rows:
        out.add_column(Text(f"{r[0]} − {r[1]}"), justify="right")
    for i, label in enumerate(header[2:], start=2):
        out.add_row(Text(label), *(Text(r[i]) for r in rows))
    return out


__all__ = [
    "COLUMNS",
    "DifferenceTable",
    "build_differences",
    "estimate",
    "family_metrics",
    "metric_direction",
    "problem_records",
    "render_with_differences",
    "rich_table",
    "spec_comparison",
    "to_csv",
]
