"""`gspo tune`: its refusals (overlapping validation/test sets, unequal budgets, existing runs), the
selection rule on hand-written run directories, grid positions, and the planned runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gspo_cli.analysis.report.tune import Point, last_score, position_notes, select
from gspo_cli.cli.app import app
from gspo_cli.errors import RunError, SpecError
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.spec.tune import grid_position
from gspo_cli.train import tune as tn

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _spec(tmp_path: Path, **edits) -> Path:
    raw = yaml.safe_load((ROOT / "experiments" / "tune_clip.yaml").read_text())
    raw["output_dir"] = str(tmp_path / "results")
    for key, value in edits.items():
        node, *path = key.split("/")
        target = raw
        for part in [node, *path][:-1]:
            target = target[int(part)] if isinstance(target, list) else target[part]
        last = [node, *path][-1]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    out = tmp_path / "tune.yaml"
    out.write_text(yaml.safe_dump(raw))
    return out


def _one_line_error(result) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_dry_run_lists_equal_budgets_and_every_tuning_run(tmp_path):
    res = runner.invoke(app, ["tune", str(_spec(tmp_path)), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "grpo: 3 settings x 2 seed(s) x 30 steps per run = 180 steps of tuning" in res.output
    assert "gspo: 3 settings x 2 seed(s) x 30 steps per run = 180 steps of tuning" in res.output
    assert "12 tuning run(s) planned, then 3 final run(s) per arm" in res.output
    assert "gspo,clip_high=0.0008/seed101" in res.output


def test_overlapping_validation_and_test_sets_are_refused_in_one_line(tmp_path):
    # the test slice starts 32 problems into the validation slice's 64: 32 shared
    line = _one_line_error(
        runner.invoke(app, ["tune", str(_spec(tmp_path, **{"task/eval_sets/1/skip": 32})), "--dry-run"])
    )
    assert "the selection set val and the test set test share 32 of 128 problems" in line


def test_the_same_set_for_selection_and_test_is_refused(tmp_path):
    line = _one_line_error(runner.invoke(app, ["tune", str(_spec(tmp_path, **{"tune/test_set": "val"})), "--dry-run"]))
    assert "test_set: val is also the selection set" in line


def test_unequal_budgets_are_refused_without_unequal(tmp_path):
    spec = _spec(tmp_path, **{"tune/grids/gspo": {"arm.clip_high": [2e-4, 4e-4, 8e-4, 1.6e-3]}})
    line = _one_line_error(runner.invoke(app, ["tune", str(spec), "--dry-run"]))
    assert "unequal budgets" in line and "grpo 3 settings (180 steps), gspo 4 settings (240 steps)" in line
    assert "--unequal" in line
    res = runner.invoke(app, ["tune", str(spec), "--dry-run", "--unequal"])
    assert res.exit_code == 0, res.output
    assert "gspo: 4 settings x 2 seed(s) x 30 steps per run = 240 steps of tuning" in res.output


def test_existing_runs_need_resume(tmp_path):
    spec = _spec(tmp_path)
    raw, parsed = tn.load(spec)
    first = tn.tuning_runs(raw, parsed)[0].path
    first.mkdir(parents=True)
    (first / "run.json").write_text(json.dumps({"status": "completed"}))
    line = _one_line_error(runner.invoke(app, ["tune", str(spec)]))
    assert "runs of an earlier tune exist; --resume continues it" in line


def test_spec_refuses_unknown_arms_sets_and_reused_seeds(tmp_path):
    raw = yaml.safe_load((ROOT / "experiments" / "tune_clip.yaml").read_text())
    raw["tune"]["grids"]["dapo"] = {"arm.clip_high": [0.28]}
    raw["tune"]["selection_set"] = "valid"
    raw["tune"]["final_seeds"] = [100, 5]
    with pytest.raises(SpecError) as err:
        spec_from_dict(raw)
    text = str(err.value)
    assert "final_seeds: [100] are also tuning seeds" in text
    raw["tune"]["final_seeds"] = [0, 1]
    with pytest.raises(SpecError) as err:
        spec_from_dict(raw)
    text = str(err.value)
    assert "tune.grids.dapo: no arm named 'dapo'" in text
    assert "tune.selection_set: no evaluation set named 'valid' in task.eval_sets (named: val, test)" in text


def test_tuning_and_final_runs_apply_each_arms_own_point(tmp_path):
    raw, spec = tn.load(_spec(tmp_path))
    runs = tn.tuning_runs(raw, spec)
    r = next(x for x in runs if x.name == "gspo,clip_high=0.0008" and x.seed == 101)
    assert [a.name for a in r.spec.arms] == ["gspo,clip_high=0.0008"]
    assert r.spec.arms[0].clip_high == 8e-4 and r.spec.arms[0].clip_low == 3e-4  # the preset's low bound kept
    assert r.spec.train.steps == 30 and r.spec.seeds == [101] and r.spec.tune is None
    assert r.path == tmp_path / "results" / "tune_clip" / "tuning" / "gspo,clip_high=0.0008" / "seed101"
    final = tn.final_runs(raw, spec, {"grpo": {"arm.clip_high": 0.35}, "gspo": {"arm.clip_high": 2e-4}})
    assert [(f.name, f.seed, f.spec.arms[0].clip_high, f.spec.train.steps) for f in final][:4] == [
        ("grpo", 0, 0.35, 60),
        ("grpo", 1, 0.35, 60),
        ("grpo", 2, 0.35, 60),
        ("gspo", 0, 2e-4, 60),
    ]
    assert final[0].path == tmp_path / "results" / "tune_clip" / "final" / "grpo" / "seed0"


def test_a_learning_rate_grid_reaches_the_experiment_optimizer(tmp_path):
    grids = {"grpo": {"optimizer.lr": [2.5e-5, 5e-5]}, "gspo": {"optimizer.lr": [5e-5, 1e-4]}}
    raw, spec = tn.load(_spec(tmp_path, **{"tune/grids": grids}))
    lrs = {(r.name, r.spec.optimizer.lr) for r in tn.tuning_runs(raw, spec)}
    assert lrs == {
        ("grpo,lr=2.5e-05", 2.5e-5),
        ("grpo,lr=5e-05", 5e-5),
        ("gspo,lr=5e-05", 5e-5),
        ("gspo,lr=0.0001", 1e-4),
    }


# ------------------------------------------------------------------ the selection rule


def _run(root: Path, name: str, seed: int, evals: list[dict]) -> Path:
    d = root / name / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"status": "completed", "seed": seed}))
    (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    return d


def _ev(step: int, name: str, score: float) -> dict:
    return {"step": step, "set": name, "task": "math", "scores": {"avg@4": score}}


def test_last_score_reads_the_last_evaluation_of_the_named_set(tmp_path):
    d = _run(tmp_path, "gspo,clip_high=0.0004", 100, [_ev(0, "val", 0.2), _ev(30, "val", 0.25), _ev(30, "test", 0.9)])
    assert last_score(d, "val", "avg@4") == 0.25
    assert last_score(d, "test", "avg@4") == 0.9
    assert math.isnan(last_score(d, "other", "avg@4"))
    assert math.isnan(last_score(d, "val", "pass@1"))


def test_selection_takes_the_highest_seed_mean_and_breaks_ties_by_grid_order(tmp_path):
    finals = {0.0002: (0.20, 0.30), 0.0004: (0.28, 0.26), 0.0008: (0.31, 0.21)}  # means 0.25, 0.27, 0.26
    points = []
    for clip, scores in finals.items():
        p = Point("gspo", {"arm.clip_high": clip}, f"gspo,clip_high={clip:g}")
        for seed, s in zip((100, 101), scores):
            # the step-0 score is high everywhere: only the last evaluation counts
            d = _run(tmp_path, p.name, seed, [_ev(0, "val", 0.9), _ev(30, "val", s), _ev(30, "test", 1.0 - s)])
            p.scores[seed] = last_score(d, "val", "avg@4")
        points.append(p)
    chosen = select(points)
    assert chosen.settings == {"arm.clip_high": 0.0004}
    assert chosen.mean == pytest.approx(0.27)
    tie = [Point("grpo", {"x": 1}, "a", {0: 0.3}), Point("grpo", {"x": 2}, "b", {0: 0.3})]
    assert select(tie).name == "a"
    # a point whose runs have no score is skipped; none with a score at all is an error
    assert select([Point("g", {"x": 1}, "a", {0: math.nan}), Point("g", {"x": 2}, "b", {0: 0.1})]).name == "b"
    with pytest.raises(RunError, match="no setting of arm g has a selection score"):
        select([Point("g", {"x": 1}, "a", {0: math.nan})])


def test_grid_position_flags_the_edges_by_value():
    assert grid_position([4e-4, 2e-4, 8e-4], 4e-4) == (1, False)
    assert grid_position([4e-4, 2e-4, 8e-4], 8e-4) == (2, True)
    assert grid_position([4e-4, 2e-4, 8e-4], 2e-4) == (0, True)
    assert grid_position(["token", "mid", "sequence"], "sequence") == (2, True)
    notes, edge = position_notes(
        {"arm.clip_high": [0.2, 0.27, 0.35], "optimizer.lr": [5e-5]}, {"arm.clip_high": 0.27, "optimizer.lr": 5e-5}
    )
    assert notes[0] == "arm.clip_high = 0.27: 2 of 3"
    assert notes[1] == "optimizer.lr = 5e-05: one value (not tuned)"
    assert not edge
    notes, edge = position_notes({"arm.clip_high": [0.2, 0.27, 0.35]}, {"arm.clip_high": 0.35})
    assert edge and "highest of 3 values (edge: the grid may be too narrow)" in notes[0]


def test_report_states_budgets_selection_edges_and_the_test_verdict(tmp_path):
    from gspo_cli.analysis.report import tune as trep
    from tests.synthetic_runs import make_problem_experiment

    exp = make_problem_experiment(
        tmp_path, arms={"grpo": 0.0, "gspo": 0.15}, seeds=(0, 1, 2), problems=60, sd_seed=0.005, sd_problem=0.005
    )
    dirs = sorted(exp.glob("*/seed*"))
    table = trep.compare_final(dirs, "arith", "grpo", None)
    (row,) = table.rows
    assert (row.arm, row.baseline, row.verdict) == ("gspo", "grpo", "better") and row.delta > 0.1
    pts = {
        "grpo": [Point("grpo", {"arm.clip_high": c}, f"grpo,{c}", {100: m}) for c, m in ((0.2, 0.3), (0.27, 0.3))],
        "gspo": [
            Point("gspo", {"arm.clip_high": c}, f"gspo,{c}", {100: m})
            for c, m in ((2e-4, 0.1), (4e-4, 0.2), (8e-4, 0.1))
        ],
    }
    chosen = {arm: select(p) for arm, p in pts.items()}
    info = {
        "experiment": "t",
        "spec": "t.yaml",
        "rule": "highest mean",
        "selection_set": "val",
        "test_set": "arith",
        "sizes": [64, 60],
        "seeds": [100],
        "final_seeds": [0, 1, 2],
        "steps": 30,
        "train_steps": 60,
        "budgets": {"grpo": 60, "gspo": 90},
        "baseline": "grpo",
        "grids": {"grpo": {"arm.clip_high": [0.2, 0.27]}, "gspo": {"arm.clip_high": [2e-4, 4e-4, 8e-4]}},
    }
    text = trep.write(tmp_path / "out", info, pts, chosen, table).read_text()
    assert "| grpo | 2 | 1 x 30 | 60 |" in text and "| gspo | 3 | 1 x 30 | 90 |" in text
    assert "**The budgets are unequal**" in text
    assert "Selected for grpo: arm.clip_high = 0.2: one of 2 values" in text
    assert "Tied with grpo,0.27: the first in grid order is taken." in text
    assert "**Edge**" not in text  # a 2-value grid has no inside; gspo's choice is inside
    assert "Selected for gspo: arm.clip_high = 0.0004: 2 of 3." in text
    assert "| gspo − grpo | +0.1" in text and "| better |" in text
    data = json.loads((tmp_path / "out" / "tune.json").read_text())
    assert data["selection"]["gspo"][1]["selected"] and data["differences"][0]["verdict"] == "better"


def test_eval_sets_cut_from_the_generators_held_out_split_keep_its_cold_start(tmp_path):
    # the tune example's val/test sets are synthetic held-out problems, never drawn for training:
    # excluding them changes no training draw, so the cold start's cache key stays the quickstart's
    from gspo_cli.eval.sets import plan_data
    from gspo_cli.tasks import make_task
    from gspo_cli.tasks.base import Problem

    raw, spec = tn.load(_spec(tmp_path))
    task = make_task(spec.task.name, spec.task.params)
    before = task.data_fingerprint()
    sets, _ = plan_data(spec, task)
    assert [len(s.problems) for s in sets] == [64, 128]
    assert task.data_fingerprint() == before and not task.excluded
    # a problem the generator could draw for training is still excluded (and changes the key)
    drawable = next(p for p in task.train_problems(__import__("random").Random(0), 5))
    task.exclude([Problem(id="file-row-1", prompt=drawable.prompt, answer=drawable.answer)])
    assert task.excluded and task.data_fingerprint() != before


@pytest.mark.slow
def test_tune_trains_selects_and_compares_end_to_end(tmp_path):
    """`gspo tune SPEC --jobs 2`, then the same with --resume: 4 tuning and 4 final runs of the tiny
    model, each arm's selection from its own grid, the test-set comparison in REPORT.md; the rerun
    trains nothing and writes the same selection."""
    from helpers import tiny_tune_spec

    spec = tiny_tune_spec(tmp_path / "tune.yaml", tmp_path / "out", name="tune_e2e")
    res = runner.invoke(app, ["tune", str(spec), "--jobs", "2", "-q"])
    assert res.exit_code == 0, res.output
    root = tmp_path / "out" / "tune_e2e"
    assert res.output.strip().endswith(str(root / "REPORT.md"))
    assert len(list((root / "tuning").glob("*/seed100/run.json"))) == 4
    assert sorted(p.parent.name + "/" + p.name for p in (root / "final").glob("*/seed*")) == [
        "grpo/seed0",
        "grpo/seed1",
        "gspo/seed0",
        "gspo/seed1",
    ]
    # the tuning runs scored the selection set only; the final runs both sets
    sets = lambda d: {e["set"] for e in map(json.loads, (d / "eval.jsonl").read_text().splitlines())}  # noqa: E731
    assert all(sets(d) == {"val"} for d in (root / "tuning").glob("*/seed100"))
    assert all(sets(d) == {"val", "test"} for d in (root / "final").glob("*/seed*"))
    data = json.loads((root / "tune.json").read_text())
    assert data["budgets"] == {"grpo": 2, "gspo": 2}
    assert data["selected"]["grpo"]["arm.clip_high"] in (0.2, 0.3)
    assert data["selected"]["gspo"]["arm.clip_high"] in (3e-4, 6e-4)
    assert [d["arm"] for d in data["differences"]] == ["gspo"] and data["differences"][0]["baseline"] == "grpo"
    text = (root / "REPORT.md").read_text()
    assert "## Test-set comparison" in text and "| gspo − grpo |" in text
    again = runner.invoke(app, ["tune", str(spec), "--jobs", "2", "--resume", "-q"])
    assert again.exit_code == 0, again.output
    assert json.loads((root / "tune.json").read_text())["selected"] == data["selected"]


# ------------------------------------------------------------------ mistakes refused before training


def test_an_arm_without_a_grid_is_refused_not_dropped(tmp_path):
    line = _one_line_error(
        runner.invoke(app, ["tune", str(_spec(tmp_path, **{"tune/grids": {"gspo": {"arm.clip_high": [2e-4]}}}))])
    )
    assert "tune.grids: arm 'grpo' has no grid" in line


def test_an_empty_grids_section_is_refused(tmp_path):
    line = _one_line_error(runner.invoke(app, ["tune", str(_spec(tmp_path, **{"tune/grids": {}})), "--dry-run"]))
    assert "grids: needs every arm's grid (it is empty: nothing to tune)" in line


def test_a_grid_value_listed_twice_is_refused(tmp_path):
    grids = {"grpo": {"arm.clip_high": [0.2, 0.2]}, "gspo": {"arm.clip_high": [2e-4, 4e-4]}}
    line = _one_line_error(runner.invoke(app, ["tune", str(_spec(tmp_path, **{"tune/grids": grids})), "--dry-run"]))
    assert "grids.grpo.arm.clip_high: 0.2 listed twice" in line


def test_an_unknown_selection_metric_is_refused_before_training(tmp_path):
    line = _one_line_error(runner.invoke(app, ["tune", str(_spec(tmp_path, **{"tune/metric": "acc"}))]))
    assert "tune.metric: 'acc' is not a score of val (4 samples per problem): one of avg@4, pass@1, pass@2" in line
    assert not (tmp_path / "results").exists()
    res = runner.invoke(app, ["tune", str(_spec(tmp_path, **{"tune/metric": "pass@2"})), "--dry-run"])
    assert res.exit_code == 0, res.output


def test_dry_run_says_steps_per_run_and_the_total(tmp_path):
    res = runner.invoke(app, ["tune", str(_spec(tmp_path)), "--dry-run"])
    assert "grpo: 3 settings x 2 seed(s) x 30 steps per run = 180 steps of tuning" in res.output


def test_tuning_runs_never_score_the_test_set_but_keep_it_out_of_training(tmp_path):
    from gspo_cli.eval.sets import plan_data
    from gspo_cli.tasks import make_task

    raw, spec = tn.load(_spec(tmp_path))
    run = tn.tuning_runs(raw, spec)[0].spec
    assert [(c.name, c.scored) for c in run.task.eval_sets] == [("val", True), ("test", False)]
    sets, _ = plan_data(run, make_task(run.task.name, run.task.params))
    assert [(s.name, s.due(0, 30), s.due(30, 30), len(s.problems)) for s in sets] == [
        ("val", True, True, 64),
        ("test", False, False, 128),
    ]
    final = tn.final_runs(raw, spec, {"grpo": {"arm.clip_high": 0.35}, "gspo": {"arm.clip_high": 2e-4}})[0].spec
    assert [c.scored for c in final.task.eval_sets] == [True, True]


def test_a_two_value_grid_is_not_flagged_as_too_narrow():
    assert grid_position([0.2, 0.3], 0.3) == (1, False)
    notes, edge = position_notes({"arm.clip_high": [0.2, 0.3]}, {"arm.clip_high": 0.3})
    assert not edge
    assert notes == [
        "arm.clip_high = 0.3: one of 2 values (two values have no inside: a third shows whether the best lies between)"
    ]


def test_a_signal_during_the_tuning_runs_starts_no_final_run(tmp_path, monkeypatch):
    import os
    import signal
    import time

    from gspo_cli.train import sweep as sw

    phases = []

    def run_plan(runs, *, jobs, force, log, executor=None, stop=None):
        phases.append(len(runs))
        os.kill(os.getpid(), signal.SIGTERM)  # every tuning run completed, then the stop
        time.sleep(0.2)
        return [{"run": r.name, "seed": r.seed, "status": "completed", "exit": 0} for r in runs]

    monkeypatch.setattr(sw, "run_plan", run_plan)
    res = runner.invoke(app, ["tune", str(_spec(tmp_path))])
    assert res.exit_code == 4, res.output
    assert phases == [12]  # the final runs never started
    assert "stopped by SIGTERM during the tuning runs; rerun with --resume to continue" in res.output


def test_the_selection_is_recorded_after_the_tuning_round_and_a_rerun_must_find_it_again(tmp_path, monkeypatch):
    """tune_state.json after each round: a stop during the final runs leaves the selection and
    `next: final`; the rerun with --resume retrains no tuning run and starts the final round again;
    a tuning run changed since (another selection) is refused before any final run trains."""
    import os
    import signal
    import time

    from gspo_cli.train import sweep as sw

    best = {"grpo": "grpo,clip_high=0.27", "gspo": "gspo,clip_high=0.0008"}
    rounds = []

    def run_plan(runs, *, jobs, force, log, executor=None, stop=None):
        rounds.append([f"{r.name}/seed{r.seed}" for r in runs])
        if runs[0].path.parent.parent.name == "tuning":
            for r in runs:
                if not r.path.exists():  # the score a tuning run's evaluation wrote
                    _run(
                        r.path.parent.parent, r.name, r.seed, [_ev(30, "val", 0.5 if r.name in best.values() else 0.3)]
                    )
            return [{"run": r.name, "seed": r.seed, "status": "completed", "exit": 0} for r in runs]
        os.kill(os.getpid(), signal.SIGTERM)  # stopped during the final runs
        time.sleep(0.2)
        return [{"run": r.name, "seed": r.seed, "status": "interrupted", "exit": 4} for r in runs]

    monkeypatch.setattr(sw, "run_plan", run_plan)
    spec = _spec(tmp_path)
    res = runner.invoke(app, ["tune", str(spec)])
    assert res.exit_code == 4, res.output
    state_file = tmp_path / "results/tune_clip/tune_state.json"
    state = json.loads(state_file.read_text())
    assert state["next"] == "final"  # the final round did not complete: a rerun starts there
    assert state["selected"] == {"grpo": {"arm.clip_high": 0.27}, "gspo": {"arm.clip_high": 0.0008}}
    assert len(state["tuning"]) == 12 and {r["status"] for r in state["tuning"]} == {"completed"}
    assert [r["status"] for r in state["final"]] == ["interrupted"] * 6
    assert rounds[1] == [f"{arm}/seed{s}" for arm in ("grpo", "gspo") for s in (0, 1, 2)]

    res = runner.invoke(app, ["tune", str(spec), "--resume"])
    assert res.exit_code == 4, res.output
    assert f"resuming the tune: at its final round ({state_file})" in res.output
    assert rounds[3] == rounds[1]  # the same final runs; the tuning runs were all there

    rundir = tmp_path / "results/tune_clip/tuning/gspo,clip_high=0.0002/seed100"
    (rundir / "eval.jsonl").write_text(json.dumps(_ev(30, "val", 0.9)) + "\n")  # now the best gspo setting
    res = runner.invoke(app, ["tune", str(spec), "--resume"])
    assert res.exit_code == 2, res.output
    assert "the tuning runs now select grpo arm.clip_high=0.27; gspo arm.clip_high=0.0002" in res.output
    assert "tune_state.json recorded grpo arm.clip_high=0.27; gspo arm.clip_high=0.0008" in res.output
    assert len(rounds) == 5  # refused before any final run
