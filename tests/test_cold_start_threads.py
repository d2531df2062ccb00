"""The built-in cold start is the same model whatever the machine's core count or
OMP_NUM_THREADS: it trains with a fixed torch thread count, and a cache
entry built under other numerics (thread count, CPU instruction set) is never returned."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gspo_cli.models import builtin
from gspo_cli.models.builtin import builtin_model_dir, entry_digest
from gspo_cli.spec import BuiltinModelConfig, ColdStartConfig
from gspo_cli.tasks import make_task

SIZE = BuiltinModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32)
COLD = ColdStartConfig(steps=2, batch_size=4)
REPO = Path(__file__).resolve().parents[1]


def test_the_cold_start_trains_with_two_threads_and_restores_the_callers(tmp_path, monkeypatch):
    monkeypatch.setenv("GSPO_CACHE_DIR", str(tmp_path))
    torch.set_num_threads(1)  # as under OMP_NUM_THREADS=1 (a sweep's runs, torchrun) or on one core
    threads_seen = []  # the builder logs from inside its training loop
    entry = builtin_model_dir(
        "tiny-dense",
        SIZE,
        COLD,
        make_task("arithmetic", {}),
        log=lambda m: threads_seen.append(torch.get_num_threads()),
    )
    assert threads_seen and set(threads_seen) == {2}, threads_seen
    assert torch.get_num_threads() == 1  # the caller's count is back
    info = json.loads((entry / "cold_start.json").read_text())
    assert info["threads"] == 2
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_an_entry_built_under_other_numerics_is_never_returned(tmp_path, monkeypatch):
    monkeypatch.setenv("GSPO_CACHE_DIR", str(tmp_path))
    task = make_task("arithmetic", {})
    quiet = lambda m: None  # noqa: E731
    here = builtin_model_dir("tiny-dense", SIZE, COLD, task, log=quiet)
    with monkeypatch.context() as m:  # another CPU: torch dispatches to other kernels
        m.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
        other_cpu = builtin_model_dir("tiny-dense", SIZE, COLD, task, log=quiet)
    assert other_cpu != here
    with monkeypatch.context() as m:  # an entry trained with another thread count
        m.setattr(builtin, "COLD_START_THREADS", 1)
        other_threads = builtin_model_dir("tiny-dense", SIZE, COLD, task, log=quiet)
    assert len({here, other_cpu, other_threads}) == 3
    assert json.loads((other_cpu / "cold_start.json").read_text())["cpu_capability"] == "DEFAULT"
    assert json.loads((other_threads / "cold_start.json").read_text())["threads"] == 1
    # Back on this machine's numerics: its own entry, not one of the others.
    assert builtin_model_dir("tiny-dense", SIZE, COLD, task, log=quiet) == here


@pytest.mark.slow
def test_the_quickstart_cold_start_is_the_same_with_one_or_two_omp_threads(tmp_path):
    """The quickstart's model (full size, batch 64: big enough for torch to split its matmuls
    over threads) with a shorter cold start (10 steps), built from empty caches under
    OMP_NUM_THREADS=1 and =2: bit-equal weights, equal loss and equal step-0 held-out scores (on 32 held-out
    problems, which do not change the cold start of a generated task). Before the fix 10 steps
    already ended at loss 2.5605295 (1 thread) vs 2.5605147 (2 threads), 20 steps at 1.69208 vs
    1.69213."""
    built = {}
    for threads in (1, 2):
        cache, out = tmp_path / f"cache{threads}", tmp_path / f"runs{threads}"
        env = {**os.environ, "GSPO_CACHE_DIR": str(cache), "OMP_NUM_THREADS": str(threads)}
        # Threads that sleep instead of spinning while they wait: the same numerics, but on a busy
        # machine 2 spinning threads took 17-37 s for 3 cold-start steps instead of 0.8 s.
        env["OMP_WAIT_POLICY"] = "PASSIVE"
        cmd = [sys.executable, "-m", "gspo_cli", "train", str(REPO / "experiments" / "quickstart.yaml")]
        cmd += ["--arm", "grpo", "-o", str(out), "-q", "--set", "train.steps=1", "--set", "model.cold_start.steps=10"]
        cmd += ["--set", "task.eval_size=32"]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
        (entry,) = (cache / "models").glob("tiny-moe-*")
        evals = [json.loads(line) for line in (out / "quickstart" / "grpo" / "seed0" / "eval.jsonl").open()]
        built[threads] = (entry.name, entry_digest(entry), json.loads((entry / "cold_start.json").read_text()), evals)
    one, two = built[1], built[2]
    assert one[0] == two[0]  # one cache key
    assert one[1] == two[1]  # bit-equal model and tokenizer
    assert one[2]["final_loss"] == two[2]["final_loss"] and one[2]["threads"] == 2
    assert one[3][0]["step"] == 0 and one[3][0]["scores"] == two[3][0]["scores"]


@pytest.mark.parametrize(
    ("cores", "preset", "expected"), [({0}, None, "PASSIVE"), ({0, 1}, None, None), ({0}, "ACTIVE", "ACTIVE")]
)
def test_openmp_waits_sleep_on_one_core(monkeypatch, cores, preset, expected):
    """Two cold-start threads on one core: gspo's entry point asks OpenMP to sleep while it
    waits (spinning took the core from the working thread), keeping a value the user set."""
    from gspo_cli.cli import app

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cores)
    monkeypatch.setenv("OMP_WAIT_POLICY", preset or "")  # recorded, so the test leaves no value behind
    if preset is None:
        monkeypatch.delenv("OMP_WAIT_POLICY")
    app._sleeping_openmp_waits_on_one_core()
    assert os.environ.get("OMP_WAIT_POLICY") == expected


BUILD_SCRIPT = """
import sys
from gspo_cli.models.builtin import builtin_model_dir
from gspo_cli.spec import BuiltinModelConfig, ColdStartConfig
from gspo_cli.tasks import make_task
size = BuiltinModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32)
def log(m):
    print(m, flush=True)
try:
    cold = ColdStartConfig(steps=1000000, batch_size=4)
    builtin_model_dir("tiny-dense", size, cold, make_task("arithmetic", {}), log=log)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(4)
"""


def test_sigterm_during_a_cold_start_leaves_no_build_directory(tmp_path):
    """SIGTERM while the cold start trains: the process ends by KeyboardInterrupt (the CLI's exit 4),
    and the half-built temporary directory is removed, not left in the cache."""
    import signal
    import time

    env = {**os.environ, "GSPO_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", BUILD_SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.time() + 120
    while time.time() < deadline and not list((tmp_path / "models").glob(".build-*")):
        time.sleep(0.2)
    assert list((tmp_path / "models").glob(".build-*")), "the build never started"
    time.sleep(1.0)  # inside the training loop
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 4, out
    assert "interrupted" in out
    assert not list((tmp_path / "models").glob(".build-*"))
    assert not [p for p in (tmp_path / "models").iterdir() if p.is_dir()]  # no entry published either
