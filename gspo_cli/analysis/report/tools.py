"""`gspo report`'s tool section, for runs with `task.environment` (multi-turn rollouts): per
arm, what the rollouts did with the tool (turns, calls, errors, time-outs per response, the
environment's share of the response tokens), and what `gspo eval` measured with the tool and
without it (`--no-tools`), where the run directories hold such evaluations. Runs that log no
`tools/*` metric get no section. Reads files only, like the rest of the report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from gspo_cli.analysis.rundata.runs import Run, group_runs
from gspo_cli.analysis.stats.seeds import seed_stats
from gspo_cli.analysis.tables.compare import TOOL_COLUMNS, Comparison, cell_text, compare_runs

SUMMARY = "eval_summary.json"  # gspo eval's file (gspo_cli/eval/run.py SUMMARY_FILE)


def has_tools(runs: list[Run]) -> bool:
    return any(c.startswith("tools/") for r in runs for c in r.metrics.columns)


def tool_lines(paths: list[str], runs: list[Run], last: int) -> list[str]:
    """The report's "Tools" section as Markdown lines; [] when no run logs tool metrics."""
    if not has_tools(runs):
        return []
    envs = sorted({str((r.spec.get("task") or {}).get("environment")) for r in runs})
    comp = compare_runs(paths, metrics=["reward", *TOOL_COLUMNS], last=last)
    out = [
        "## Tools",
        "",
        f"Multi-turn rollouts with `task.environment: {', '.join(envs)}`. Per response (mean ± 95% CI "
        "over seeds of each run's mean over its steps): model turns, tool calls, tool errors (the "
        "program raised, or hit a limit), tool time-outs, and the environment's share of the response "
        "tokens (tool output the model reads but is never trained on).",
        "",
    ]
    out += _table(comp)
    return out + [""] + eval_lines(runs)


def _table(comp: Comparison) -> list[str]:
    header = ["arm", "seeds", *(c.label for c in comp.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in comp.rows:
        cells = [cell_text(c, r.cells[c.id], len(r.seeds)) for c in comp.columns]
        lines.append("| " + " | ".join([r.group, str(len(r.seeds)), *cells]) + " |")
    return lines


def eval_summaries(run: Run) -> list[dict]:
    """The `gspo eval` summaries in a run directory and its direct sub-folders (e.g. `-o
    RUN/eval_no_tools`), oldest first; unreadable ones are left out."""
    found = []
    for p in [run.path / SUMMARY, *sorted(run.path.glob(f"*/{SUMMARY}"))]:
        try:
            found.append(json.loads(Path(p).read_text()))
        except (OSError, ValueError):
            continue
    return sorted((s for s in found if isinstance(s, dict) and s.get("scores")), key=lambda s: s.get("created_at", ""))


def _first_score(summary: dict) -> tuple[str, float]:
    key, value = next(iter(summary["scores"].items()))
    return key, float(value) if value is not None else math.nan


def eval_lines(runs: list[Run]) -> list[str]:
    """With the tool vs without it, per arm, from the runs' gspo eval summaries (the latest of
    each kind per run); [] when no run has one."""
    rows, keys = [], set()
    for g in group_runs(runs, "arm"):
        per = {"with": [], "without": [], "calls_with": [], "calls_without": []}
        for run in g.runs:
            latest = {}
            for s in eval_summaries(run):
                latest["with" if s.get("tools") else "without"] = s
            for kind, s in latest.items():
                key, value = _first_score(s)
                keys.add(key)
                per[kind].append(value)
                per[f"calls_{kind}"].append(float((s.get("tool_use") or {}).get("tool_calls_mean", math.nan)))
            ev = run.eval_scores.dropna(subset=["score"]).sort_values("step")
            if "with" not in latest and "without" in latest and len(ev):  # training's last evaluation
                keys.add(str(ev.key.iloc[-1]))
                per["with"].append(float(ev.score.iloc[-1]))
                per["in_run"] = per.get("in_run", 0) + 1
        if per["with"] or per["without"]:
            rows.append((g.name, per))
    if not rows:
        return []
    key = " / ".join(sorted(keys))
    out = [
        "### With and without the tool (`gspo eval`)",
        "",
        f"Held-out {key} of each run's last checkpoint, sampled with the run's environment and turn "
        "limits (`gspo eval RUN`) and in one turn without it (`gspo eval RUN --no-tools`); mean ± 95% CI "
        "over the seeds evaluated (n). A run evaluated only without the tool has its final in-run "
        "evaluation (the same held-out problems and samples, with the tool, as training samples) in "
        f"the first column: {sum(p.get('in_run', 0) for _, p in rows)} run(s) here.",
        "",
        f"| arm | with the tool: {key} | tool calls per response | without the tool: {key} | tool calls |",
        "|---|---|---|---|---|",
    ]
    for name, per in rows:
        out.append(
            f"| {name} | {_cell(per['with'])} | {_cell(per['calls_with'])} | {_cell(per['without'])} | "
            f"{_cell(per['calls_without'])} |"
        )
    return out + [""]


def _cell(vals: list[float]) -> str:
    v = [x for x in vals if math.isfinite(x)]
    if not v:
        return "—"
    st = seed_stats(v)
    ci = f" ± {st.ci95:.2g}" if math.isfinite(st.ci95) else ""
    return f"{float(np.mean(v)):.3f}{ci} (n={len(v)})"
