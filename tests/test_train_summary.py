"""The end of a training run: the no-signal warning (the plot's own test, gspo_cli.metrics.no_signal)
and a summary whose first and last evaluation scores come from one named evaluation set."""

from __future__ import annotations

import copy
import io
import json
from types import SimpleNamespace

import pytest
from helpers import TINY

from gspo_cli.cli.progress import render_summary
from gspo_cli.runs import RunDir
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.train.loop import train_experiment
from gspo_cli.train.reporting import PlainReporter


@pytest.mark.slow
def test_a_run_without_signal_says_so_and_its_summary_keeps_to_one_set(tmp_path, capsys):
    for name in ("seta", "setb"):
        rows = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = copy.deepcopy(TINY)
    raw["model"]["cold_start"]["steps"] = 0  # an untrained model answers nothing right
    raw["task"]["params"]["format_weight"] = 0.0  # so every reward is 0: no group has signal
    raw["task"]["eval_sets"] = [
        {"name": "seta", "task": "math", "params": {"source": str(tmp_path / "seta.jsonl")}, "samples": 1},
        {"name": "setb", "task": "math", "params": {"source": str(tmp_path / "setb.jsonl")}, "samples": 2},
    ]
    raw["rollout"]["max_new_tokens"] = 2
    raw["train"] = {"steps": 2, "eval_every": 2}
    raw["arms"] = [raw["arms"][2]]
    raw["output_dir"] = str(tmp_path / "out")
    buf = io.StringIO()
    (result,) = train_experiment(spec_from_dict(raw), reporter=PlainReporter(stream=buf))
    lines = buf.getvalue().splitlines()
    assert lines[-1] == (
        "[gspo/seed0] warning: no learning signal: every group's rewards were equal at every step "
        "(reward/zero_var_group_frac 1), so every advantage was 0 and nothing was learned from the rewards"
    )
    evals = RunDir(tmp_path / "out/e2e/gspo/seed0").evals()
    assert [(e["set"], e["step"]) for e in evals] == [("seta", 0), ("setb", 0), ("seta", 2), ("setb", 2)]
    s = result.summary
    assert s["no_signal"] is True and s["eval_set"] == "seta"
    # Before: first = seta at step 0, last = setb at step 2 (avg@2), two sets in one column.
    assert s["eval_first"] == evals[0]["scores"] and s["eval_last"] == evals[2]["scores"]
    assert list(s["eval_last"])[0] == "avg@1"
    render_summary([result])
    out = capsys.readouterr().out
    assert "seta avg@1 first" in out and "seta avg@1 last" in out


def test_the_summary_names_the_set_in_each_cell_when_runs_differ(capsys):
    runs = [
        SimpleNamespace(arm=a, seed=0, status="completed", path=f"/r/{a}", summary=s)
        for a, s in (
            ("x", {"eval_set": "aime", "eval_first": {"avg@4": 0.1}, "eval_last": {"avg@4": 0.2}}),
            ("y", {"eval_set": "lcb", "eval_first": {"avg@4": 0.3}, "eval_last": {"avg@4": 0.4}}),
        )
    ]
    render_summary(runs)
    out = capsys.readouterr().out
    assert "eval first" in out and "aime avg@4 0.100" in out and "lcb avg@4 0.400" in out


def test_the_summary_shows_a_failed_runs_step_rewards_and_reason(tmp_path, capsys):
    """As `gspo list` does: the step it reached and its rewards from its run directory, and the
    one-line reason below the table (with --quiet the only place it is said)."""
    run = tmp_path / "e2e/gspo/seed0"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": "failed", "step": 2, "total_steps": 5}))
    recs = [{"step": t, "reward/mean": r, "time/elapsed_s": 1.5 * t} for t, r in ((1, 0.25), (2, 0.5))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in recs))
    error = "task.environment: step() did not return within 2 s (task.environment_timeout_s)"
    done = {"steps": 5, "reward_first": 0.1, "reward_last": 0.9, "train_s": 7.0}
    runs = [
        SimpleNamespace(arm="gspo", seed=0, status="failed", path=str(run), summary={"error": error}),
        SimpleNamespace(arm="gspo", seed=1, status="completed", path=str(tmp_path / "s1"), summary=done),
    ]
    render_summary(runs)
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if "failed" in ln and "│" in ln)
    assert [c.strip() for c in row.split("│")[1:8]] == ["gspo", "0", "failed", "2/5", "0.25", "0.5", ""]
    assert "│ 3.0 " in row
    done_row = next(ln for ln in out.splitlines() if "completed" in ln)
    assert [c.strip() for c in done_row.split("│")[3:7]] == ["completed", "5/5", "0.1", "0.9"]
    assert out.splitlines()[-1] == f"gspo/seed0 failed: {error}"
