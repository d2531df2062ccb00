"""`gspo compare`: runs side by side, one row per arm (or group), seeds aggregated.

Every cell is a statistic over seeds of one per-run number (mean over the last N steps,
best eval score, steps to a reward threshold, ...): mean, sample std, 95% CI half-width
from the t-distribution, and the number of seeds that have the number. Runs that are still
going or that died are shown as they are on disk, and the table says so.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gspo_cli.analysis.rundata.arm_settings import SETTINGS, arm_settings
from gspo_cli.analysis.rundata.compute import budget_columns, unequal_compute_note
from gspo_cli.analysis.rundata.runs import Group, Run, final_notes, group_runs, load_runs, reward_names
from gspo_cli.analysis.stats.seeds import Stats, seed_stats
from gspo_cli.analysis.tables.notes import no_signal_note, same_gradient_notes
from gspo_cli.errors import SpecError
from gspo_cli.metrics import METRICS, eval_reward_score, reward_key
from gspo_cli.params import params_note
from gspo_cli.runs import STATUSES

FORMATS = ("table", "markdown", "csv", "json")
# Status counts read best news first: completed, then still going, then the ways a run ends badly.
_STATUS_ORDER = ("completed", "running", *(s for s in STATUSES if s not in ("completed", "running")))


@dataclass(frozen=True)
class Column:
    """One compared quantity: `value` maps a run to a number (NaN when the run lacks it)."""

    id: str
    label: str
    unit: str
    value: Callable[[Run], float]
    fmt: str = ".3g"
    partial: bool = False  # a seed may legitimately have no value (threshold never reached)


@dataclass
class Row:
    group: str
    seeds: list[int]
    status: dict[str, int]
    cells: dict[str, Stats]
    settings: dict[str, str] = field(default_factory=dict)  # SETTINGS id -> the group's value(s)


@dataclass
class Comparison:
    columns: list[Column]
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    groups: list[Group] = field(default_factory=list)  # the runs behind the rows, for the differences


# --------------------------------------------------------------------------- per-run values


def tail_mean(run: Run, key: str, last: int) -> float:
    """Mean of a metric over the last `last` logged steps that have it."""
    s = run.series(key).dropna()
    return float(s.iloc[-last:].mean()) if len(s) else math.nan


def run_mean(run: Run, key: str) -> float:
    s = run.series(key).dropna()
    return float(s.mean()) if len(s) else math.nan


def threshold_crossing(run: Run, threshold: float, window: int) -> tuple[float, float]:
    """(step, training seconds) at which the train reward, averaged over the trailing `window`
    logged steps, first reaches `threshold`; (NaN, NaN) if it never does.

    A full window is required, so one lucky early batch does not count as reaching it.
    """
    s = run.series("reward/mean").dropna()
    hit = (s.rolling(window, min_periods=window).mean() >= threshold).to_numpy()
    if not hit.any():
        return math.nan, math.nan
    step = int(s.index[hit.argmax()])
    t = run.series("time/elapsed_s")
    return float(step), float(t.get(step, math.nan))


def eval_value(run: Run, task: str, which: str) -> float:
    ev = run.eval_scores
    ev = ev[ev.task == task].dropna(subset=["score"]).sort_values("step")
    if ev.empty:
        return math.nan
    return float(ev.score.max() if which == "best" else ev.score.iloc[-1])


# --------------------------------------------------------------------------- columns

# Friendly column names for --metrics: name -> (metric key, header, "last" N steps or whole "run").
_MEANS = {
    "reward": ("reward/mean", "reward", "last"),
    "accuracy": ("reward/accuracy", "accuracy", "last"),
    "clip": ("policy/clip_frac_token", "clip tok", "run"),
    "clip_low": ("policy/clip_frac_token_low", "clip low", "run"),
    "clip_high": ("policy/clip_frac_token_high", "clip high", "run"),
    "clip_seq": ("policy/clip_frac_seq", "clip seq", "run"),
    "expert_change": ("moe/expert_change_frac", "expert chg", "run"),
    "engine_route_diff": ("moe/engine_route_diff_frac", "engine route diff", "run"),
    "mismatch_weight": ("mismatch/weight_mean", "IS weight", "run"),
    "masked": ("mismatch/masked_token_frac", "masked tok", "run"),
    "truncated": ("mismatch/truncated_token_frac", "truncated tok", "run"),
    "kl": ("policy/kl_old_k3", "KL old [nats]", "run"),
    "entropy": ("policy/entropy", "entropy [nats]", "run"),
    "length": ("response/length_mean", "length [tok]", "run"),
    "grad_norm": ("policy/grad_norm", "grad norm", "run"),
    "turns": ("tools/turns_mean", "turns", "run"),  # task.environment runs: per response
    "tool_calls": ("tools/tool_calls_mean", "tool calls", "run"),
    "tool_errors": ("tools/tool_errors_mean", "tool errors", "run"),
    "tool_timeouts": ("tools/tool_timeouts_mean", "tool time-outs", "run"),
    "env_tokens": ("tools/env_token_frac", "env tok", "run"),
    "step_time": ("time/step_s", "s/step", "run"),
}
# Shown by default only where a run logs them (task.environment), like every default column.
TOOL_COLUMNS = ("turns", "tool_calls", "tool_errors", "tool_timeouts", "env_tokens")
SPECIAL = ("steps", "wall", "eval", "eval_best", "eval_final", "threshold", "rewards")
DEFAULT = (
    "steps",
    "reward",
    "eval",
    "rewards",
    "threshold",
    "clip",
    "clip_low",
    "clip_high",
    "expert_change",
    "engine_route_diff",
    "mismatch_weight",
    "masked",
    "truncated",
    "kl",
    "entropy",
    "length",
    *TOOL_COLUMNS,
    "step_time",
    "wall",
)


def build_columns(names: list[str], runs: list[Run], *, last: int, threshold: float | None) -> list[Column]:
    """Columns for the requested names (friendly names or raw metric keys), in order."""
    cols: list[Column] = []
    tasks = sorted({t for r in runs for t in r.eval_scores.task})
    for name in names:
        if name in _MEANS:
            key, label, how = _MEANS[name]
            label = f"{label} (last {last})" if how == "last" else label
            fn = (lambda r, k=key: tail_mean(r, k, last)) if how == "last" else (lambda r, k=key: run_mean(r, k))
            cols.append(Column(name, label, METRICS[key][1], fn))
        elif name in ("eval", "eval_best", "eval_final"):
            cols += _eval_columns(name, tasks, runs)
        elif name == "threshold":
            cols += _threshold_columns(threshold, last)
        elif name == "rewards":
            cols += _reward_columns(reward_names(runs), tasks, last)
        elif name == "steps":
            cols.append(Column("steps", "steps", "step", lambda r: float(r.last_step), ".0f"))
        elif name == "wall":
            cols.append(Column("wall", "train [s]", "s", lambda r: tail_mean(r, "time/elapsed_s", 1), ".4g"))
        elif name in METRICS or any(name in r.metrics.columns for r in runs):
            unit = METRICS.get(name, ("", ""))[1]
            cols.append(Column(name, name, unit, lambda r, k=name: run_mean(r, k)))
        else:
            raise SpecError(
                f"--metrics: unknown metric {name!r} (known: {', '.join([*SPECIAL, *_MEANS])}, "
                "or a key the runs log in metrics.jsonl)"
            )
    return cols


def _eval_columns(name: str, tasks: list[str], runs: list[Run]) -> list[Column]:
    kinds = ("best", "final") if name == "eval" else (name.split("_")[1],)
    cols = []
    for task in tasks:
        key = next((k for r in runs for k in r.eval_scores.key[r.eval_scores.task == task]), "score")
        for which in kinds:
            cols.append(
                Column(
                    f"eval_{which}:{task}",
                    f"{task} {key} {which}",
                    "score",
                    lambda r, t=task, w=which: eval_value(r, t, w),
                )
            )
    return cols


def _reward_columns(names: list[str], tasks: list[str], last: int) -> list[Column]:
    """Per named reward (task.rewards): its train mean over the last `last` steps, then its mean
    at each evaluation set's final evaluation. None without named rewards."""
    cols = [
        Column(f"reward:{n}", f"{n} (last {last})", "reward", lambda r, k=reward_key(n): tail_mean(r, k, last))
        for n in names
    ]
    for task in tasks:
        cols += [
            Column(
                f"eval_reward:{task}:{n}",
                f"{task} {n} final",
                "reward",
                lambda r, t=task, k=eval_reward_score(n): _last(r.eval_series(t, k)),
            )
            for n in names
        ]
    return cols


def _last(s) -> float:
    s = s.dropna()
    return float(s.iloc[-1]) if len(s) else math.nan


def _threshold_columns(threshold: float | None, window: int) -> list[Column]:
    if threshold is None:
        return []
    return [
        Column(
            "threshold_step",
            f"steps to {threshold:g}",
            "step",
            lambda r: threshold_crossing(r, threshold, window)[0],
            ".0f",
            partial=True,
        ),
        Column(
            "threshold_time",
            f"time to {threshold:g} [s]",
            "s",
            lambda r: threshold_crossing(r, threshold, window)[1],
            ".3g",
            partial=True,
        ),
    ]


# --------------------------------------------------------------------------- the comparison


def compare_runs(
    paths: list[str],
    *,
    group_by: str = "arm",
    metrics: list[str] | None = None,
    last: int = 10,
    threshold: float | None = None,
    budget: str | None = None,
) -> Comparison:
    """Read the runs under `paths`, group them and compute every column; SpecError on bad input.
    `budget` (a `compute.AXES` name): add each held-out set's score at equal compute on that axis."""
    if last < 1:
        raise SpecError(f"--last: must be >= 1, got {last}")
    if metrics and "threshold" in metrics and threshold is None:
        raise SpecError("--metrics threshold: needs --threshold VALUE")
    runs = load_runs(paths)
    last = min(last, max(len(r.metrics) for r in runs)) or last  # "last 10" of a 6-step run is its 6
    groups = group_runs(runs, group_by)
    cols = build_columns(list(metrics or DEFAULT), runs, last=last, threshold=threshold)
    extra, budget_notes = budget_columns(runs, budget) if budget is not None else ([], [])
    cols += [Column(*c, partial=True) for c in extra]
    rows = [_row(g, cols) for g in groups]
    if not metrics:  # by default, drop what no run logs (expert change on a dense model, say)
        keep = [c for c in cols if c.partial or any(r.cells[c.id].n for r in rows)]
        rows = [Row(r.group, r.seeds, r.status, {c.id: r.cells[c.id] for c in keep}, r.settings) for r in rows]
        cols = keep
    settings = {"group_by": group_by, "last": last, "threshold": threshold, "budget": budget}
    unequal = unequal_compute_note(groups) if budget is None else None
    notes = _notes(runs, threshold, last) + budget_notes + ([unequal] if unequal else []) + same_gradient_notes(groups)
    if (silent := no_signal_note(runs)) is not None:
        notes.append(silent)
    if (trained := params_note([(g.name, g.runs[0].info.get("params")) for g in groups])) is not None:
        notes.append(trained)
    return Comparison(cols, rows, notes, settings, groups)


def _row(group: Group, cols: list[Column]) -> Row:
    status = Counter(r.status for r in group.runs)
    order = {s: i for i, s in enumerate(_STATUS_ORDER)}
    status = dict(sorted(status.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))
    cells = {c.id: seed_stats([c.value(r) for r in group.runs]) for c in cols}
    return Row(group.name, [r.seed for r in group.runs], status, cells, arm_settings(group.runs))


def _notes(runs: list[Run], threshold: float | None, last: int) -> list[str]:
    notes = [
        (
            f"Mean ± 95% CI half-width over seeds (t-distribution; none for a lone seed). Reward: mean "
            f"of the last {last} steps; other training columns: mean over all logged steps."
        )
    ]
    if names := reward_names(runs):
        notes.append(
            f"Named rewards (task.rewards: {', '.join(names)}): each one's mean over the rows it applies to "
            f"(reward/<name>), last {last} steps, and at the final evaluation; reward is their weighted sum."
        )
    if threshold is not None:
        notes.append(
            f"Steps/time to {threshold:g}: first step where the train reward averaged over the "
            f"last {last} steps reaches it; (k/n): seeds that did, averaged over those."
        )
    for r in runs:
        notes += final_notes(r)
    return notes


# --------------------------------------------------------------------------- rendering


def status_text(status: dict[str, int]) -> str:
    if len(status) == 1:
        return next(iter(status))
    return ", ".join(f"{n} {s}" for s, n in status.items())


def cell_text(col: Column, st: Stats, seeds: int) -> str:
    if st.n == 0:
        return "—"
    text = format(st.mean, col.fmt)
    if math.isfinite(st.ci95):
        text += f" ± {st.ci95:.2g}"
    if col.partial and st.n < seeds:
        text += f" ({st.n}/{seeds})"
    return text


def _text_rows(comp: Comparison) -> tuple[list[str], list[list[str]]]:
    header = [
        comp.settings.get("group_by", "group"),
        "seeds",
        "status",
        *(h for h, _ in SETTINGS.values()),
        *(c.label for c in comp.columns),
    ]
    rows = [
        [
            r.group,
            str(len(r.seeds)),
            status_text(r.status),
            *(r.settings.get(s, "") for s in SETTINGS),
            *(cell_text(c, r.cells[c.id], len(r.seeds)) for c in comp.columns),
        ]
        for r in comp.rows
    ]
    return header, rows


def rich_table(comp: Comparison) -> Table:
    """The comparison as a Rich table, groups side by side (one column each) so a few arms fit
    a terminal whatever the number of metrics; notes are printed below it by the caller."""
    header, rows = _text_rows(comp)
    table = Table(title="gspo compare")
    table.add_column(Text(header[0]))
    for row in rows:
        # Text, not str: labels like "KL old [nats]" must not be read as Rich markup.
        table.add_column(Text(row[0]), justify="right")
    for i, label in enumerate(header[1:], start=1):
        table.add_row(Text(label), *(Text(row[i]) for row in rows))
    return table


def render(comp: Comparison, fmt: str) -> str:
    """The comparison as text: a plain Rich table with notes, Markdown, CSV (wide) or JSON."""
    if fmt == "table":
        # Wide enough never to fold a column: a file has no terminal width to respect.
        console = Console(file=io.StringIO(), width=1000, color_system=None, force_terminal=False)
        console.print(rich_table(comp))
        text = "\n".join(line.rstrip() for line in console.file.getvalue().splitlines())
        return text + "\n" + "".join(f"{n}\n" for n in comp.notes)
    if fmt == "markdown":
        header, rows = _text_rows(comp)
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines + [""] + [f"- {n}" for n in comp.notes]) + "\n"
    if fmt == "csv":
        return _csv(comp)
    if fmt == "json":
        return json.dumps(_json(comp), indent=2) + "\n"
    raise SpecError(f"--format: unknown format {fmt!r} (known: {', '.join(FORMATS)})")


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _csv(comp: Comparison) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "group",
            "seeds",
            "status",
            *SETTINGS,
            *(f"{c.id}_{s}" for c in comp.columns for s in ("mean", "std", "ci95", "n")),
        ]
    )
    for r in comp.rows:
        cells = []
        for c in comp.columns:
            st = r.cells[c.id]
            cells += ["" if not math.isfinite(v) else repr(v) for v in (st.mean, st.std, st.ci95)] + [st.n]
        w.writerow([r.group, len(r.seeds), status_text(r.status), *(r.settings.get(s, "") for s in SETTINGS), *cells])
    return buf.getvalue()


def _json(comp: Comparison) -> dict:
    return {
        "settings": comp.settings,
        "columns": [{"id": c.id, "label": c.label, "unit": c.unit} for c in comp.columns],
        "groups": [
            {
                "group": r.group,
                "seeds": r.seeds,
                "status": r.status,
                "settings": r.settings,
                "metrics": {
                    k: {"mean": _num(s.mean), "std": _num(s.std), "ci95": _num(s.ci95), "n": s.n}
                    for k, s in r.cells.items()
                },
            }
            for r in comp.rows
        ],
        "notes": comp.notes,
    }
