"""Sweep planning, naming and sharding: pure, no training."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError
from gspo_cli.train.sweep import parse_shard, plan, shard, shard_from_env, sweep_points

BASE = {
    "name": "sw",
    "seeds": [0, 1],
    "arms": [{"name": "grpo", "preset": "paper-grpo"}, {"name": "gspo", "preset": "paper-gspo"}],
    "sweep": {"grid": {"arms[*].clip_high": [0.3, 0.5], "rollout.group_size": [4, 8]}},
}


def write(tmp_path, raw):
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def test_points_are_grid_times_sets():
    pts = sweep_points({"a": [1, 2], "b": ["x", "y", "z"]}, [{"c": 0}, {"c": 1}])
    assert len(pts) == 12
    assert pts[0] == {"a": 1, "b": "x", "c": 0} and pts[-1] == {"a": 2, "b": "z", "c": 1}
    assert sweep_points({}, []) == [{}]


def test_plan_counts_names_and_resolved_settings(tmp_path):
    runs = plan(write(tmp_path, {**BASE, "output_dir": str(tmp_path / "out")}))
    assert len(runs) == 4 * 2 * 2  # points x arms x seeds
    names = {r.name for r in runs}
    assert "gspo,clip_high=0.3,group_size=4" in names and "grpo,clip_high=0.5,group_size=8" in names
    assert len(names) == 8
    r = next(r for r in runs if r.name == "gspo,clip_high=0.5,group_size=8" and r.seed == 1)
    assert r.spec.arms[0].clip_high == 0.5 and r.spec.arms[0].clip_low == 3e-4  # preset kept
    assert r.spec.rollout.group_size == 8 and r.spec.seeds == [1] and r.spec.sweep is None
    assert r.path == tmp_path / "out/sw/gspo,clip_high=0.5,group_size=8/seed1"


def test_plan_without_sweep_is_arms_times_seeds(tmp_path):
    raw = {k: v for k, v in BASE.items() if k != "sweep"}
    runs = plan(write(tmp_path, raw))
    # seed by seed: a sweep stopped after two runs leaves seed 0 of both arms, a pair
    assert [(r.name, r.seed) for r in runs] == [("grpo", 0), ("gspo", 0), ("grpo", 1), ("gspo", 1)]
    raw["seeds"] = [5, 2]
    assert [r.seed for r in plan(write(tmp_path, raw))] == [5, 5, 2, 2]  # the spec's seed order


def test_explicit_sets_and_clashing_short_names(tmp_path):
    raw = {
        **BASE,
        "sweep": {
            "grid": {"optimizer.lr": [1e-5]},
            "sets": [
                {"rollout.temperature": 0.7, "model.cold_start.lr": 0.001},
                {"rollout.temperature": 1.0, "model.cold_start.lr": 0.002},
            ],
        },
    }
    names = sorted({r.name for r in plan(write(tmp_path, raw))})
    # two keys end in `lr`: the full paths disambiguate them
    # (yaml.safe_dump sorted each set's keys; names follow the file's order)
    assert "gspo,optimizer.lr=1e-05,model.cold_start.lr=0.001,temperature=0.7" in names
    assert len(names) == 4


def test_invalid_point_names_itself(tmp_path):
    raw = {**BASE, "sweep": {"grid": {"rollout.group_size": [4, 1]}}}
    with pytest.raises(SpecError, match=r"sweep point rollout.group_size=1: rollout.group_size"):
        plan(write(tmp_path, raw))


@pytest.mark.parametrize("count", [1, 3, 5, 16, 40])
def test_shards_partition_the_plan_exactly(tmp_path, count):
    runs = plan(write(tmp_path, BASE))
    parts = [shard(runs, i, count) for i in range(count)]
    flat = [r.path for p in parts for r in p]
    assert sorted(flat) == sorted(r.path for r in runs) and len(flat) == len(set(flat))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    # stable: the same call gives the same slice
    assert [r.path for r in shard(plan(write(tmp_path, BASE)), 0, count)] == [r.path for r in parts[0]]


def test_shard_parsing_and_job_array_environment():
    assert parse_shard("2/5") == (2, 5)
    for bad in ("5/5", "x", "1/0", "-1/3"):
        with pytest.raises(SpecError):
            parse_shard(bad)
    assert shard_from_env({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4"}) == (3, 4)
    assert shard_from_env(
        {"SLURM_ARRAY_TASK_ID": "12", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "10"}
    ) == (2, 4)
    assert shard_from_env({"GSPO_SHARD": "1/2"}) == (1, 2)
    assert shard_from_env({}) is None


def test_cli_dry_run_json_and_errors(tmp_path):
    p = write(tmp_path, {**BASE, "output_dir": str(tmp_path / "o")})
    res = CliRunner().invoke(app, ["sweep", str(p), "--dry-run", "--json", "--shard", "1/4"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == 4 and all(r["status"] == "planned" for r in rows)
    assert rows[0]["settings"] == {"arms[*].clip_high": 0.3, "rollout.group_size": 4}
    bad = CliRunner().invoke(app, ["sweep", str(p), "--dry-run", "--shard", "4/4"])
    assert bad.exit_code == 2 and "--shard" in bad.stderr and "Traceback" not in bad.output


def test_list_shows_runs_and_json(tmp_path):
    rd = tmp_path / "exp/a/seed0"
    rd.mkdir(parents=True)
    (rd / "run.json").write_text(json.dumps({"status": "interrupted", "step": 3, "total_steps": 10, "wall_s": 4.5}))
    (rd / "metrics.jsonl").write_text('{"step": 3, "reward/mean": 0.25}\n{"step": 4, "rew')  # torn last line
    res = CliRunner().invoke(app, ["list", str(tmp_path), "--json"])
    assert res.exit_code == 0
    (row,) = json.loads(res.stdout)
    assert (row["status"], row["step"], row["reward_last"]) == ("interrupted", 3, 0.25)
    empty = CliRunner().invoke(app, ["list", str(tmp_path / "nothing")])
    assert empty.exit_code == 2 and "no run directories" in empty.stderr


def test_prebuild_cold_starts_each_shared_builtin_model_once(tmp_path, monkeypatch):
    """A sweep builds each distinct built-in model once, before its jobs start; hub/local
    models are left alone, a model that fails to build is left for its runs, and a bad
    model name refuses the sweep."""
    import gspo_cli.models as models
    from gspo_cli.errors import RunError
    from gspo_cli.train.sweep import prebuild_models

    built = []

    def fake(cfg, task, log=print):
        built.append((cfg.builtin.num_layers, task.name))
        if cfg.builtin.num_layers == 3:
            raise RunError("model: cannot build")
        if cfg.builtin.num_layers == 5:
            raise SpecError("model.name: unknown built-in model")
        return "/nowhere"

    monkeypatch.setattr(models, "resolve_model_source", fake)
    raw = {
        **BASE,
        "output_dir": str(tmp_path / "out"),
        "sweep": {"grid": {"model.builtin.num_layers": [2, 3], "arms[*].clip_high": [0.3, 0.5]}},
    }
    runs = plan(write(tmp_path, raw))  # 2 x 2 points x 2 arms x 2 seeds = 16 runs, 2 models
    assert len(runs) == 16
    assert prebuild_models(runs, log=lambda m: None) == 2
    assert sorted(built) == [(2, "arithmetic"), (3, "arithmetic")]
    hub = plan(write(tmp_path, {**raw, "model": {"name": "some/hub-model"}, "sweep": None}))
    built.clear()
    assert prebuild_models(hub, log=lambda m: None) == 0 and built == []
    bad = plan(write(tmp_path, {**raw, "sweep": {"grid": {"model.builtin.num_layers": [2, 5]}}}))
    with pytest.raises(SpecError, match="unknown built-in model"):
        prebuild_models(bad, log=lambda m: None)


def _fake_completed(run, spec_text):
    """A run directory that says it completed, holding `spec_text` as its spec.yaml (and the
    identity, code version, model and data, that `gspo train` records for this run's spec)."""
    from gspo_cli.train.resume import spec_identity

    run.path.mkdir(parents=True)
    info = {"status": "completed", "step": 1, "total_steps": 1, "identity": spec_identity(run.spec)}
    (run.path / "run.json").write_text(json.dumps(info))
    (run.path / "spec.yaml").write_text(spec_text)


def test_sweep_skips_completed_runs_of_the_same_spec_only(tmp_path, monkeypatch):
    """Completed runs of the same spec are skipped (no process started); a completed run of
    a different spec refuses the whole sweep with exit 2 and one line naming the field,
    before any model is built or process started."""
    import subprocess

    from gspo_cli.spec.loading import dump_spec

    def no_process(*a, **k):
        raise AssertionError("a training process was started")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    raw = {**BASE, "output_dir": str(tmp_path / "out"), "sweep": {"grid": {"arms[*].clip_high": [0.3]}}}
    runs = plan(write(tmp_path, raw))
    for r in runs:
        _fake_completed(r, dump_spec(r.spec))
    res = CliRunner().invoke(app, ["sweep", str(write(tmp_path, raw)), "--json"])
    assert res.exit_code == 0, res.output
    records = json.loads(res.stdout)
    assert len(records) == 4 and all(r["skipped"] and r["status"] == "completed" for r in records)

    changed = write(tmp_path, {**raw, "optimizer": {"lr": 2e-4}})
    res = CliRunner().invoke(app, ["sweep", str(changed)])
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: ") and "holds a completed run of a different spec" in line
    assert "optimizer.lr: 0.0001 -> 0.0002" in line and "--force" in line
    assert "Traceback" not in res.output


def test_a_failed_run_shows_its_reason_and_kept_log_under_quiet(tmp_path, monkeypatch):
    """`gspo sweep -q` with a run whose process fails: after the table, one line with the log's
    last line and the kept log's path."""
    import subprocess
    import sys

    real = subprocess.Popen

    def failing(cmd, **kw):  # the run's process: prints a reason and exits 1
        return real([sys.executable, "-c", "print('error: reward.py: boom'); raise SystemExit(1)"], **kw)

    monkeypatch.setattr(subprocess, "Popen", failing)
    monkeypatch.setattr("gspo_cli.train.sweep.prebuild_models", lambda runs, log: 0)
    raw = {k: v for k, v in BASE.items() if k != "sweep"} | {"output_dir": str(tmp_path / "out"), "seeds": [0]}
    raw["arms"] = raw["arms"][:1]
    res = CliRunner().invoke(app, ["sweep", str(write(tmp_path, raw)), "-q"])
    assert res.exit_code == 1, res.output
    (line,) = [x for x in res.stderr.splitlines() if x.startswith("grpo/seed0")]
    assert line.startswith("grpo/seed0 failed: error: reward.py: boom (log: ")
    log = line.split("(log: ")[1].rstrip(")")
    assert log.endswith("-grpo-seed0.log") and "boom" in open(log).read()
    res = CliRunner().invoke(app, ["sweep", str(write(tmp_path, raw)), "--json"])
    (rec,) = json.loads(res.stdout)
    assert rec["reason"] == "error: reward.py: boom" and rec["log"].endswith(".log")


def test_sweep_help_does_not_require_a_sweep_section():
    res = CliRunner().invoke(app, ["sweep", "--help"])
    assert "with a `sweep:` section" not in res.output
    assert "optional" in res.output


def test_a_run_that_completed_and_was_then_signalled_is_labelled_by_its_run_json(tmp_path, monkeypatch):
    """Its process ends by SIGTERM (-15) after run.json says completed: the run is completed (exit 0),
    its log not kept as one that did not complete."""
    import subprocess
    import sys

    real = subprocess.Popen
    raw = {k: v for k, v in BASE.items() if k != "sweep"} | {"output_dir": str(tmp_path / "out"), "seeds": [0]}
    raw["arms"] = raw["arms"][:1]
    run_json = tmp_path / "out" / "sw" / "grpo" / "seed0" / "run.json"
    code = (
        f"import json, os, pathlib, signal; p = pathlib.Path({str(run_json)!r}); p.parent.mkdir(parents=True); "
        "p.write_text(json.dumps({'status': 'completed'})); os.kill(os.getpid(), signal.SIGTERM)"
    )
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, **kw: real([sys.executable, "-c", code], **kw))
    monkeypatch.setattr("gspo_cli.train.sweep.prebuild_models", lambda runs, log: 0)
    res = CliRunner().invoke(app, ["sweep", str(write(tmp_path, raw)), "--json"])
    assert res.exit_code == 0, res.output
    (rec,) = json.loads(res.stdout)
    assert (rec["status"], rec["exit"], rec["log"]) == ("completed", 0, None)
    assert "did not complete" not in res.stderr


def test_a_run_keeps_the_comparison_only_when_it_names_the_runs_arm(tmp_path):
    """A third arm beside the comparison's two (e.g. GRPO with replay beside GRPO and GSPO) gets a
    one-arm spec without the comparison, which it could not keep: `gspo train` would refuse the
    run's spec with "comparison.arm: no arm named 'gspo'"."""
    import yaml as _yaml

    from gspo_cli.spec.loading import dump_spec, spec_from_dict
    from gspo_cli.train.resume import run_spec

    raw = {
        **{k: v for k, v in BASE.items() if k != "sweep"},
        "arms": [*BASE["arms"], {"name": "grpo_rr", "preset": "paper-grpo-rr"}],
        "comparison": {"baseline": "grpo", "arm": "gspo", "metric": "collapse"},
        "seeds": [0],
    }
    runs = {r.name: r.spec for r in plan(write(tmp_path, raw))}
    assert sorted(runs) == ["grpo", "grpo_rr", "gspo"]
    for name in ("grpo", "gspo"):
        assert (runs[name].comparison.baseline, runs[name].comparison.arm) == ("grpo", "gspo")
    assert runs["grpo_rr"].comparison is None
    for name, spec in runs.items():  # each run's spec as `gspo train` reads it back
        assert spec_from_dict(_yaml.safe_load(dump_spec(spec))).arms[0].name == name

    whole = spec_from_dict(raw)
    third = run_spec(whole, whole.arms[2], 0)
    assert third.comparison is None and spec_from_dict(_yaml.safe_load(dump_spec(third))).arms[0].name == "grpo_rr"
    assert run_spec(whole, whole.arms[1], 0).comparison == whole.comparison
