"""`gspo report`'s "## Plan" section checks from git that a study's PLAN.md came before its runs."""

from __future__ import annotations

import json
import os
import subprocess

from typer.testing import CliRunner

from gspo_cli.analysis.report.plan import plan_commit
from gspo_cli.cli.app import app
from tests.synthetic_runs import write_run

runner = CliRunner()


def _git(repo, *args, date="2026-12-07T10:00:00+00:00"):
    env = {**os.environ, "GIT_COMMITTER_DATE": date, "GIT_AUTHOR_DATE": date}
    env |= {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def _study(tmp_path, starts: list[str], *, commit_runs_code: bool = True):
    """tmp_path is a git repo; exp/PLAN.md committed at 10:00; one run per start time, recording
    the commit after the plan (or, commit_runs_code False, the commit before it)."""
    _git(tmp_path, "init", "-q")
    (tmp_path / "README").write_text("x")
    _git(tmp_path, "add", "README")
    _git(tmp_path, "commit", "-qm", "before", date="2026-12-07T09:00:00+00:00")
    before = _git(tmp_path, "rev-parse", "HEAD").strip()
    for k, start in enumerate(starts):
        recs = [{"step": t, "reward/mean": 0.1 * k, "time/elapsed_s": float(t)} for t in range(1, 4)]
        d = write_run(tmp_path, "grpo", k, recs)
        info = json.loads((d / "run.json").read_text())
        (d / "run.json").write_text(json.dumps({**info, "started_at": start, "git_commit": "PENDING"}))
    (tmp_path / "exp" / "PLAN.md").write_text("# Plan\n")
    _git(tmp_path, "add", "exp/PLAN.md")
    _git(tmp_path, "commit", "-qm", "plan")
    sha = _git(tmp_path, "rev-parse", "HEAD").strip()
    for f in (tmp_path / "exp").glob("*/seed*/run.json"):
        f.write_text(f.read_text().replace("PENDING", sha if commit_runs_code else before))
    return tmp_path / "exp", sha


def test_runs_after_the_plan_pass(tmp_path):
    exp, sha = _study(tmp_path, ["2026-12-07T10:05:00+00:00", "2026-12-07T11:00:00+00:00"])
    assert plan_commit(exp / "PLAN.md")[0] == sha
    res = runner.invoke(app, ["report", str(exp)])
    assert res.exit_code == 0, res.output
    section = (exp / "REPORT.md").read_text().split("## Plan")[1].split("## Setup")[0]
    assert f"Committed in `{sha[:10]}` on 2026-12-07T10:00:00+00:00." in section
    assert "Every one of the 2 runs started after that commit (the first started 2026-12-07T10:05:00+00:00)" in section


def test_a_run_started_before_the_plan_is_named(tmp_path):
    exp, _ = _study(tmp_path, ["2026-12-07T09:30:00+00:00", "2026-12-07T11:00:00+00:00"], commit_runs_code=False)
    assert runner.invoke(app, ["report", str(exp)]).exit_code == 0
    section = (exp / "REPORT.md").read_text().split("## Plan")[1].split("## Setup")[0]
    assert "Started before the plan was committed (not pre-registered): grpo/seed0." in section
    assert "Trained from code that does not contain the plan's commit: grpo/seed0, grpo/seed1." in section
    assert "Every one of" not in section


def test_an_uncommitted_plan_cannot_be_checked(tmp_path):
    recs = [{"step": t, "reward/mean": 0.1, "time/elapsed_s": float(t)} for t in range(1, 4)]
    write_run(tmp_path, "grpo", 0, recs)
    (tmp_path / "exp" / "PLAN.md").write_text("# Plan\n")
    assert runner.invoke(app, ["report", str(tmp_path / "exp")]).exit_code == 0
    assert "PLAN.md is not in a git commit here" in (tmp_path / "exp" / "REPORT.md").read_text()


def test_no_plan_no_section(tmp_path):
    recs = [{"step": t, "reward/mean": 0.1, "time/elapsed_s": float(t)} for t in range(1, 4)]
    write_run(tmp_path, "grpo", 0, recs)
    assert runner.invoke(app, ["report", str(tmp_path / "exp")]).exit_code == 0
    assert "## Plan" not in (tmp_path / "exp" / "REPORT.md").read_text()
