"""No lost runs: kill -9 and resume, one writer per run, divergence, disk full, hostile specs."""

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import yaml
from helpers import TINY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError
from gspo_cli.runs import RunDir, RunLockedError, read_jsonl, run_lock
from gspo_cli.spec import ExperimentSpec
from gspo_cli.spec.loading import spec_from_dict

RAW = {**TINY, "arms": [TINY["arms"][2]], "train": {"steps": 5, "checkpoint_every": 1, "eval_every": 2}}
RUN = "e2e/gspo/seed0"


def strip(records):
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))} for m in records]


def write_spec(tmp_path, raw, out="out"):
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump({**raw, "output_dir": str(tmp_path / out)}))
    return p


def gspo(*args):
    return [sys.executable, "-m", "gspo_cli", *args]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    res = subprocess.run(gspo("train", str(write_spec(tmp, RAW)), "--quiet"), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    rd = RunDir(tmp / "out" / RUN)
    return strip(rd.metrics()), [e["scores"] for e in rd.evals()]


@pytest.mark.slow
@pytest.mark.parametrize("kill_seed", [1, 2, 3])
def test_kill_9_at_a_random_moment_then_resume_reproduces_the_run(tmp_path, reference, kill_seed):
    spec_file = write_spec(tmp_path, RAW)
    rd = RunDir(tmp_path / "out" / RUN)
    proc = subprocess.Popen(
        gspo("train", str(spec_file), "--quiet"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    rng = random.Random(kill_seed)
    target = rng.randint(1, 3)
    deadline = time.time() + 120
    while len(rd.metrics()) < target and time.time() < deadline and proc.poll() is None:
        time.sleep(0.005)
    # Then a random moment inside the next step: mid-rollout, mid-update, mid-checkpoint or
    # mid-append, wherever it lands.
    time.sleep(rng.uniform(0.0, 0.15))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(rd.metrics())
    if killed_at >= 5 or rd.status() == "completed":
        pytest.skip("the run finished before the kill landed")
    assert rd.status() == "running"  # nobody got to mark it: a resume must cope
    res = subprocess.run(gspo("train", str(spec_file), "--quiet"), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert rd.status() == "completed"
    assert strip(rd.metrics()) == reference[0], f"killed after {killed_at} steps"
    assert [e["scores"] for e in rd.evals()] == reference[1]
    assert not [p for p in rd.checkpoints.iterdir() if p.name.startswith(".tmp")]


@pytest.mark.slow
def test_second_writer_is_refused_and_a_dead_holder_is_not(tmp_path):
    spec_file = write_spec(tmp_path, {**RAW, "train": {"steps": 1}})
    run_dir = tmp_path / "out" / RUN
    with run_lock(run_dir):
        res = CliRunner().invoke(app, ["train", str(spec_file), "--json"])
        assert res.exit_code == 1
        assert f"in use by pid {os.getpid()}" in res.stderr
        assert json.loads(res.stdout)[0]["status"] == "in use"
        with pytest.raises(RunLockedError):
            with run_lock(run_dir):
                pass
    # A holder killed with -9 leaves the lock file behind, but not the lock.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from gspo_cli.runs import run_lock\n"
            f"with run_lock({str(run_dir)!r}):\n print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(RunLockedError):
        with run_lock(run_dir):
            pass
    holder.kill()
    holder.wait()
    res = CliRunner().invoke(app, ["train", str(spec_file)])
    assert res.exit_code == 0, res.output


def _poison_loss(monkeypatch, bad_calls):
    import gspo_cli.train.step as step_mod

    real = step_mod.get_policy_loss  # setup() builds ctx.loss_fn from it
    calls = {"n": 0}

    def fake_get(name):
        fn = real(name)

        def wrapped(*a, **k):
            calls["n"] += 1
            loss, stats = fn(*a, **k)
            return (loss * float("nan"), stats) if calls["n"] in bad_calls else (loss, stats)

        return wrapped

    monkeypatch.setattr(step_mod, "get_policy_loss", fake_get)


@pytest.mark.slow
def test_isolated_bad_batch_is_skipped_when_asked(tmp_path, monkeypatch):
    from gspo_cli.train.loop import train_experiment
    from gspo_cli.train.reporting import quiet_reporter

    _poison_loss(monkeypatch, bad_calls={3})
    raw = {**RAW, "output_dir": str(tmp_path), "train": {"steps": 2, "divergence": {"skip_bad_batches": True}}}
    (res,) = train_experiment(spec_from_dict(raw), reporter=quiet_reporter())
    assert res.status == "completed"
    ms = RunDir(tmp_path / RUN).metrics()
    assert ms[1]["policy/skipped_minibatches"] == 1 and "policy/skipped_minibatches" not in ms[0]

    _poison_loss(monkeypatch, bad_calls={1})
    (res,) = train_experiment(spec_from_dict({**raw, "train": {"steps": 2}}), reporter=quiet_reporter(), force=True)
    assert res.status == "diverged"
    info = RunDir(tmp_path / RUN).info()
    assert info["status"] == "diverged" and "step 1: non-finite loss" in info["error"]


@pytest.mark.slow
def test_entropy_collapse_detector(tmp_path):
    spec_file = write_spec(
        tmp_path,
        {**RAW, "train": {"steps": 5, "checkpoint_every": 1, "divergence": {"entropy_below": 100.0, "patience": 2}}},
    )
    res = CliRunner().invoke(app, ["train", str(spec_file)])
    assert res.exit_code == 3
    rd = RunDir(tmp_path / "out" / RUN)
    assert rd.info()["status"] == "diverged"
    assert "step 2: collapse: policy/entropy below 100.0 for 2 steps" in rd.info()["error"]
    assert rd.latest_checkpoint().name == "step_000001"  # the last good one is kept


@pytest.mark.slow
def test_disk_full_during_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    import gspo_cli.train.checkpoint as ck

    real_save = ck.torch.save
    calls = {"n": 0}

    def full_disk(obj, path, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            with open(path, "wb") as f:
                f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(ck.torch, "save", full_disk)
    spec_file = write_spec(tmp_path, {**RAW, "train": {"steps": 3, "checkpoint_every": 1}})
    res = CliRunner().invoke(app, ["train", str(spec_file)])
    assert res.exit_code == 1 and "Traceback" not in res.output
    rd = RunDir(tmp_path / "out" / RUN)
    info = rd.info()
    assert info["status"] == "failed" and "No space left on device" in info["error"]
    assert [p.name for p in rd.checkpoints.iterdir()] == ["step_000001"]
    import torch

    state = torch.load(rd.latest_checkpoint() / "trainer_state.pt", weights_only=False)
    assert state["step"] == 1


def test_torn_and_garbage_lines_are_skipped(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\nnot json\n{"step": 2}\n{"step": 3, "x"')
    assert [r["step"] for r in read_jsonl(p)] == [1, 2]


# Hostile specs: whatever the YAML holds, loading ends in a spec or a SpecError, never a crash.
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=True), st.text(max_size=8)
)
keys = st.sampled_from(
    [
        "name",
        "arms",
        "seeds",
        "model",
        "task",
        "rollout",
        "optimizer",
        "train",
        "sweep",
        "loss",
        "preset",
        "clip_low",
        "clip_high",
        "mini_batches",
        "group_size",
        "lr",
        "paper-grpo",
        "paper-gspo",
        "grpo",
        "gspo",
        "x",
    ]
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(keys, values, max_size=8))
def test_random_specs_load_or_fail_with_one_clear_error(raw):
    try:
        spec = spec_from_dict(raw)
    except SpecError as err:
        assert str(err).strip() and "Traceback" not in str(err)
    else:
        assert isinstance(spec, ExperimentSpec)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_random_text_files_never_crash_the_loader(tmp_path_factory, text):
    from gspo_cli.spec.loading import load_spec

    p = tmp_path_factory.mktemp("h") / "s.yaml"
    p.write_text(text)
    try:
        load_spec(p)
    except SpecError:
        pass


def test_hostile_arm_preset_mix():
    with pytest.raises(SpecError):
        spec_from_dict({"name": "x", "arms": [{"name": "a", "preset": "paper-gspo", "clip_low": -1}]})
