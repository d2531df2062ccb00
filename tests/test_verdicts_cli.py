"""`gspo compare` on synthetic run directories: scripts keep their tables, families by role, nothing
dropped (thresholds censored, unequal ends matched), collapses counted and warned about."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
from synthetic_runs import make_experiment, make_problem_experiment, write_run
from typer.testing import CliRunner

from gspo_cli.analysis.report.differences import finding_family
from gspo_cli.analysis.rundata.runs import group_runs, load_runs
from gspo_cli.analysis.stats.survival import logrank
from gspo_cli.analysis.tables.compare import compare_runs
from gspo_cli.analysis.tables.differences import COLUMNS
from gspo_cli.analysis.tables.estimates import estimate
from gspo_cli.cli.app import app

runner = CliRunner()
SECTION = {"baseline": "grpo", "arm": "gspo", "metric": None, "margin": 0.5}


def _out(path, *args) -> str:
    res = runner.invoke(app, ["compare", str(path), *args])
    assert res.exit_code == 0, res.output
    return res.stdout


def _rows(path, *args) -> dict[tuple[str, str], dict]:
    doc = json.loads(_out(path, "-f", "json", *args))
    return {(d["arm"], d["metric"]): d for d in doc["differences"]}


@pytest.fixture(scope="module")
def spec_runs(tmp_path_factory):
    """A quickstart-like experiment whose spec has a comparison section (gspo against grpo)."""
    return make_problem_experiment(
        tmp_path_factory.mktemp("s"), arms={"grpo": 0.0, "gspo": 0.25, "cispo": 0.0}, comparison=SECTION
    )


def test_csv_without_baseline_is_the_arms_table_whatever_the_spec_says(spec_runs, tmp_path):
    plain = make_problem_experiment(tmp_path, arms={"grpo": 0.0, "gspo": 0.25, "cispo": 0.0})
    arms = _out(spec_runs, "-f", "csv")
    assert arms.splitlines()[0].startswith("group,seeds,status,") and arms == _out(plain, "-f", "csv")
    assert _out(spec_runs, "-f", "csv", "--baseline", "none") == arms
    for asked in (["--differences"], ["--baseline", "grpo"]):
        header = next(csv.reader(io.StringIO(_out(spec_runs, "-f", "csv", *asked))))
        assert header[: len(COLUMNS)] == list(COLUMNS)
    doc = json.loads(_out(spec_runs, "-f", "json"))
    assert doc["groups"] and doc["differences"]  # json keeps the arms and adds the differences
    assert "differences" not in json.loads(_out(spec_runs, "-f", "json", "--baseline", "none"))
    assert "differences from the baseline" not in _out(spec_runs, "--baseline", "none")
    res = runner.invoke(app, ["compare", str(plain), "--differences"])
    assert res.exit_code == 2 and "--differences: no baseline" in res.stderr


def test_the_spec_comparison_is_the_primary_at_full_alpha_and_report_agrees(spec_runs):
    rows = _rows(spec_runs)
    primary = rows[("gspo", "eval_final:arith")]
    assert primary["method"].startswith("seeds t + problem bootstrap")
    # 3 seeds: one seed collapsing to half gspo's score (0.385 below) would undo the verdict, and it says so
    assert primary["warnings"] == [
        "one collapsed seed (a difference of 0.385 the other way) would reverse this verdict"
    ]
    assert (primary["family"], primary["family_size"], primary["verdict"]) == ("primary", 1, "better")
    others = [d for k, d in rows.items() if k != ("gspo", "eval_final:arith")]
    assert {d["family"] for d in others} == {"secondary"} and {d["family_size"] for d in others} == {3}
    # report: the same difference as its primary gets the same p; in one family of 2 it would not
    groups = {g.name: g for g in group_runs(load_runs([str(spec_runs)]), "arm")}
    cols = compare_runs([str(spec_runs)]).columns
    keys = [("gspo", "grpo", "eval_final:arith"), ("gspo", "grpo", "reward")]
    fam = finding_family(groups, keys, {}, cols, primary=keys[0])
    assert fam[keys[0]].diff.p_adjusted == pytest.approx(primary["p_adjusted"], rel=1e-12)
    assert fam[keys[0]].diff.family == "primary" and fam[keys[1]].diff.family == "secondary"
    notes = json.loads(_out(spec_runs, "-f", "json", "-m", "eval_final,reward,clip"))["difference_notes"]
    assert "Families: primary: 1 row (tested at the full alpha); secondary: 3 rows; diagnostics: 2 rows, " in notes[0]
    # the per-seed differences the checks read are the seeds' means over problems: they average to delta
    col = next(c for c in cols if c.id == "eval_final:arith")
    est = estimate(groups["gspo"], groups["grpo"], col)
    assert len(est.diffs) == 3 and sum(est.diffs) / 3 == pytest.approx(est.delta, rel=1e-12)
    pooled = finding_family(groups, keys, {}, cols)
    assert pooled[keys[0]].diff.p_adjusted > primary["p_adjusted"]
    # the margin is the default smallest effect of interest; --effect overrides it
    assert {d["effect"] for d in others} == {0.5}
    assert {d["effect"] for d in _rows(spec_runs, "--effect", "0.05").values() if d["effect"]} == {0.05}


def test_diagnostics_are_described_and_do_not_change_the_family(tmp_path):
    exp = make_experiment(tmp_path)
    alone = _rows(exp, "--baseline", "grpo", "-m", "reward")[("gspo", "reward")]
    rows = _rows(exp, "--baseline", "grpo", "-m", "reward,clip,length,step_time")
    assert rows[("gspo", "reward")]["p_adjusted"] == alone["p_adjusted"]
    for m in ("clip", "length", "step_time"):
        d = rows[("gspo", m)]
        assert (d["verdict"], d["family"], d["family_size"], d["p_adjusted"]) == ("descriptive", "diagnostics", 0, None)
        assert d["ci_low"] is not None


def test_collapses_are_counted_and_a_fragile_better_is_warned(tmp_path):
    """gspo - grpo train reward per seed: (0.5 - 0.2, 0.6 - 0.3, 0.7 - 0.45) = (0.3, 0.3, 0.25):
    `better` (p 0.0069). A collapse halves a score: 0.5 x 0.6 (gspo's mean) = 0.3; one gspo seed
    collapsing, (-0.3, 0.3, 0.25), has mean 0.083 and sd 0.33: not significant, so the row warns."""
    exp = make_experiment(tmp_path)
    doc = json.loads(_out(exp, "-f", "json", "--baseline", "grpo", "-m", "reward,eval_final"))
    row = next(d for d in doc["differences"] if d["metric"] == "reward")
    assert row["verdict"] == "better"
    assert row["warnings"] == ["one collapsed seed (a difference of 0.3 the other way) would reverse this verdict"]
    # gspo's held-out score 0.1 -> 0.3+0.1k -> 0.2+0.1k never falls below half of 0.1; 1 - 0.05^(1/3) = 63%
    assert (
        "Collapses (held-out score below 0.5 x its step-0 score): gspo: 0 of 3 seeds collapsed: rate below 63% at 95%."
        in doc["difference_notes"]
    )
    text = _out(exp, "--baseline", "grpo", "-m", "reward", "-f", "markdown")
    assert "better (warning: see notes)" in text and "would reverse this verdict" in text


def test_a_threshold_never_reached_is_censored_not_dropped(tmp_path):
    """gspo reaches a 10-step reward mean of 0.5 at step 15 in every seed; grpo (0.2, 0.3, 0.45)
    never does: censored at its last steps 20, 12, 20. Log-rank at t = 15: 3 gspo and 2 grpo at
    risk, 3 events: E = 3 x 3/5 = 1.8, O - E = 1.2, V = 3 (3/5)(2/5)(5-3)/(5-1) = 0.36, z = 2."""
    exp = make_experiment(tmp_path)
    rows = _rows(exp, "--baseline", "grpo", "--threshold", "0.5", "-m", "threshold")
    d = rows[("gspo", "threshold_step")]
    assert d["delta"] == pytest.approx(1.2) and d["ci_high"] - d["delta"] == pytest.approx(1.959964 * 0.6)
    assert d["method"] == "log-rank of reaching it, 3 vs 3 runs; 3 never reached it: censored at their last step"
    ref = logrank([15, 15, 15], [True] * 3, [20, 12, 20], [False] * 3)
    assert ref.observed - ref.expected == pytest.approx(1.2) and ref.variance == pytest.approx(0.36)
    assert d["family_size"] == 2 and d["p_adjusted"] == pytest.approx(min(1, 2 * ref.p_value))


def _eval(step: int, v: float) -> dict:
    return {"step": step, "task": "arith", "n": 8, "samples": 4, "scores": {"avg@4": v}}


def test_runs_that_end_at_different_steps_are_compared_at_a_matched_step(tmp_path):
    """b's seed 2 diverged after its step-10 evaluation; a's final (step 20) would be compared with
    b's step 10. At the matched step 10: a (0.40, 0.42, 0.47) - b (0.30, 0.33, 0.35) = (0.10, 0.09, 0.12)."""
    a10, a20, b10 = (0.40, 0.42, 0.47), (0.6, 0.7, 0.8), (0.30, 0.33, 0.35)
    for k in range(3):
        rec = [{"step": t, "reward/mean": 0.1} for t in range(1, 21)]
        write_run(tmp_path, "a", k, rec, evals=[_eval(0, 0.2), _eval(10, a10[k]), _eval(20, a20[k])])
        ends = [_eval(0, 0.2), _eval(10, b10[k])] + ([_eval(20, 0.5)] if k < 2 else [])
        status = "diverged" if k == 2 else "completed"
        write_run(tmp_path, "b", k, rec[: 20 if k < 2 else 12], evals=ends, status=status)
    d = _rows(tmp_path / "exp", "--baseline", "b", "-m", "eval_final")[("a", "eval_final:arith")]
    assert d["delta"] == pytest.approx(math.fsum((0.10, 0.09, 0.12)) / 3)
    assert d["method"] == (
        "paired t, 3 seeds at matched step 10 (runs end at different steps: exp/b/seed2 at 10) (no problem records)"
    )


def test_a_per_run_metric_of_a_diverged_run_says_it_is_not_matched(tmp_path):
    """The same runs: b's seed 2 diverged at step 12; its train reward is from its own last steps."""
    for k in range(3):
        rec = [{"step": t, "reward/mean": 0.1 * (k + 1)} for t in range(1, 21)]
        write_run(tmp_path, "a", k, rec)
        write_run(tmp_path, "b", k, rec[: 20 if k < 2 else 12], status="diverged" if k == 2 else "completed")
    d = _rows(tmp_path / "exp", "--baseline", "b", "-m", "reward")[("a", "reward")]
    assert d["method"] == (
        "paired t, 3 seeds (exp/b/seed2 at 12 diverged before step 20: "
        "its value is from its own last steps, not matched)"
    )
