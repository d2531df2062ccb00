"""`--executor slurm` on a real single-node SLURM: a tiny sweep gives the local executor's
metrics, a cancelled job's run resumes when the command is rerun, a failing job is reported
with its log's last line and exit 1."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _rows(path: Path) -> list[dict]:
    """A metrics or eval file's records less wall times and memory (the machine's, not the run's)."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(("perf/", "time/")) and k != "time_s"} for r in rows]


def test_a_tiny_sweep_through_slurm_has_the_local_executors_metrics(tmp_path, env, tiny_spec, gspo):
    on_slurm = tiny_spec(tmp_path / "slurm.yaml", tmp_path / "slurm")
    r = gspo(["sweep", str(on_slurm), "--executor", "slurm", "--json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    records = json.loads(r.stdout)
    assert [(x["run"], x["seed"], x["status"]) for x in records] == [
        ("grpo", 0, "completed"),
        ("grpo", 1, "completed"),
        ("gspo", 0, "completed"),
        ("gspo", 1, "completed"),
    ]
    assert "submitted job array" in r.stderr and "4 done" in r.stderr
    book = json.loads((tmp_path / "slurm/tiny/.slurm/jobs.json").read_text())
    assert sorted(book) == sorted(x["path"] for x in records)

    local = tiny_spec(tmp_path / "local.yaml", tmp_path / "local")
    r = gspo(["sweep", str(local), "--jobs", "2", "-q"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    for arm in ("grpo", "gspo"):
        for seed in (0, 1):
            a, b = (tmp_path / where / "tiny" / arm / f"seed{seed}" for where in ("local", "slurm"))
            assert _rows(a / "metrics.jsonl") == _rows(b / "metrics.jsonl"), (arm, seed)
            assert _rows(a / "eval.jsonl") == _rows(b / "eval.jsonl"), (arm, seed)

    # the same command again: nothing to submit, every run already completed
    r = gspo(["sweep", str(on_slurm), "--executor", "slurm"], env)
    assert r.returncode == 0 and "submitted" not in r.stderr
    assert r.stderr.count("already completed; skipping") == 4


def _wait_for(predicate, timeout: float, what: str):
    t0 = time.time()
    while time.time() - t0 < timeout:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _steps(run: Path) -> list[int]:
    try:
        return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def test_a_cancelled_job_resumes_from_its_checkpoint_when_the_command_is_rerun(tmp_path, env, tiny_spec, gspo):
    from helpers import TINY

    spec = tiny_spec(
        tmp_path / "s.yaml",
        tmp_path / "out",
        seeds=[0],
        arms=[TINY["arms"][0]],
        train={"steps": 60, "checkpoint_every": 2, "eval_every": 0},
    )
    run = tmp_path / "out/tiny/grpo/seed0"
    cmd = [sys.executable, "-m", "gspo_cli", "sweep", str(spec), "--executor", "slurm"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(
            lambda: len(_steps(run)) >= 6 and list((run / "checkpoints").glob("*")), 180, "steps and a checkpoint"
        )
        job = json.loads((tmp_path / "out/tiny/.slurm/jobs.json").read_text())[str(run)]["job"]
        subprocess.run(["scancel", job], check=True)
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 4, err[-3000:]
    assert f"job {job} cancelled" in err
    stopped_at = max(_steps(run))
    assert stopped_at < 60

    r = gspo(["sweep", str(spec), "--executor", "slurm"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info.get("resumes") == 1, info
    steps = _steps(run)
    assert steps[-1] == 60 and steps == sorted(set(steps)), steps  # resumed: each step once, none repeated


def test_a_failing_job_is_reported_with_its_logs_last_line_and_exit_1(tmp_path, env, tiny_spec, gspo):
    from helpers import TINY

    reward = tmp_path / "bad.py"
    reward.write_text(
        "def reward(prompts, completions, completion_ids, **kwargs):\n"
        "    raise RuntimeError('reward service unreachable')\n"
    )
    task = {**TINY["task"], "rewards": [{"function": f"{reward}:reward", "correct": True}]}
    spec = tiny_spec(tmp_path / "s.yaml", tmp_path / "out", seeds=[0], arms=[TINY["arms"][0]], task=task)
    r = gspo(["sweep", str(spec), "--executor", "slurm"], env)
    assert r.returncode == 1, r.stderr[-3000:]
    failed = [x for x in r.stderr.splitlines() if x.startswith("[grpo/seed0] failed (job ")]
    assert failed and failed[0].endswith("RuntimeError: reward service unreachable"), r.stderr[-3000:]
    assert "0 done, 1 failed" in r.stderr


def test_cancel_cancels_the_recorded_jobs_still_queued(tmp_path, env, tiny_spec, gspo):
    spec = tiny_spec(tmp_path / "s.yaml", tmp_path / "out", train={"steps": 200, "eval_every": 0})
    cmd = [sys.executable, "-m", "gspo_cli", "sweep", str(spec), "--executor", "slurm"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    book = tmp_path / "out/tiny/.slurm/jobs.json"
    try:
        _wait_for(lambda: book.exists(), 120, "the job record")
        first.send_signal(signal.SIGINT)  # Ctrl-C: stop waiting; the jobs go on
        out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 4, err[-3000:]
    assert "stopped waiting (Ctrl-C): 4 job(s) still queued or running" in err
    ids = [e["job"] for e in json.loads(book.read_text()).values()]
    queued = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True).stdout.split()
    assert set(ids) <= set(queued)

    r = gspo(["sweep", str(spec), "--executor", "slurm", "--cancel"], env)
    assert r.returncode == 0, r.stderr
    assert "cancelled 4 job(s)" in r.stderr
    _wait_for(
        lambda: (
            not set(ids)
            & set(subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True).stdout.split())
        ),
        60,
        "the jobs to leave the queue",
    )
