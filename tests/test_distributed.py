"""Data parallel with torchrun (gloo, CPU, 2 processes)."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from gspo_cli.config import ModelConfig
from gspo_cli.models import resolve_model_source
from gspo_cli.runs import RunDir
from gspo_cli.tasks import make_task
from helpers import TINY

pytestmark = pytest.mark.slow
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
HERE = Path(__file__).parent


def spec_file(tmp_path, **train):
    raw = {**TINY, "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 2}],
           "train": {"steps": 3, "checkpoint_every": 1, **train}, "output_dir": str(tmp_path / "out")}
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


@pytest.fixture(scope="module")
def source():
    task = make_task("arithmetic", TINY["task"]["params"])
    return resolve_model_source(ModelConfig(**TINY["model"]), task, log=lambda m: None)


def test_two_processes_update_like_one(tmp_path, source):
    """The same global batch, split into whole groups across 2 ranks, gives the same
    parameters after one optimizer step as 1 process (gradients averaged by DDP)."""
    spec = spec_file(tmp_path)
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    script = str(HERE / "dist/update_check.py")
    r1 = subprocess.run([sys.executable, script, str(spec), source, str(one)], capture_output=True, text=True)
    assert r1.returncode == 0, r1.stderr
    r2 = subprocess.run(TORCHRUN + [script, str(spec), source, str(two)], capture_output=True, text=True)
    assert r2.returncode == 0, r2.stderr[-3000:]
    a, b = torch.load(one)["grads"], torch.load(two)["grads"]
    assert set(a) == set(b) and len(a) > 10
    scale = max(g.abs().max().item() for g in a.values())
    assert scale > 0
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff <= 1e-5 * scale, (diff, scale)  # float reduction order only


def test_torchrun_trains_writes_once_and_resumes_with_one_process(tmp_path, source):
    spec = spec_file(tmp_path, steps=4)
    rd = RunDir(tmp_path / "out/e2e/gspo/seed0")
    proc = subprocess.Popen(TORCHRUN + ["-m", "gspo_cli", "train", str(spec), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 180
    while len(rd.metrics()) < 1 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    ms = rd.metrics()
    if len(ms) == 4:
        pytest.skip("all 4 steps finished before the signal landed")
    assert rd.status() == "interrupted", err[-3000:]
    assert [m["step"] for m in ms] == list(range(1, len(ms) + 1))  # one writer: no duplicate lines
    assert rd.latest_checkpoint().name == f"step_{len(ms):06d}"
    # metrics were reduced over both ranks' halves of the batch
    assert ms[0]["response/length_max"] >= ms[0]["response/length_mean"]
    res = subprocess.run([sys.executable, "-m", "gspo_cli", "train", str(spec), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)[0]["status"] == "completed"
    assert [m["step"] for m in rd.metrics()] == [1, 2, 3, 4]
    assert rd.info()["resumes"] == 1


def test_world_size_must_divide_the_prompts(tmp_path, source):
    raw = yaml.safe_load(spec_file(tmp_path).read_text())
    raw["rollout"]["prompts_per_step"] = 3
    raw["rollout"]["group_size"] = 4
    raw["arms"][0]["mini_batches"] = 1
    p = tmp_path / "odd.yaml"
    p.write_text(yaml.safe_dump(raw))
    res = subprocess.run(TORCHRUN + ["-m", "gspo_cli", "train", str(p)], capture_output=True, text=True)
    assert res.returncode != 0
    assert "rollout.prompts_per_step: 3 is not divisible by the 2 processes" in res.stderr
