"""A newcomer's first hours: no cold start built that no run uses or
that a refusal throws away, a clean Ctrl-C during the cold start, fast and plain model-name
errors, did-you-mean inside task.params, evaluation scores and sweep progress as they come."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import TINY
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.runs import run_path
from gspo_cli.spec.loading import dump_spec, spec_from_dict

DATASETS = Path(__file__).parent / "fixtures" / "datasets"
ONE_ARM = {**TINY, "arms": [TINY["arms"][0]]}  # grpo, 2 mini-batches


def write_spec(tmp_path: Path, raw: dict, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def gspo(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line(result) -> str:
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert "Traceback" not in result.output, result.output
    return lines[-1]


def models_in(cache: Path) -> list[str]:
    """Complete or partial built-in model entries in a GSPO_CACHE_DIR."""
    models = cache / "models"
    return sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock")) if models.is_dir() else []


def fake_run(path: Path, spec_text: str, status: str, checkpoint: bool = False) -> None:
    """A run directory as `gspo train` leaves it: run.json with `status`, spec.yaml, and
    optionally a complete-looking checkpoint (what resume looks for)."""
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"status": status, "step": 1, "total_steps": 2}))
    (path / "spec.yaml").write_text(spec_text)
    if checkpoint:
        ckpt = path / "checkpoints" / "step_000001"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.pt").write_bytes(b"")
        (ckpt / "config.json").write_text("{}")


# --- 6: a sweep's prebuilt cold start is the one its runs use ---------------------------


def test_sweep_prebuilds_the_cold_start_its_runs_use(tmp_path, monkeypatch):
    """With evaluation sets the runs cold-start on the task minus the evaluation problems; the
    sweep's prebuild must build that very entry (same cache key), not one without exclusions."""
    import gspo_cli.models as models
    import gspo_cli.train.loop as loop
    from gspo_cli.models.builtin import cache_key
    from gspo_cli.train.reporting import quiet_reporter
    from gspo_cli.train.sweep import plan, prebuild_models

    def key(cfg, task):
        return cache_key(cfg.name.split(":")[1], cfg.builtin, cfg.cold_start, task)

    prebuilt, used = [], []

    class Built(Exception):
        pass

    def prebuild_fake(cfg, task, log=print):
        prebuilt.append(key(cfg, task))
        return "/nowhere"

    def run_fake(cfg, task, log=print):
        used.append(key(cfg, task))
        raise Built

    monkeypatch.setattr(models, "resolve_model_source", prebuild_fake)
    monkeypatch.setattr(loop, "resolve_model_source", run_fake)
    raw = {
        **ONE_ARM,
        "output_dir": str(tmp_path / "out"),
        "task": {
            "name": "math",
            "params": {"num_operands": 2, "max_operand": 4},
            "eval_sets": [{"name": "aime24", "params": {"source": str(DATASETS / "aime24.parquet")}}],
        },
    }
    (run,) = plan(write_spec(tmp_path, raw))
    assert prebuild_models([run], log=lambda m: None) == 1
    with pytest.raises(Built):
        loop.train_experiment(run.spec, reporter=quiet_reporter())
    assert prebuilt == used


# --- 7: a spec conflict is refused before the cold start --------------------------------


def test_train_refuses_a_conflicting_set_before_building_anything(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GSPO_CACHE_DIR", str(cache))
    spec_file = write_spec(tmp_path, {**ONE_ARM, "output_dir": str(tmp_path / "out")})
    spec = spec_from_dict(yaml.safe_load(spec_file.read_text()))
    path = run_path(spec.output_dir, spec.name, "grpo", 0)
    fake_run(path, dump_spec(spec), "completed")
    t0 = time.time()
    result = gspo("train", spec_file, "--set", "model.cold_start.steps=30")
    assert result.exit_code == 2, result.output
    line = one_line(result)
    assert "holds a completed run of a different spec" in line and "model.cold_start.steps: 120 -> 30" in line
    assert models_in(cache) == [] and time.time() - t0 < 30


def test_sweep_refuses_an_unfinished_run_of_another_spec_before_its_prebuild(tmp_path, monkeypatch):
    """`gspo sweep` compared only completed runs before its cold start; an unfinished run with
    a checkpoint (which its trainer would resume) is compared first too."""
    import gspo_cli.train.sweep as sw

    def no_prebuild(*a, **k):
        raise AssertionError("a cold start was built before the spec was compared")

    monkeypatch.setattr(sw, "prebuild_models", no_prebuild)
    raw = {**ONE_ARM, "output_dir": str(tmp_path / "out")}
    (run,) = sw.plan(write_spec(tmp_path, raw))
    fake_run(run.path, dump_spec(run.spec), "interrupted", checkpoint=True)
    result = gspo("sweep", write_spec(tmp_path, raw), "--set", "optimizer.lr=2e-3")
    assert result.exit_code == 2, result.output
    line = one_line(result)
    assert "holds an unfinished run of a different spec" in line and "optimizer.lr: 0.001 -> 0.002" in line


# --- 9: Ctrl-C during the cold start ---------------------------------------------------


def _sigint_as_a_terminal_sends_it():
    """In the child before exec: SIGINT's default action, so Python installs its Ctrl-C handler
    even where pytest was started with SIGINT ignored (a shell's background job: `cmd &`)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize(
    "command, said",
    [
        ("train", "stopped by SIGINT before training started (cold start or model loading); rerun the same command"),
        ("sweep", "stopped by SIGINT before any run started (cold start); rerun the same command"),
    ],
)
def test_ctrl_c_during_the_cold_start_is_a_clean_stop(tmp_path, command, said):
    """A first SIGINT while the built-in model cold-starts (`gspo train`, or `gspo sweep`'s
    prebuild): one plain line, exit 4 (the documented code for a SIGINT stop), no `error:`, no
    traceback, no cache entry left."""
    cache = tmp_path / "cache"
    raw = {**ONE_ARM, "output_dir": str(tmp_path / "out")}
    raw["model"] = {**raw["model"], "cold_start": {"steps": 100000, "batch_size": 32, "lr": 1e-2}}
    spec_file = write_spec(tmp_path, raw)
    env = {**os.environ, "GSPO_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gspo_cli", command, str(spec_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_sigint_as_a_terminal_sends_it,
    )
    try:
        deadline = time.time() + 120
        # train's plain lines are on stdout, a sweep's on stderr; the cold start says when it begins
        for line in proc.stdout if command == "train" else proc.stderr:
            if line.startswith("cold start:") or time.time() > deadline:
                break
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 4, (out, err)
    assert err.strip().splitlines()[-1] == said
    assert "error:" not in out + err and "Traceback" not in out + err
    if command == "train":
        assert err.strip().splitlines() == [said]
    models = cache / "models"
    assert not [p for p in models.iterdir() if not p.name.endswith(".lock")]  # no entry, no .build-* left
    assert not (tmp_path / "out").exists()


# --- 10: model names: no network, no such directory ------------------------------------

HUB_PROBE = """
import sys, time
from typer.testing import CliRunner
from gspo_cli.cli.app import app
t0 = time.time()
result = CliRunner().invoke(app, ["train", sys.argv[1]])
print(result.exit_code, round(time.time() - t0, 1))
print(result.output)
"""


def test_unreachable_hub_fails_fast_in_one_line(tmp_path):
    """A hub id with the hub unreachable: the hub client used to retry for ~25 s; now one short
    probe, then the cache only, and a line that names HF_HUB_OFFLINE."""
    raw = {**ONE_ARM, "output_dir": str(tmp_path / "out"), "model": {"name": "some-org/not-cached-model"}}
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:1", HF_HOME=str(tmp_path / "hf"))
    proc = subprocess.run(
        [sys.executable, "-c", HUB_PROBE, str(write_spec(tmp_path, raw))],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    head, *output = proc.stdout.strip().splitlines()
    code, seconds = head.split()
    assert code == "2", proc.stdout + proc.stderr
    line = output[-1]
    assert line.startswith("error: model.name: cannot load 'some-org/not-cached-model': the hub (http://127.0.0.1:1)")
    assert "HF_HUB_OFFLINE=1" in line and "Traceback" not in proc.stdout
    assert float(seconds) < 12, seconds  # 25-30 s before (the hub client's retries)


def test_a_local_model_path_that_does_not_exist_says_so(tmp_path):
    missing = tmp_path / "my-model"
    raw = {**ONE_ARM, "output_dir": str(tmp_path / "out"), "model": {"name": str(missing)}}
    result = gspo("train", write_spec(tmp_path, raw))
    assert result.exit_code == 2, result.output
    assert one_line(result) == f"error: model.name: {missing}: no such directory"
    afile = tmp_path / "weights.bin"
    afile.write_bytes(b"")
    result = gspo("train", write_spec(tmp_path, {**raw, "model": {"name": str(afile)}}))
    assert result.exit_code == 2 and "not a directory" in one_line(result)


# --- 11: did-you-mean inside task.params ------------------------------------------------


@pytest.mark.parametrize(
    "task, expected",
    [
        (
            {"name": "arithmetic", "params": {"num_operand": 2}},
            "error: task.params.num_operand: unknown key (did you mean 'num_operands'?)",
        ),
        ({"name": "math", "params": {"max_operands": 9}}, "did you mean 'max_operand'?"),
        ({"name": "code", "params": {"sorce": "x.jsonl"}}, "did you mean 'source'?"),
        (
            {
                "name": "arithmetic",
                "eval_sets": [
                    {"name": "a", "params": {"source": str(DATASETS / "aime24.parquet"), "prompt_templat": "x"}}
                ],
            },
            "error: task.eval_sets[0].params.prompt_templat: unknown key (did you mean 'prompt_template'?)",
        ),
    ],
)
def test_a_typo_in_task_params_gets_a_did_you_mean(tmp_path, monkeypatch, task, expected):
    monkeypatch.setenv("GSPO_CACHE_DIR", str(tmp_path / "cache"))
    result = gspo("train", write_spec(tmp_path, {**ONE_ARM, "output_dir": str(tmp_path / "out"), "task": task}))
    assert result.exit_code == 2, result.output
    assert expected in one_line(result)
    assert not (tmp_path / "cache").exists()


# --- 12: evaluation scores and sweep progress as they come ------------------------------


@pytest.mark.slow
def test_train_prints_evaluation_scores_as_they_come(tmp_path):
    raw = {**ONE_ARM, "output_dir": str(tmp_path / "out"), "train": {"steps": 2, "eval_every": 1, "eval_samples": 2}}
    result = gspo("train", write_spec(tmp_path, raw))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    evals = [x for x in lines if x.startswith("[grpo/seed0] eval arithmetic at step")]
    assert [x.split(" at step ")[1].split()[0] for x in evals] == ["0", "1", "2"], result.stdout
    assert "(4 problems): avg@2 " in evals[0] and "pass@2 " in evals[0]
    # in the order they happened: step 1's scores after step 1's line
    assert lines.index(evals[1]) > next(i for i, x in enumerate(lines) if x.startswith("[grpo/seed0] step 1 "))


@pytest.mark.slow
def test_sweep_shows_progress_and_scores_and_tidies_its_logs(tmp_path, monkeypatch):
    """`gspo sweep` says where each run's output goes, shows its steps and evaluation scores as
    they come, removes the log directory when every run completed, and keeps (and names) the
    log of a run that failed."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    raw = {**ONE_ARM, "output_dir": str(tmp_path / "out"), "train": {"steps": 2, "eval_every": 1, "eval_samples": 2}}
    result = gspo("sweep", write_spec(tmp_path, raw))
    assert result.exit_code == 0, result.output
    err = result.stderr
    assert "each run's output goes to " + str(tmp_path / "tmp") in err
    assert "[grpo/seed0] step 2/2  reward " in err
    for step in (0, 1, 2):
        assert f"[grpo/seed0] eval arithmetic at step {step} (4 problems): avg@2 " in err
    assert list((tmp_path / "tmp").iterdir()) == []  # every run completed: nothing left behind

    bad = {**raw, "name": "bad", "model": {"name": str(tmp_path / "no-model")}}
    result = gspo("sweep", write_spec(tmp_path, bad, "bad.yaml"))
    assert result.exit_code == 1, result.output  # a run failed
    (logs,) = (tmp_path / "tmp").iterdir()
    (kept,) = logs.iterdir()
    assert kept.name == "000-grpo-seed0.log" and "no such directory" in kept.read_text()
    assert f"logs of the 1 run(s) that did not complete kept in {logs}: {kept.name}" in result.stderr


def test_the_live_view_prints_evaluation_scores_above_its_bars(capsys):
    from gspo_cli.cli.progress import RichReporter

    record = {"step": 50, "task": "math", "set": "aime24", "n": 30, "samples": 4, "scores": {"avg@4": 0.25}}
    with RichReporter() as reporter:
        reporter.run_started("gspo/seed0", 100)
        reporter.eval_done("gspo/seed0", record)
    assert "[gspo/seed0] eval aime24 at step 50 (30 problems): avg@4 0.250" in capsys.readouterr().out


@pytest.mark.slow
def test_sigint_to_a_sweep_stops_its_runs_cleanly(tmp_path):
    """SIGINT sent to the sweep process alone (not its process group): no run is started after
    it, the running one is told to stop (it checkpoints, exit 4), the sweep exits 4 and keeps
    that run's log, without a traceback."""
    raw = {**ONE_ARM, "output_dir": str(tmp_path / "out"), "train": {"steps": 200, "eval_every": 0}}
    raw["seeds"] = [0, 1]
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gspo_cli", "sweep", str(write_spec(tmp_path, raw))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_sigint_as_a_terminal_sends_it,
    )
    metrics = tmp_path / "out/e2e/grpo/seed0/metrics.jsonl"
    try:
        deadline = time.time() + 180
        while not (metrics.is_file() and metrics.read_text().strip()) and time.time() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 4, (out, err)
    assert "Traceback" not in out + err and "error:" not in err
    assert "stopping (SIGINT): 1 run(s) not started" in err
    assert "[grpo/seed0] interrupted (exit 4)" in err
    assert not (tmp_path / "out/e2e/grpo/seed1").exists()
    assert "logs of the 1 run(s) that did not complete kept in" in err


def test_sweep_progress_reads_what_a_run_appends_in_order(tmp_path):
    """A sweep's view of one run: only what was appended since it started looking, every tenth
    step and each evaluation in the order they happened, a torn last line left for later, a
    file rewound by a resume followed from its new end."""
    from gspo_cli.train.sweep import RunProgress, plan

    raw = {**ONE_ARM, "output_dir": str(tmp_path / "out"), "train": {"steps": 20}}
    (run,) = plan(write_spec(tmp_path, raw))
    run.path.mkdir(parents=True)
    metrics, evals = run.path / "metrics.jsonl", run.path / "eval.jsonl"
    metrics.write_text(json.dumps({"step": 1}) + "\n")  # there before: not shown again
    view = RunProgress(run)

    def m(step):
        return json.dumps(
            {"step": step, "reward/mean": 0.5, "reward/accuracy": 0.25, "policy/clip_frac_token": 0.0, "time/step_s": 1}
        )

    def e(step):
        return json.dumps({"step": step, "task": "arithmetic", "n": 4, "scores": {"avg@2": 0.5}})

    with open(metrics, "a") as f:
        f.write("".join(m(s) + "\n" for s in range(2, 5)) + m(5)[:10])  # step 5 half-written
    evals.write_text(e(2) + "\n")
    lines = view.lines()
    assert [x.split("  ")[0] for x in lines] == [
        "[grpo/seed0] step 2/20",
        "[grpo/seed0] eval arithmetic at step 2 (4 problems): avg@2 0.500",
        "[grpo/seed0] step 4/20",
    ]
    with open(metrics, "a") as f:
        f.write(m(5)[10:] + "\n" + m(6) + "\n")
    assert [x.split("  ")[0] for x in view.lines()] == ["[grpo/seed0] step 6/20"]
    metrics.write_text(m(2) + "\n")  # a resume rewound it to step 2
    assert view.lines() == []
    with open(metrics, "a") as f:
        f.write(m(4) + "\n")
    assert [x.split("  ")[0] for x in view.lines()] == ["[grpo/seed0] step 4/20"]
