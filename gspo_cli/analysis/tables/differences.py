"""`gspo compare --baseline ARM`: each arm's difference from a baseline arm, with a verdict.

The values are compare's own per-seed numbers (a column's value for each run); the statistics are
`gspo_cli.analysis.stats`: paired over the seeds both arms have (Welch when none pair), the held-out
score from problem records where every run has them at its final evaluation (seeds t + problem
bootstrap), equivalence with a margin, seeds needed where not resolved. The rows fall into
families: the spec's pre-registered primary comparison alone at the full alpha, the other outcomes
(held-out sets and scores, train reward, time to a threshold, collapses) as the secondary family,
and the diagnostics (clip fractions, KL, entropy, lengths, grad norm, step time, expert change:
any column without a direction, and KL, step time and wall time) described without a test.

Nothing is dropped: a run that never reaches a threshold is censored at its last step (the
log-rank test of reaching it), and a held-out score of runs that end at different steps (a run
that diverged or stopped) is compared at the last evaluation step they all have.
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

from gspo_cli.analysis.rundata.runs import Group
from gspo_cli.analysis.stats import PLAN_NOTE, Difference, decide, describe, iqm, probability_of_improvement
from gspo_cli.analysis.stats.stability import (
    COLLAPSE_FRACTION,
    COLLAPSE_PREFIX,
    collapse_counts,
    survival_items,
    survival_label,
)
from gspo_cli.analysis.tables.compare import Comparison, render
from gspo_cli.analysis.tables.estimates import THRESHOLD, estimate, matched_step, problem_records, threshold_estimate
from gspo_cli.errors import SpecError
from gspo_cli.metrics import FLOAT_NOISE
from gspo_cli.metrics import direction as metric_key_direction

COLUMNS = ("arm", "baseline", "metric", "delta", "ci_low", "ci_high", "method", "verdict", "p_adjusted", "seeds_needed")
# Which way is better, by compare column id (a prefix ends in ":"): up for rewards and scores, down
# for divergence, cost and time to a threshold. Anything else has no direction (higher / lower).
_UP = ("reward", "accuracy", "eval_best:", "eval_final:", "eval_budget:", "eval_reward:", "reward:")
_DOWN = ("kl", "step_time", "wall", "threshold_step", "threshold_time", "tool_errors", "tool_timeouts")


# Diagnostics with a direction: shown with their intervals, never tested (no verdict, no family).
_DIAGNOSTIC = ("kl", "step_time", "wall")
# Scores a collapse halves (COLLAPSE_RULE): checked for a verdict one collapsed seed would reverse.
_SCORES = ("reward", "eval_final:", "eval_best:", "eval_budget:")


# The metrics.jsonl keys of those diagnostics, when --metrics names them as keys.
_DIAGNOSTIC_KEYS = ("policy/kl_old_k3", "policy/kl_ref_k3", "time/step_s", "time/elapsed_s")


def is_diagnostic(column_id: str) -> bool:
    """Whether a column is a diagnostic: no direction, or KL, step time or wall time."""
    return metric_direction(column_id) == 0 or column_id in _DIAGNOSTIC or column_id in _DIAGNOSTIC_KEYS


def metric_direction(column_id: str) -> int:
    """+1 when higher is better, -1 when lower is better, 0 when the metric has no direction; a
    metrics.jsonl key (--metrics policy/loss) by `metrics.direction`, as --until-decided reads it."""
    if column_id in _UP or any(p.endswith(":") and column_id.startswith(p) for p in _UP):
        return 1
    if column_id in _DOWN:
        return -1
    return metric_key_direction(column_id) if "/" in column_id else 0


@dataclass
class DifferenceTable:
    rows: list[Difference]
    labels: dict[str, str]  # column id -> header label
    notes: list[str] = field(default_factory=list)
    robust: bool = False
    sequential: list[dict] = field(default_factory=list)  # until_decided.json decisions of these runs


def spec_comparison(groups: list[Group]) -> dict:
    """The runs' spec section `comparison` (baseline, arm, metric, margin, effect), {} without one: read as
    plain YAML, so runs written before the section existed compare as before."""
    for g in groups:
        for r in g.runs:
            sec = r.spec.get("comparison")
            if isinstance(sec, dict):
                return sec
    return {}


def default_metrics(columns) -> list[str]:
    """The family compare shows by default: each held-out set's final score (and, with --budget, its
    score at equal compute), then the train reward."""
    held_out = [c.id for c in columns if c.id.startswith(("eval_final:", "eval_budget:"))]
    return held_out + [c.id for c in columns if c.id == "reward"]


def primary_metric(columns, spec_metric: str | None) -> str | None:
    """The primary comparison's column: the spec's comparison.metric, or (null) the held-out score
    compare shows first; None when it is not a column shown."""
    ids = [c.id for c in columns]
    if spec_metric is None:
        return next((i for i in ids if i.startswith("eval_final:")), None)
    if spec_metric == "collapse" or spec_metric.startswith(COLLAPSE_PREFIX):
        # time to collapse (the log-rank row) on a held-out set shown: "collapse" names the first
        tasks = [i.split(":", 1)[1] for i in ids if i.startswith("eval_final:")]
        task = tasks[0] if spec_metric == "collapse" and tasks else spec_metric.removeprefix(COLLAPSE_PREFIX)
        return COLLAPSE_PREFIX + task if task in tasks else None
    return spec_metric if spec_metric in ids else None


def primary_key(section: dict, baseline: str | None, columns) -> tuple[str, str, str] | None:
    """The spec comparison's primary hypothesis as a row key (arm, baseline, column id), when the
    differences are against the spec's baseline and its metric is a column shown; else None (no
    primary: every tested row in one family)."""
    arm, base = section.get("arm"), section.get("baseline")
    metric = primary_metric(columns, section.get("metric"))
    if arm is None or base is None or base != baseline or metric is None:
        return None
    return str(arm), str(base), metric


def family_metrics(columns, *, explicit: bool, spec_metric: str | None = None) -> list[str] | None:
    """Which columns the differences cover: every column shown but `steps` when --metrics chose
    them; else `default_metrics`, with the spec's comparison.metric first when it is a column shown
    and not among them; None when that changes nothing (`default_metrics`)."""
    ids = [c.id for c in columns]
    if explicit:
        return [i for i in ids if i != "steps"]
    if spec_metric in ids and spec_metric not in default_metrics(columns):
        return [spec_metric, *default_metrics(columns)]
    return None


def _collapse_size(metric: str, arm_values: list[float], base_values: list[float]) -> float | None:
    """What one collapsed seed would take off a score: (1 - COLLAPSE_FRACTION) of the better arm's
    mean (a collapse halves the score, COLLAPSE_RULE); None for a metric a collapse does not halve."""
    if not (metric == "reward" or metric.startswith(_SCORES[1:])):
        return None
    means = [float(np.mean(f)) for v in (arm_values, base_values) if len(f := [x for x in v if math.isfinite(x)])]
    top = max(means, default=math.nan)
    return (1 - COLLAPSE_FRACTION) * top if math.isfinite(top) and top > 0 else None


def build_differences(
    groups: list[Group],
    columns,
    *,
    baseline: str | None,
    margin: float | None = None,
    pairs: bool = False,
    metrics: list[str] | None = None,
    robust: bool = False,
    primary: tuple[str, str, str] | None = None,
    effect: float | None = None,
) -> DifferenceTable:
    """Every arm against `baseline` (or, with `pairs`, every pair of arms) on `metrics` (column ids;
    default `default_metrics`). `primary`: the pre-registered (arm, baseline, metric), tested alone
    at the full alpha; every other row with a direction is in the secondary family (Holm, with the
    TOST p-values in the same step-down), diagnostics get no test. `effect`: the smallest effect of
    interest seeds are planned for (default the margin). SpecError for an unknown baseline or metric."""
    by_name = {g.name: g for g in groups}
    if margin is not None and margin < 0:
        raise SpecError(f"--margin: must be >= 0, got {margin:g}")
    if effect is not None and not effect > 0:
        raise SpecError(f"--effect: must be > 0, got {effect:g}")
    effect = effect if effect is not None else margin
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
            direction = 1 if m in THRESHOLD else metric_direction(m)  # O − E of reaching it: more is better
            items.append((arm.name, base.name, m, direction, estimate(arm, base, cols[m])))
            raw.append(([cols[m].value(r) for r in arm.runs], [cols[m].value(r) for r in base.runs]))
    tasks = [m.split(":", 1)[1] for m in wanted if m.startswith("eval_final:")]
    surv = survival_items(couples, tasks)
    items, raw = items + surv, raw + [([], [])] * len(surv)
    rows = _decide_families(items, raw, primary, margin, effect)
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
    for m in THRESHOLD:
        if m in labels:
            labels[m] += ": O − E reaching it (log-rank)"
    counts = collapse_counts(groups, tasks[0]) if tasks else []
    notes = _notes(rows, labels, margin, robust, counts) + _unmoved_notes(rows, by_name)
    if primary is not None and primary[2].startswith(COLLAPSE_PREFIX) and not any(d.family == "primary" for d in rows):
        task = primary[2].removeprefix(COLLAPSE_PREFIX)
        notes.insert(
            0,
            f"Primary (time to collapse on {task}, {primary[0]} against {primary[1]}): no run of either arm "
            "collapsed, so the log-rank has nothing to test and there is no verdict; the collapse counts "
            "say which rates the seeds exclude.",
        )
    return DifferenceTable(rows, labels, notes, robust)


def _unmoved(run, task: str) -> bool:
    """Every evaluation of `task` in `run` scores what step 0 scored (and there is a later one)."""
    ev = run.eval_scores
    ev = ev[ev.task == task].dropna(subset=["score"])
    start = ev.score[ev.step == 0]
    return len(start) > 0 and (ev.step > 0).any() and bool((abs(ev.score - start.iloc[0]) < FLOAT_NOISE).all())


def _unmoved_notes(rows: list[Difference], by_name: dict[str, Group]) -> list[str]:
    """An `equivalent` held-out verdict between arms none of whose runs ever left its step-0 score:
    both stayed where they started, which says nothing about how alike they learn."""
    out = []
    for d in rows:
        if d.verdict != "equivalent" or not d.metric.startswith("eval_final:"):
            continue
        task = d.metric.split(":", 1)[1]
        if d.arm in by_name and d.baseline in by_name:
            runs = by_name[d.arm].runs + by_name[d.baseline].runs
            if all(_unmoved(r, task) for r in runs):
                out.append(
                    f"{d.arm} − {d.baseline} on {task}: equivalent, but no run of either arm moved from its step-0 "
                    f"score at any evaluation: neither arm learned, so equal ends say nothing about how they learn."
                )
    return out


def _decide_families(items: list[tuple], raw: list[tuple], primary, margin, effect) -> list[Difference]:
    """The rows' verdicts by family (module docstring), in the items' order."""
    # A margin or an effect is in the metric's units; log-rank rows (O − E) have none.
    unitless = [m.startswith(COLLAPSE_PREFIX) or m in THRESHOLD for _, _, m, _, _ in items]
    margins = [None if u else margin for u in unitless]
    effects = [None if u else effect for u in unitless]
    sizes = [None if u else _collapse_size(it[2], *r) for it, r, u in zip(items, raw, unitless)]
    kinds = [
        "primary"
        if primary is not None and (a, b, m) == tuple(primary)
        else "diagnostics"
        if direction == 0 or m in _DIAGNOSTIC  # a log-rank row has its own direction
        else ""
        for a, b, m, direction, _ in items
    ]
    rest = "secondary" if "primary" in kinds else "all tested"
    out: list[Difference | None] = [None] * len(items)
    for kind in ("primary", ""):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        if not idx:
            continue
        rows = decide(
            [items[i] for i in idx],
            margin=[margins[i] for i in idx],
            effect=[effects[i] for i in idx],
            collapse=[sizes[i] for i in idx],
            family=kind or rest,
        )
        for i, d in zip(idx, rows):
            out[i] = d
    for i, d in zip(
        [i for i, k in enumerate(kinds) if k == "diagnostics"],
        describe([it for it, k in zip(items, kinds) if k == "diagnostics"]),
    ):
        out[i] = d
    return out


def _notes(
    rows: list[Difference], labels: dict[str, str], margin: float | None, robust: bool, counts: list[str] = ()
) -> list[str]:
    words = {1: "higher is better", -1: "lower is better", 0: "no direction (higher / lower)"}
    shown = dict.fromkeys((d.metric, d.direction) for d in rows)
    order = {"primary": 0, "diagnostics": 2}
    families = sorted(dict.fromkeys((d.family, d.family_size) for d in rows), key=lambda f: order.get(f[0], 1))
    fam = "; ".join(
        f"{name}: {size} row{'s' * (size != 1)}" + (" (tested at the full alpha)" if name == "primary" else "")
        if name != "diagnostics"
        else f"diagnostics: {sum(d.family == name for d in rows)} rows, described, not tested"
        for name, size in families
    )
    notes = [
        "Differences: arm − baseline, 95% CI (unadjusted); verdicts from p-values adjusted within each family "
        "(Holm's step-down, the equivalence tests in the same step-down: Shaffer 1986)"
        + (f", equivalent = TOST against ±{margin:g} adjusted in the family" if margin is not None else "")
        + f". Families: {fam}. "
        + "; ".join(f"{labels.get(m, m)}: {words[d]}" for m, d in shown)
        + ".",
        PLAN_NOTE + ".",
    ]
    if counts:
        notes.append(
            f"Collapses (held-out score below {COLLAPSE_FRACTION:g} x its step-0 score): " + "; ".join(counts) + "."
        )
    if robust:
        notes.append(
            "P(improve): P(arm better than baseline) over every pair of their seeds (ties half); IQM: "
            "interquartile mean over seeds (Agarwal et al. 2021)."
        )
    for d in rows:
        comp = d.estimate.components
        name = f"{d.arm} − {d.baseline}, {labels.get(d.metric, d.metric)}"
        if comp is not None:
            sh, ci = comp.shares(), comp.share_intervals()
            pct = lambda k, sh=sh, ci=ci: f"{100 * sh[k]:.0f}% [{100 * ci[k][0]:.0f}%, {100 * ci[k][1]:.0f}%]"  # noqa: E731
            notes.append(
                f"{name}: variance from seeds at least "
                f"{pct('seeds')}, problems {pct('problems')}, sampling at most {pct('sampling')} (95% intervals; "
                "the arms share their sampling draws, so the sampling share is a bound; "
                f"{comp.seeds} seeds x {comp.problems} problems x {comp.samples} samples)"
            )
        for w in d.warnings:
            notes.append(f"{name}: {d.verdict}, but {w}.")
        if why := d.resolution():
            notes.append(f"{name}: not resolved; {why}.")
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
        word = d.verdict + (" (warning: see notes)" if d.warnings else "")
        row += [f"[{_f(lo)}, {_f(hi)}]" if math.isfinite(lo) else "—", d.method, word, _f(d.p_adjusted, ".3g")]
        row.append(str(need))
        if table.robust:
            row += [_f(d.prob_improvement, ".2f"), _f(d.iqm_arm, ".3g"), _f(d.iqm_base, ".3g")]
        row.append(f"{d.family} ({d.family_size})" if d.family != "diagnostics" else "diagnostics (no test)")
        rows.append(row)
    header.append("family (size)")
    return header, rows


def to_csv(table: DifferenceTable) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    extra = ["seeds_equivalence", "direction"] + (
        ["prob_improvement", "iqm_arm", "iqm_baseline"] if table.robust else []
    )
    extra += ["family", "family_size", "p_tost_adjusted", "warnings"]
    w.writerow([*COLUMNS, *extra])
    for d in table.rows:
        rec = d.to_dict() | {"warnings": "; ".join(d.warnings)}
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
    "primary_key",
    "primary_metric",
    "is_diagnostic",
    "threshold_estimate",
    "matched_step",
    "problem_records",
    "render_with_differences",
    "rich_table",
    "spec_comparison",
    "to_csv",
]
