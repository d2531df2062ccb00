"""`--executor slurm` on a real single-node SLURM: a tiny sweep and 2 rounds of --until-decided
give the local executor's metrics and decision; Ctrl-C leaves the jobs queued and nothing running
here; a cancelled job's run resumes when the command is rerun; a job at its time limit is
requeued and resumes; a job requeued by hand (scontrol requeue) resumes from its checkpoint to the
uninterrupted run's metrics; a run of 2 tasks per node trains under torchrun as a local torchrun
does; `gspo tune` trains both its rounds as jobs; a failing job is reported with its log's last
line and exit 1."""

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
    compared = {"baseline": "grpo", "arm": "gspo"}  # analysis only: for --until-decided below
    on_slurm = tiny_spec(tmp_path / "slurm.yaml", tmp_path / "slurm", comparison=compared)
    r = gspo(["sweep", str(on_slurm), "--executor", "slurm", "--json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    records = json.loads(r.stdout)
    assert [(x["run"], x["seed"], x["status"]) for x in records] == [
        ("grpo", 0, "completed"),
        ("gspo", 0, "completed"),  # seed by seed, as the plan orders them
        ("grpo", 1, "completed"),
        ("gspo", 1, "completed"),
    ]
    assert "submitted job array" in r.stderr and "4 done" in r.stderr
    book = json.loads((tmp_path / "slurm/tiny/.slurm/jobs.json").read_text())
    assert sorted(book) == sorted(x["path"] for x in records)

    local = tiny_spec(tmp_path / "local.yaml", tmp_path / "local", comparison=compared)
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

    # --until-decided, 2 looks: seeds 0 and 1 are there (skipped), the second round trains seed 2
    decided = ["--until-decided", "--max-seeds", "3"]
    r = gspo(["sweep", str(on_slurm), "--executor", "slurm", *decided], env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "submitted job array" in r.stderr and "2 done" in r.stderr
    r = gspo(["sweep", str(local), "--jobs", "2", *decided], env)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = (json.loads((tmp_path / where / "tiny/until_decided.json").read_text()) for where in ("local", "slurm"))
    assert len(a["looks"]) == 2 and a == b


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


def test_ctrl_c_leaves_the_job_cancel_stops_it_and_a_rerun_resumes_from_its_checkpoint(tmp_path, env, tiny_spec, gspo):
    import psutil
    from helpers import TINY, slow_task

    spec = tiny_spec(
        tmp_path / "s.yaml",
        tmp_path / "out",
        seeds=[0],
        arms=[TINY["arms"][0]],
        train={"steps": 60, "checkpoint_every": 2, "eval_every": 0},
        task=slow_task(tmp_path),  # >= 0.3 s a step, so the run is still going when Ctrl-C comes
    )
    run = tmp_path / "out/tiny/grpo/seed0"
    cmd = [sys.executable, "-m", "gspo_cli", "sweep", str(spec), "--executor", "slurm"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(
            lambda: len(_steps(run)) >= 6 and list((run / "checkpoints").glob("*")), 180, "steps and a checkpoint"
        )
        children = psutil.Process(first.pid).children(recursive=True)
        first.send_signal(signal.SIGINT)  # Ctrl-C: stop waiting; the job goes on
        out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 4, err[-3000:]
    assert "stopped waiting (Ctrl-C): 1 job(s) still queued or running on SLURM" in err
    assert not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # nothing orphaned here
    job = json.loads((tmp_path / "out/tiny/.slurm/jobs.json").read_text())[str(run)]["job"]
    assert job in _queue()

    r = gspo(["sweep", str(spec), "--executor", "slurm", "--cancel"], env)  # scancel: the run checkpoints, stops
    assert r.returncode == 0 and f"cancelled 1 job(s): {job}" in r.stderr, r.stderr
    _wait_for(lambda: job not in _queue(), 60, "the job to leave the queue")
    stopped_at = max(_steps(run))
    assert stopped_at < 60

    r = gspo(["sweep", str(spec), "--executor", "slurm"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "submitted job" in r.stderr  # the cancelled job's run, submitted again
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info.get("resumes") == 1, info
    steps = _steps(run)
    assert steps[-1] == 60 and steps == sorted(set(steps)), steps  # resumed: each step once, none repeated


def _queue() -> list[str]:
    """Ids of the jobs SLURM still has queued or running."""
    return subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True).stdout.split()


def test_a_job_at_its_time_limit_checkpoints_is_requeued_and_resumes(tmp_path, env, tiny_spec, gspo):
    """submitit's checkpoint-and-requeue on the time-limit signal (sbatch --signal), with a
    1-minute limit. SLURM holds a requeued job back (BeginTime) for a while; the test releases it."""
    from helpers import TINY, slow_task

    spec = tiny_spec(
        tmp_path / "s.yaml",
        tmp_path / "out",
        seeds=[0],
        arms=[TINY["arms"][0]],
        train={"steps": 300, "checkpoint_every": 2, "eval_every": 0},
        task=slow_task(tmp_path),  # >= 0.3 s a step: past the 1-minute limit on any machine
        executor={"kind": "slurm", "slurm": {"cpus_per_run": 1, "time_min": 1, "poll_s": 1}},
    )
    run = tmp_path / "out/tiny/grpo/seed0"
    cmd = [sys.executable, "-m", "gspo_cli", "sweep", str(spec)]  # the spec's executor: slurm
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while first.poll() is None and time.time() - t0 < 400:
            for line in subprocess.run(
                ["squeue", "-h", "-o", "%i %r"], capture_output=True, text=True
            ).stdout.splitlines():
                job, reason = line.split()
                if reason == "BeginTime":
                    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
            time.sleep(1)
        out, err = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err[-3000:]
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info.get("resumes", 0) >= 1, info
    steps = _steps(run)
    assert steps[-1] == 300 and steps == sorted(set(steps)), steps
    job_log = "".join(p.read_text() for p in (tmp_path / "out/tiny/.slurm").glob("*/*_log.out"))
    assert "Requeued job" in job_log


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


def _release_held_jobs() -> None:
    """Start now the jobs SLURM holds back after a requeue (reason BeginTime)."""
    for line in subprocess.run(["squeue", "-h", "-o", "%i %r"], capture_output=True, text=True).stdout.splitlines():
        job, reason = line.split()
        if reason == "BeginTime":
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)


def test_a_job_requeued_by_hand_resumes_from_its_checkpoint_to_the_uninterrupted_metrics(
    tmp_path, env, tiny_spec, gspo
):
    from helpers import TINY

    train = {"steps": 40, "checkpoint_every": 2, "eval_every": 20}
    one = {"seeds": [0], "arms": [TINY["arms"][0]], "train": train}
    spec = tiny_spec(tmp_path / "s.yaml", tmp_path / "out", **one)
    run = tmp_path / "out/tiny/grpo/seed0"
    # the uninterrupted run, here at the same time: one process, one thread, as the job's
    local = tiny_spec(tmp_path / "local.yaml", tmp_path / "local", **one)
    here = subprocess.Popen([sys.executable, "-m", "gspo_cli", "sweep", str(local), "--jobs", "2", "-q"], env=env)
    cmd = [sys.executable, "-m", "gspo_cli", "sweep", str(spec), "--executor", "slurm"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(
            lambda: len(_steps(run)) >= 6 and list((run / "checkpoints").glob("*")), 180, "steps and a checkpoint"
        )
        job = json.loads((tmp_path / "out/tiny/.slurm/jobs.json").read_text())[str(run)]["job"]
        seen = max(_steps(run))
        subprocess.run(["scontrol", "requeue", job], check=True)
        t0 = time.time()
        while first.poll() is None and time.time() - t0 < 300:
            _release_held_jobs()
            time.sleep(1)
        out, err = first.communicate(timeout=30)
        assert here.wait(timeout=300) == 0
    finally:
        for proc in (first, here):
            if proc.poll() is None:
                proc.kill()
    assert first.returncode == 0, err[-3000:]
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info["resumes"] == 1, info
    assert seen <= int(info["resumed_from"].removeprefix("step_")) < 40, info  # its checkpoint, not step 0
    assert f"[grpo/seed0] job {job} running" in err and "1 done, 0 failed" in err
    uninterrupted = tmp_path / "local/tiny/grpo/seed0"
    assert _rows(run / "metrics.jsonl") == _rows(uninterrupted / "metrics.jsonl")
    assert _rows(run / "eval.jsonl") == _rows(uninterrupted / "eval.jsonl")


def test_two_tasks_per_node_train_under_torchrun_as_a_local_torchrun_does(tmp_path, env, tiny_spec, gspo):
    from helpers import TINY

    one = {"seeds": [0], "arms": [TINY["arms"][0]], "train": {"steps": 2}}
    spec = tiny_spec(tmp_path / "s.yaml", tmp_path / "out", **one)
    local = tiny_spec(tmp_path / "local.yaml", tmp_path / "local", **one)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    here = subprocess.Popen([*torchrun, "-m", "gspo_cli", "train", str(local), "--quiet"], env=env)
    try:
        placed = ["--executor", "slurm", "--tasks-per-node", "2", "--set", "executor.slurm.cpus_per_run=2"]
        r = gspo(["sweep", str(spec), *placed], env)
        assert here.wait(timeout=300) == 0
    finally:
        if here.poll() is None:
            here.kill()
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = (tmp_path / where / "tiny/grpo/seed0" for where in ("out", "local"))
    assert _rows(a / "metrics.jsonl") == _rows(b / "metrics.jsonl")  # 2 processes: rank 1 sampled its own half
    assert _rows(a / "eval.jsonl") == _rows(b / "eval.jsonl")


def test_tune_trains_its_tuning_and_final_rounds_as_jobs_and_a_rerun_trains_nothing(tmp_path, env, gspo):
    from helpers import TINY, tiny_tune_spec

    spec = tiny_tune_spec(
        tmp_path / "tune.yaml",
        tmp_path / "out",
        model={**TINY["model"], "cold_start": {"steps": 20, "batch_size": 32, "lr": 1e-2}},
        executor={"kind": "slurm", "slurm": {"cpus_per_run": 1, "time_min": 10, "poll_s": 1}},
    )
    r = gspo(["tune", str(spec)], env, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    root = tmp_path / "out/tune"
    assert r.stderr.count("submitted job array") == 2  # the tuning round, then the final one
    runs = sorted(p.parent for p in root.glob("*/*/seed*/run.json"))
    assert [str(p.relative_to(root)) for p in runs] == [
        "final/grpo/seed0", "final/grpo/seed1", "final/gspo/seed0", "final/gspo/seed1",
        "tuning/grpo,clip_high=0.2/seed100", "tuning/grpo,clip_high=0.3/seed100",
        "tuning/gspo,clip_high=0.0003/seed100", "tuning/gspo,clip_high=0.0006/seed100",
    ]  # fmt: skip
    assert sorted(json.loads((root / ".slurm/jobs.json").read_text())) == [str(p) for p in runs]  # each a job
    state = json.loads((root / "tune_state.json").read_text())
    assert state["next"] == "report" and len(state["tuning"]) == 4 and len(state["final"]) == 4
    assert state["selected"] == json.loads((root / "tune.json").read_text())["selected"]

    again = gspo(["tune", str(spec), "--resume"], env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "submitted" not in again.stderr and again.stderr.count("already completed; skipping") == 8
    assert f"resuming the tune: both rounds completed ({root / 'tune_state.json'})" in again.stderr
