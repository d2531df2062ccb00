"""The report's "## Plan" section: whether a study's plan was fixed before its runs.

A pre-registered study keeps `PLAN.md` beside its report, committed (with its spec) before any run.
The section checks that from git and the runs' own records: the commit that first added PLAN.md
must be older than every run's `started_at` and an ancestor of every run's `git_commit` (the runs
trained from code that contained the plan). Runs that fail either check are named; without git,
or with PLAN.md never committed, the section says the date cannot be checked.
"""

from __future__ import annotations

import subprocess
from datetime import datetime
from pathlib import Path

from gspo_cli.analysis.rundata.runs import Run


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None


def plan_commit(plan: Path) -> tuple[str, datetime] | None:
    """(hash, committer date) of the commit that first added `plan`; None outside git or uncommitted."""
    res = _git(plan.parent, "log", "--diff-filter=A", "--format=%H %cI", "--", plan.name)
    lines = res.stdout.split() if res is not None and res.returncode == 0 else []
    if len(lines) < 2:
        return None
    return lines[-2], datetime.fromisoformat(lines[-1])  # the oldest "add" is listed last


def _started(run: Run) -> datetime | None:
    try:
        return datetime.fromisoformat(str(run.info["started_at"]))
    except (KeyError, TypeError, ValueError):
        return None


def plan_lines(report_dir: Path, runs: list[Run]) -> list[str]:
    """The "## Plan" section when `report_dir` holds PLAN.md, else []."""
    plan = report_dir / "PLAN.md"
    if not plan.is_file():
        return []
    head = ["## Plan", "", "The study's plan: [`PLAN.md`](PLAN.md)."]
    found = plan_commit(plan)
    if found is None:
        return [*head, "", "PLAN.md is not in a git commit here: that it came before the runs cannot be checked.", ""]
    sha, when = found
    early, outside, unknown = [], [], []
    for r in runs:
        name = f"{r.arm}/seed{r.seed}"
        start, code = _started(r), r.info.get("git_commit")
        if start is None or not code:
            unknown.append(name)
            continue
        if start < when:
            early.append(name)
        res = _git(report_dir, "merge-base", "--is-ancestor", sha, str(code))
        if res is None or res.returncode != 0:
            outside.append(name)
    firsts = sorted(s for r in runs if (s := _started(r)) is not None)
    lines = [*head, "", f"Committed in `{sha[:10]}` on {when.isoformat()}."]
    if not early and not outside and not unknown:
        first = f" (the first started {firsts[0].isoformat()})" if firsts else ""
        lines.append(
            f"Every one of the {len(runs)} runs started after that commit{first} and trained from code "
            "that contains it."
        )
    if early:
        lines.append(f"Started before the plan was committed (not pre-registered): {', '.join(early)}.")
    if outside:
        lines.append(f"Trained from code that does not contain the plan's commit: {', '.join(outside)}.")
    if unknown:
        lines.append(f"No start time or code commit recorded, so not checked: {', '.join(unknown)}.")
    return [*lines, ""]


__all__ = ["plan_commit", "plan_lines"]
