"""A comparison only pairs what is the same: held-out sets with the same problems (run.json
fingerprints), arms trained on the same task; and an `equivalent` between arms that never left
their step-0 score says so."""

from __future__ import annotations

import json

from synthetic_runs import make_problem_experiment, write_run
from typer.testing import CliRunner

from gspo_cli.cli.app import app

runner = CliRunner()


def _differences(exp, *args) -> dict:
    res = runner.invoke(app, ["compare", str(exp), "--baseline", "grpo", "-f", "json", *args])
    assert res.exit_code == 0, res.output
    return {d["metric"]: d for d in json.loads(res.stdout)["differences"]}


def _fingerprint(run_dir, fp: str) -> None:
    info = json.loads((run_dir / "run.json").read_text())
    info["identity"] = {"data": {"eval": {"arith": {"source": "arith.jsonl", "fingerprint": fp}}}}
    (run_dir / "run.json").write_text(json.dumps(info))


def test_held_out_sets_with_different_problems_are_not_paired(tmp_path):
    exp = make_problem_experiment(tmp_path, arms={"grpo": 0.0, "gspo": 0.25}, seeds=(0, 1, 2))
    for d in exp.glob("*/seed*"):
        _fingerprint(d, "aaaa1111")
    assert _differences(exp, "-m", "eval_final")["eval_final:arith"]["verdict"] == "better"  # the same set
    for d in exp.glob("gspo/seed*"):
        _fingerprint(d, "bbbb2222")  # a set of the same name, other problems
    row = _differences(exp, "-m", "eval_final")["eval_final:arith"]
    assert row["verdict"] == "not resolved" and row["delta"] is None
    why = (
        "not compared: the runs' arith sets hold different problems (run.json fingerprints aaaa1111, bbbb2222); "
        "pairing them would compare problems, not arms"
    )
    assert row["method"] == why and row["resolve"] == why


def test_arms_trained_on_different_tasks_are_not_paired_on_train_reward(tmp_path):
    tasks = {"grpo": {"name": "math", "params": {"source": "synthetic"}}, "gspo": {"name": "code", "params": {}}}
    for arm, reward in (("grpo", 0.3), ("gspo", 0.6)):
        for seed in range(3):
            recs = [{"step": t, "reward/mean": reward + 0.01 * seed} for t in range(1, 6)]
            write_run(tmp_path, arm, seed, recs, task=tasks[arm])
    row = _differences(tmp_path / "exp", "-m", "reward")["reward"]
    assert row["verdict"] == "not resolved"
    assert row["method"] == (
        "not compared: the arms train on different tasks (code (synthetic) vs math (synthetic)); their training "
        "numbers differ by task"
    )


def test_an_equivalence_of_arms_that_never_left_step_0_says_neither_learned(tmp_path):
    for arm, slope in (("grpo", 0.010), ("gspo", 0.011)):
        for seed in range(4):
            score = 0.3 + slope * seed  # each run's score at the end is its score at step 0
            evals = [{"step": s, "task": "arith", "scores": {"avg@4": score}} for s in (0, 15, 30)]
            write_run(tmp_path, arm, seed, [{"step": t, "reward/mean": 0.1} for t in range(1, 31)], evals=evals)
    res = runner.invoke(
        app, ["compare", str(tmp_path / "exp"), "-b", "grpo", "-m", "eval_final", "--margin", "0.05", "-f", "json"]
    )
    doc = json.loads(res.stdout)
    (row,) = doc["differences"]
    assert row["verdict"] == "equivalent"
    note = (
        "gspo − grpo on arith: equivalent, but no run of either arm moved from its step-0 score at any evaluation: "
        "neither arm learned, so equal ends say nothing about how they learn."
    )
    assert note in doc["difference_notes"]


def test_the_reports_findings_use_the_specs_margin(tmp_path):
    """Two arms alike within 0.05 on 8 seeds: with the spec's comparison.margin 0.05 the report's
    finding is `equivalent`, as `compare` says; without a margin there is no equivalence test."""
    from gspo_cli.analysis.report.differences import finding_family
    from gspo_cli.analysis.rundata.runs import group_runs, load_runs
    from gspo_cli.analysis.tables.compare import compare_runs

    verdicts = {}
    for margin in (0.05, None):
        exp = make_problem_experiment(
            tmp_path / str(margin),
            arms={"grpo": 0.0, "gspo": 0.0},
            seeds=tuple(range(8)),
            problems=200,
            samples=8,
            comparison={"baseline": "grpo", "arm": "gspo", **({"margin": margin} if margin else {})},
            sd_seed=0.005,
            sd_problem=0.005,
        )
        groups = {g.name: g for g in group_runs(load_runs([str(exp)]))}
        cols = compare_runs([str(exp)], metrics=["eval_final"]).columns
        key = ("gspo", "grpo", "eval_final:arith")
        verdicts[margin] = finding_family(groups, [key], {}, cols)[key].diff.verdict
        cmp = _differences(exp, "-m", "eval_final")["eval_final:arith"]["verdict"]
        assert cmp == verdicts[margin]
    assert verdicts == {0.05: "equivalent", None: "not resolved"}


def test_compare_shows_the_anchor_and_the_staleness_of_each_arm(tmp_path):
    import yaml

    for arm, anchor in (("behave", "behaviour"), ("prox", "proximal")):
        d = write_run(tmp_path, arm, 0, [{"step": 1, "reward/mean": 0.1}])
        spec = yaml.safe_load((d / "spec.yaml").read_text())
        spec["arms"][0]["anchor"] = anchor
        spec["rollout"]["staleness"] = 2
        (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    res = runner.invoke(app, ["compare", str(tmp_path / "exp"), "-f", "json"])
    groups = {g["group"]: g["settings"]["algorithm"] for g in json.loads(res.stdout)["groups"]}
    assert groups == {
        "behave": "behave · clip 0.2/0.27 · staleness 2",
        "prox": "prox · clip 0.2/0.27 · anchor proximal · staleness 2",
    }
