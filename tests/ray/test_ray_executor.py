"""`--executor ray` on a local Ray cluster: the tiny sweep gives the local executor's metrics, a
failing run is reported with its log's last line, Ctrl-C stops the runs with a checkpoint and
leaves no process behind, and the rerun resumes them."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _rows(path: Path) -> list[dict]:
    """A metrics or eval file's records less wall times and memory (the machine's, not the run's)."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(("perf/", "time/")) and k != "time_s"} for r in rows]


def test_a_tiny_sweep_through_ray_has_the_local_executors_metrics(tmp_path, env, tiny_spec, gspo):
    on_ray = tiny_spec(tmp_path / "ray.yaml", tmp_path / "ray")
    r = gspo(["sweep", str(on_ray), "--executor", "ray", "--json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [(x["run"], x["seed"], x["status"]) for x in json.loads(r.stdout)] == [
        ("grpo", 0, "completed"),
        ("grpo", 1, "completed"),
        ("gspo", 0, "completed"),
        ("gspo", 1, "completed"),
    ]
    local = tiny_spec(tmp_path / "local.yaml", tmp_path / "local")
    r = gspo(["sweep", str(local), "--jobs", "2", "-q"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    for arm in ("grpo", "gspo"):
        for seed in (0, 1):
            a, b = (tmp_path / where / "tiny" / arm / f"seed{seed}" for where in ("local", "ray"))
            assert _rows(a / "metrics.jsonl") == _rows(b / "metrics.jsonl"), (arm, seed)
            assert _rows(a / "eval.jsonl") == _rows(b / "eval.jsonl"), (arm, seed)


def test_a_failing_run_is_reported_with_its_logs_last_line_and_exit_1(tmp_path, env, tiny_spec, gspo):
    from helpers import TINY

    reward = tmp_path / "bad.py"
    reward.write_text(
        "def reward(prompts, completions, completion_ids, **kwargs):\n"
        "    raise RuntimeError('reward service unreachable')\n"
    )
    task = {**TINY["task"], "rewards": [{"function": f"{reward}:reward", "correct": True}]}
    spec = tiny_spec(tmp_path / "s.yaml", tmp_path / "out", seeds=[0], arms=[TINY["arms"][0]], task=task)
    r = gspo(["sweep", str(spec), "--executor", "ray"], env)
    assert r.returncode == 1, r.stderr[-3000:]
    failed = [x for x in r.stderr.splitlines() if x.startswith("[grpo/seed0] failed (exit 1)")]
    assert failed and failed[0].endswith("RuntimeError: reward service unreachable"), r.stderr[-3000:]


def _steps(run: Path) -> list[int]:
    try:
        return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def test_ctrl_c_stops_the_runs_with_a_checkpoint_leaves_no_process_and_a_rerun_resumes(tmp_path, env, tiny_spec, gspo):
    import signal
    import subprocess
    import sys
    import time

    import psutil
    from helpers import TINY

    spec = tiny_spec(
        tmp_path / "s.yaml",
        tmp_path / "out",
        seeds=[0],
        arms=[TINY["arms"][0]],
        train={"steps": 300, "checkpoint_every": 2, "eval_every": 0},
    )
    run = tmp_path / "out/tiny/grpo/seed0"
    cmd = [sys.executable, "-m", "gspo_cli", "sweep", str(spec), "--executor", "ray"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while not (len(_steps(run)) >= 6 and list((run / "checkpoints").glob("*"))) and time.time() - t0 < 240:
            time.sleep(0.2)
        started = psutil.Process(first.pid).children(recursive=True)
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 4, err[-3000:]
    assert "stopping (Ctrl-C): cancelling 1 task(s)" in err
    time.sleep(2)
    left = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [p.cmdline()[:4] for p in left]  # Ray's processes and the run: all gone
    files = str(tmp_path / "out/tiny/.ray")  # the run's `gspo train` reads its spec from there
    assert not [p for p in psutil.process_iter(["cmdline"]) if files in " ".join(p.info["cmdline"] or [])]
    stopped_at = max(_steps(run))
    assert stopped_at < 300

    r = gspo(["sweep", str(spec), "--executor", "ray"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info.get("resumes") == 1, info
