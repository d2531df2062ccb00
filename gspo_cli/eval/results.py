"""What `gspo eval` writes and shows: the summary of the scores (`summary_of`), where results go
(`default_out_dir`), eval_problems.jsonl and eval_summary.json (`write_results`), and the table
(`render`). Imports neither torch nor transformers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gspo_cli.eval.scores import ProblemResult, sample_counts, summarize
from gspo_cli.eval.targets import Target
from gspo_cli.runs import append_jsonl, now_iso, plural, write_json_atomic
from gspo_cli.tasks import Task

SUMMARY_FILE = "eval_summary.json"
PROBLEMS_FILE = "eval_problems.jsonl"


def summary_of(task: Task, results: list[ProblemResult], info: dict[str, Any], seconds: float) -> dict[str, Any]:
    """eval_summary.json's content: the task, the scores of `results`, `info` (what was
    evaluated), when and how long it took."""
    scores = summarize(results, judged=getattr(task, "judged", True))
    return {
        "task": task.name,
        "fingerprint": task.fingerprint(),
        "problems": len(results),
        "samples": max(len(r.completions) for r in results),
        **sample_counts(results),
        "scores": scores,
        "rating": scores.get("rating"),
        **info,
        "created_at": now_iso(),
        "time_s": round(seconds, 3),
    }


def default_out_dir(target: Target | None, completions: Path | None) -> Path:
    """The run directory evaluated, else results/eval/<completions file's stem or model>: never
    the folder a completions file (or a dataset) sits in, which is the user's data."""
    if target is not None and target.run_dir is not None:
        return target.run_dir
    name = completions.stem if completions is not None else target.source
    return Path("results") / "eval" / re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")


def write_results(out_dir: Path, results: list[ProblemResult], summary: dict[str, Any]) -> Path:
    """eval_problems.jsonl (replaced, one line per problem) and eval_summary.json; returns the summary path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    problems_file = out_dir / PROBLEMS_FILE
    tmp = out_dir / f".{PROBLEMS_FILE}.tmp"
    tmp.unlink(missing_ok=True)
    for r in results:
        append_jsonl(tmp, r.record())
    tmp.replace(problems_file)
    write_json_atomic(out_dir / SUMMARY_FILE, summary)
    return out_dir / SUMMARY_FILE


def render(summary: dict[str, Any], console) -> None:
    """The scores as a Rich table."""
    from rich.table import Table

    what = summary.get("completions_file") or summary.get("model")
    if summary.get("checkpoint"):
        what = f"{summary.get('run_dir') or what} @ {summary['checkpoint']}"
    per = summary.get("samples_per_problem") or {str(summary["samples"]): summary["problems"]}
    samples = (
        plural(summary["samples"], "sample")
        if len(per) == 1
        else "uneven samples (" + ", ".join(f"{c} with {n}" for n, c in per.items()) + ")"
    )
    # Headed by the evaluation set (its task in brackets): two sets of one task stay apart.
    head = f"{summary['set']} ({summary['task']})" if summary.get("set") else summary["task"]
    console.print(
        f"{head}: {plural(summary['problems'], 'problem')} x {samples}, {what}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    entered = summary.get("pass_k_problems") or {}
    table = Table()
    table.add_column("score")
    table.add_column("value", justify="right")
    table.add_column("problems", justify="right")
    for key, value in summary["scores"].items():
        table.add_row(
            key, f"{value:.1f}" if key == "rating" else f"{value:.4f}", str(entered.get(key, summary["problems"]))
        )
    console.print(table)
