"""Run directories a researcher broke by hand: a metrics line that is not a record, a corrupt
run.json, a non-finite score. Each gives one line or a sane number, never a traceback, a run
mislabelled as an arm, or "inf" in a report."""

from __future__ import annotations

import json
import math

import pytest
from synthetic_runs import make_experiment, write_run
from typer.testing import CliRunner

from gspo_cli.analysis.report.build import _times
from gspo_cli.analysis.report.collapse import learning_lines
from gspo_cli.analysis.rundata.runs import group_runs, load_runs
from gspo_cli.cli.app import app
from gspo_cli.jsonl import read_jsonl

runner = CliRunner()


def test_a_metrics_line_that_is_not_an_object_is_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "reward/mean": 0.5}\n[1,2,3]\nnull\n3\n{"step": 2, "reward/mean": 0.6}\n')
    assert read_jsonl(path) == [{"step": 1, "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.6}]


@pytest.mark.parametrize("line", ["[1,2,3]", "null"])
def test_compare_and_report_read_past_a_line_that_is_not_a_record(tmp_path, line):
    exp = make_experiment(tmp_path)
    with open(exp / "gspo" / "seed0" / "metrics.jsonl", "a") as f:
        f.write(line + "\n")
    with open(exp / "gspo" / "seed1" / "eval.jsonl", "a") as f:
        f.write(line + "\n")
    res = runner.invoke(app, ["compare", str(exp)])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    res = runner.invoke(app, ["report", str(exp), "-o", str(tmp_path / "R.md")])
    assert res.exit_code == 0, res.output


def test_a_corrupt_run_json_is_left_out_in_one_line_naming_it(tmp_path):
    exp = make_experiment(tmp_path)
    bad = exp / "grpo" / "seed0" / "run.json"
    bad.write_text('{"status": "completed", "arm": ')
    with pytest.warns(UserWarning) as caught:
        runs = load_runs([str(exp)])
    assert [str(w.message) for w in caught] == [f"{bad}: not valid JSON (Expecting value, line 1); run left out"]
    assert sorted({r.arm for r in runs}) == ["grpo", "gspo"]  # never an arm named after its directory
    assert sorted(r.seed for r in runs if r.arm == "grpo") == [1, 2]
    (exp / "grpo" / "seed1" / "run.json").write_text("[1, 2]")
    with pytest.warns(UserWarning, match=r"seed1/run.json: not a JSON object; run left out"):
        load_runs([str(exp)])


def test_compare_with_a_corrupt_run_json_still_finds_the_baseline(tmp_path):
    exp = make_experiment(tmp_path)
    (exp / "grpo" / "seed0" / "run.json").write_text("{not json")
    res = runner.invoke(app, ["compare", str(exp), "--baseline", "grpo"])
    assert res.exit_code == 0, res.output
    assert "no arm 'grpo'" not in res.output
    assert "grpo/seed0/run.json: not valid JSON" in res.output


def test_a_non_finite_score_is_left_out_of_the_learning_table_not_printed_as_inf(tmp_path):
    for seed, end in enumerate((0.3, 0.25, math.inf)):
        evals = [{"step": s, "task": "arith", "scores": {"avg@4": v}} for s, v in ((0, 0.2), (20, end))]
        write_run(tmp_path, "gspo", seed, [{"step": t, "reward/mean": 0.1} for t in range(1, 21)], evals=evals)
    groups = group_runs(load_runs([str(tmp_path / "exp")]))
    text = "\n".join(learning_lines(groups, "arith", "arith avg@4", window=5))
    assert "inf" not in text
    assert "| gspo | 0.200 → 0.275 | +0.075" in text and "| 2/2 |" in text
    assert "gspo: seed 2 left out (a non-finite arith avg@4 at step 0 or at the end)." in text


def test_a_non_finite_ratio_is_not_written_as_infx():
    assert _times(math.inf) == "n/a" and _times(math.nan) == "n/a"
    assert _times(250.0) == "250x" and _times(2.5) == "2.5x"


# ------------------------------------------------------------------ what a "final" score is


def _evals(*steps_scores):
    return [{"step": s, "task": "arith", "scores": {"avg@4": v}} for s, v in steps_scores]


def test_a_running_run_says_its_final_score_is_its_step_0_evaluation(tmp_path):
    from gspo_cli.analysis.tables.compare import compare_runs

    recs = [{"step": t, "reward/mean": 0.1} for t in range(1, 4)]
    write_run(tmp_path, "grpo", 0, recs, status="running", evals=_evals((0, 0.2)))
    write_run(tmp_path, "gspo", 0, recs + [{"step": 4, "reward/mean": 0.2}], evals=_evals((0, 0.2), (4, 0.3)))
    notes = compare_runs([str(tmp_path / "exp")], metrics=["eval_final"]).notes
    assert (
        "exp/grpo/seed0: running at step 3/20; its numbers are what is on disk (held-out arith 'final' is its "
        "step-0 evaluation, not a final score)." in notes
    )
    assert not [n for n in notes if n.startswith("exp/gspo/seed0")]


def test_a_completed_run_whose_eval_file_stops_early_is_noted(tmp_path):
    from gspo_cli.analysis.tables.compare import compare_runs

    recs = [{"step": t, "reward/mean": 0.1} for t in range(1, 21)]
    write_run(tmp_path, "gspo", 0, recs, evals=_evals((0, 0.2), (10, 0.3)))  # step 20's line lost
    notes = compare_runs([str(tmp_path / "exp")], metrics=["eval_final"]).notes
    assert (
        "exp/gspo/seed0: completed at step 20, but its last arith evaluation in eval.jsonl is at step 10 "
        "(a truncated file?): its final held-out score is step 10's." in notes
    )


# ------------------------------------------------------------------ files a user may have written


def test_report_keeps_a_hand_written_report_and_overwrites_its_own(tmp_path):
    exp = make_experiment(tmp_path)
    out = exp / "REPORT.md"
    out.write_text("# My notes\n\nGSPO looks better, to be checked.\n")
    res = runner.invoke(app, ["report", str(exp)])
    assert res.exit_code == 0, res.output
    kept = exp / "REPORT.edited.md"
    assert kept.read_text() == "# My notes\n\nGSPO looks better, to be checked.\n"
    assert f"{out}: written by hand or edited since gspo wrote it: your copy is kept as {kept}" in res.output
    first = out.read_text()
    assert first.startswith("# ") and "My notes" not in first
    # its own report is rewritten in place, nothing kept
    res = runner.invoke(app, ["report", str(exp)])
    assert res.exit_code == 0 and "kept" not in res.output, res.output
    assert sorted(p.name for p in exp.glob("REPORT*")) == ["REPORT.edited.md", "REPORT.md"]
    # edited after gspo wrote it: kept again, under the next free name
    out.write_text(out.read_text().replace("# ", "# Edited: ", 1))
    runner.invoke(app, ["report", str(exp)])
    assert (exp / "REPORT.edited-2.md").read_text().startswith("# Edited: ")


def test_report_describes_a_dense_builtin_model_without_experts(tmp_path):
    import yaml

    exp = make_experiment(tmp_path)
    for spec_file in exp.glob("*/seed*/spec.yaml"):
        spec = yaml.safe_load(spec_file.read_text())
        spec["model"] = {
            "name": "builtin:tiny-dense",
            "builtin": {"num_layers": 4, "hidden_size": 128, "num_experts": 8, "experts_per_token": 2},
        }
        spec_file.write_text(yaml.safe_dump(spec))
    res = runner.invoke(app, ["report", str(exp)])
    assert res.exit_code == 0, res.output
    text = (exp / "REPORT.md").read_text()
    assert "- Model: `builtin:tiny-dense`, 4 layers, hidden 128, dense (no experts)" in text
    assert "experts (top-2)" not in text


def test_list_names_a_corrupt_run_json_instead_of_a_status_of_none(tmp_path):
    exp = make_experiment(tmp_path)
    bad = exp / "grpo" / "seed0" / "run.json"
    bad.write_text("{bad")
    res = runner.invoke(app, ["list", str(exp), "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["path"]: r for r in json.loads(res.stdout)}
    assert rows[str(bad.parent)]["status"] == "unreadable run.json"
    assert f"warning: {bad}: not valid JSON (Expecting property name enclosed in double quotes, line 1)" in res.stderr
