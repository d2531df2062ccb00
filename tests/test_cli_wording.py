"""The small words of the command line: help metavars, long options, plurals, `gspo list`'s wall
time for a running run and its paths at any width."""

from __future__ import annotations

import json

from synthetic_runs import make_experiment, write_run
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.eval.sets import data_lines
from gspo_cli.runs import plural

runner = CliRunner()
COMMANDS = [
    "train",
    "check",
    "sweep",
    "eval",
    "plan",
    "export",
    "list",
    "compare",
    "plot",
    "report",
    "samples",
    "schema",
]


def test_help_shows_conventional_metavars_never_type_labels():
    for cmd in [[], *([c] for c in COMMANDS)]:
        res = runner.invoke(app, [*cmd, "--help"], terminal_width=120)
        assert res.exit_code == 0, (cmd, res.output)
        # Typer 0.29 put <bool> beside every flag and <list[str]> beside repeated options.
        assert "<bool>" not in res.output and "<list[" not in res.output and "<int>" not in res.output, cmd
    out = runner.invoke(app, ["compare", "--help"], terminal_width=120).output
    assert any("--last" in line and "INTEGER" in line for line in out.splitlines())
    assert any("--metrics" in line and "TEXT" in line for line in out.splitlines())


def test_samples_limit_has_a_long_option():
    out = runner.invoke(app, ["samples", "--help"], terminal_width=120).output
    assert any("--limit" in line and "-n" in line for line in out.splitlines())


def test_report_help_counts_five_findings():
    out = " ".join(runner.invoke(app, ["report", "--help"], terminal_width=120).output.split())
    assert "five findings" in out and "four" not in out


def test_plurals_in_the_data_lines():
    assert (plural(1, "problem"), plural(2, "problem"), plural(1, "process", "processes")) == (
        "1 problem",
        "2 problems",
        "1 process",
    )
    sets = {
        "aime24": {"task": "math", "problems": 30, "samples": 4},
        "one": {"task": "code", "problems": 1, "samples": 1},
    }
    none = data_lines(
        {"train_source": "train.jsonl", "train_problems": 1, "excluded_from_training": 0, "eval_sets": sets}
    )
    assert none == [
        "training data: train.jsonl (1 problem); no evaluation problem among them",  # was "0 problems excluded"
        "evaluation sets: aime24 (math, 30 problems x 4), one (code, 1 problem x 1)",
    ]
    some = data_lines(
        {"train_source": "t.jsonl", "train_problems": 90, "excluded_from_training": 12, "eval_sets": sets}
    )
    # The cold-start line's wording: "12 evaluation problems excluded".
    assert some[0] == "training data: t.jsonl (90 problems); 12 evaluation problems excluded"


def test_list_shows_a_running_runs_time_so_far(tmp_path):
    exp = make_experiment(tmp_path)
    res = runner.invoke(app, ["list", str(exp), "--json"])
    rows = {r["path"].split("exp/")[1]: r for r in json.loads(res.stdout)}
    assert rows["grpo/seed1"]["status"] == "running" and rows["grpo/seed1"]["elapsed_s"] == 24.0
    res = runner.invoke(app, ["list", str(exp)], terminal_width=120)
    line = next(x for x in res.output.splitlines() if "│ running" in x)
    assert "24 so far" in line  # was blank: run.json has no wall_s until the run ends


def test_list_never_cuts_a_long_path(tmp_path):
    deep = tmp_path / ("a_rather_long_folder_name_for_results_" * 4) / ("another_long_level_" * 4)
    write_run(deep, "grpo", 0, [{"step": 1, "reward/mean": 0.5, "time/elapsed_s": 3.0}])
    run = deep / "exp" / "grpo" / "seed0"
    res = runner.invoke(app, ["list", str(deep)], terminal_width=120)
    assert res.exit_code == 0, res.output
    assert "…" not in res.output and "..." not in res.output
    text = "".join(line.split("│")[1].strip() for line in res.output.splitlines() if line.count("│") > 2)
    assert str(run) in text


def test_an_evaluation_line_of_one_problem():
    from gspo_cli.train.reporting import format_eval

    line = format_eval({"set": "lcb", "task": "code", "step": 0, "n": 1, "scores": {"avg@1": 0.0}})
    assert line == "eval lcb at step 0 (1 problem): avg@1 0.000"
